"""Full training-state checkpoints: safetensors for tensors, JSON for the rest.

A checkpoint ``ckpt_{step:08d}`` is two files written atomically:

- ``ckpt_{step:08d}.safetensors``: model weights (``model.<name>``), optimizer
  tensors (``optim.<param_index>.<key>``) and RNG states (``rng.<name>``, uint8);
- ``ckpt_{step:08d}.json``: step, iterator state, optimizer hyper-parameters,
  config fingerprint, numpy/python RNG states, and the SHA-256 of the
  safetensors file. The JSON is written last: it is the commit marker.

Loading never unpickles anything (safetensors + JSON only). A truncated or
tampered file raises ``CheckpointError``.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from aiayn.faults import fault_point
from aiayn.io import atomic_path, atomic_write_json, sha256_file

__all__ = [
    "CheckpointError",
    "TrainState",
    "cuda_rng_states",
    "save_checkpoint",
    "load_checkpoint",
    "list_checkpoints",
    "checkpoint_step",
    "average_checkpoints",
    "save_model",
    "load_model_weights",
    "capture_rng",
    "restore_rng",
]

_CKPT_RE = re.compile(r"^ckpt_(\d{8})\.json$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated, tampered with or incompatible."""


@dataclass
class TrainState:
    """Everything needed to continue a run bit-for-bit."""

    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    iterator: dict[str, Any]
    rng: dict[str, Any]
    fingerprint: str
    extra: dict[str, Any]


def capture_rng() -> dict[str, Any]:
    """Snapshot of every RNG the training loop may touch (torch CPU/CUDA, numpy, python)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            state[f"cuda{i}"] = s
    np_state = np.random.get_state()
    state["numpy"] = [np_state[0], np_state[1].tolist(), *np_state[2:]]
    py = random.getstate()
    state["python"] = [py[0], list(py[1]), py[2]]
    return state


def cuda_rng_states(state: dict[str, Any]) -> list[Any]:
    """The ``cuda{i}`` entries of a ``capture_rng`` snapshot in device order: by the number ``i``, so
    ``cuda10`` comes after ``cuda9`` (sorting the keys as strings would put it before ``cuda2``)."""
    return [state[k] for k in sorted((k for k in state if k.startswith("cuda")), key=lambda k: int(k[4:]))]


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of ``capture_rng``."""
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available():
        cuda = cuda_rng_states(state)
        if cuda:
            torch.cuda.set_rng_state_all(cuda)
    n = state["numpy"]
    np.random.set_state((n[0], np.asarray(n[1], dtype=np.uint32), *n[2:]))
    p = state["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))


def _split_optimizer(opt_state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, per_param in opt_state["state"].items():
        for key, value in per_param.items():
            if torch.is_tensor(value):
                tensors[f"optim.{idx}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(idx), {})[key] = value
    return tensors, {"param_groups": opt_state["param_groups"], "scalars": scalars}


def _join_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        _, idx, key = name.split(".", 2)
        state.setdefault(int(idx), {})[key] = value
    for idx, per_param in meta["scalars"].items():
        state.setdefault(int(idx), {}).update(per_param)
    return {"state": state, "param_groups": meta["param_groups"]}


def _dedupe(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Drop tensors that alias another one (tied embeddings); return ``(unique, {alias: kept_name})``."""
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[int, tuple[int, ...], tuple[int, ...], torch.dtype], str] = {}
    for name in sorted(tensors):
        t = tensors[name]
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if t.numel() and key in seen:
            aliases[name] = seen[key]
        else:
            seen[key] = name
            unique[name] = t
    return unique, aliases


def _restore_aliases(tensors: dict[str, torch.Tensor], aliases: dict[str, str]) -> dict[str, torch.Tensor]:
    for alias, name in aliases.items():
        if name not in tensors:
            raise CheckpointError(f"alias {alias!r} points at missing tensor {name!r}")
        tensors[alias] = tensors[name]
    return tensors


def save_checkpoint(directory: str | Path, state: TrainState) -> Path:
    """Write ``state`` as ``ckpt_{step:08d}.{safetensors,json}``; returns the JSON path.

    Both files are atomic; the JSON (with the tensor file's SHA-256) comes last.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"ckpt_{state.step:08d}"
    tensors, aliases = _dedupe({f"model.{k}": v.detach() for k, v in state.model.items()})
    tensors = {k: v.cpu().contiguous() for k, v in tensors.items()}
    opt_tensors, opt_meta = _split_optimizer(state.optimizer)
    tensors.update(opt_tensors)
    rng_json: dict[str, Any] = {}
    for name, value in state.rng.items():
        if torch.is_tensor(value):
            tensors[f"rng.{name}"] = value.contiguous()
        else:
            rng_json[name] = value
    tensor_path = directory / f"{stem}.safetensors"
    with atomic_path(tensor_path) as tmp:
        save_file(tensors, str(tmp))
        fault_point("checkpoint.tensors_unrenamed")
    fault_point("checkpoint.tensors_written")
    meta = {
        "format": "aiayn-checkpoint-v1",
        "step": state.step,
        "aliases": aliases,
        "iterator": state.iterator,
        "optimizer": opt_meta,
        "rng": rng_json,
        "fingerprint": state.fingerprint,
        "extra": state.extra,
        "tensors_sha256": sha256_file(tensor_path),
    }
    json_path = directory / f"{stem}.json"
    atomic_write_json(json_path, meta)
    return json_path


def load_checkpoint(json_path: str | Path) -> TrainState:
    """Read a checkpoint written by ``save_checkpoint``.

    Raises ``CheckpointError`` if either file is missing, unparsable, or the
    tensor file's SHA-256 differs from the one recorded (truncated/tampered).
    """
    json_path = Path(json_path)
    tensor_path = json_path.with_suffix(".safetensors")
    try:
        meta = json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read checkpoint metadata {json_path}: {e}") from e
    if not isinstance(meta, dict) or meta.get("format") != "aiayn-checkpoint-v1":
        raise CheckpointError(f"{json_path} is not an aiayn checkpoint (format={meta.get('format') if isinstance(meta, dict) else None!r})")
    if not tensor_path.exists():
        raise CheckpointError(f"checkpoint tensors missing: {tensor_path}")
    actual = sha256_file(tensor_path)
    if actual != meta["tensors_sha256"]:
        raise CheckpointError(
            f"checkpoint {tensor_path} is truncated or tampered: sha256 {actual} != recorded {meta['tensors_sha256']}"
        )
    try:
        tensors = _restore_aliases(load_file(str(tensor_path)), meta.get("aliases", {}))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"cannot load checkpoint tensors {tensor_path}: {e}") from e
    model = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    opt = {k: v for k, v in tensors.items() if k.startswith("optim.")}
    rng: dict[str, Any] = dict(meta["rng"])
    rng.update({k[len("rng."):]: v for k, v in tensors.items() if k.startswith("rng.")})
    return TrainState(
        step=int(meta["step"]),
        model=model,
        optimizer=_join_optimizer(opt, meta["optimizer"]),
        iterator=meta["iterator"],
        rng=rng,
        fingerprint=meta["fingerprint"],
        extra=meta.get("extra", {}),
    )


def list_checkpoints(directory: str | Path) -> list[Path]:
    """Committed checkpoints (their JSON paths) in ``directory``, oldest step first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _CKPT_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def checkpoint_step(json_path: str | Path) -> int:
    """The step in a checkpoint's name (``ckpt_00000050.json`` -> 50).

    Raises ``ValueError`` for a name that ``save_checkpoint`` does not write.
    """
    m = _CKPT_RE.match(Path(json_path).name)
    if m is None:
        raise ValueError(f"not a checkpoint name (ckpt_<8 digits>.json): {Path(json_path).name}")
    return int(m.group(1))


def average_checkpoints(json_paths: list[Path]) -> dict[str, torch.Tensor]:
    """Element-wise mean of the model weights of several checkpoints (paper Section 6.1).

    Accumulates in float64; returns tensors in each weight's original dtype.
    Raises ``CheckpointError`` if the list is empty or the weights' names differ.
    """
    if not json_paths:
        raise CheckpointError("no checkpoints to average")
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for path in json_paths:
        weights = load_checkpoint(path).model
        if total and set(weights) != set(total):
            raise CheckpointError(f"{path} has different weight names than {json_paths[0]}")
        for k, v in weights.items():
            dtypes[k] = v.dtype
            total[k] = total.get(k, torch.zeros(v.shape, dtype=torch.float64)) + v.to(torch.float64)
    return {k: (v / len(json_paths)).to(dtypes[k]) for k, v in total.items()}


def save_model(path: str | Path, weights: dict[str, torch.Tensor]) -> None:
    """Write inference weights as one safetensors file, atomically (deterministic bytes).

    Tensors that alias or equal another one (tied embeddings) are stored once;
    the alias map goes into the safetensors metadata.
    """
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for name in sorted(weights):
        t = weights[name].detach().cpu().contiguous()
        twin = next((k for k, u in unique.items() if u.shape == t.shape and u.dtype == t.dtype and torch.equal(u, t)), None)
        if twin is not None and t.numel() > 1:
            aliases[name] = twin
        else:
            unique[name] = t
    with atomic_path(path) as tmp:
        save_file(unique, str(tmp), metadata={"aliases": json.dumps(aliases, sort_keys=True)})


def load_model_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Read weights written by ``save_model``. Raises ``CheckpointError`` on a missing or corrupt file."""
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            aliases = json.loads((f.metadata() or {}).get("aliases", "{}"))
        return _restore_aliases(load_file(str(path)), aliases)
    except CheckpointError:
        raise
    except Exception as e:  # safetensors raises several exception types on bad headers
        raise CheckpointError(f"cannot load model weights {path}: {e}") from e
