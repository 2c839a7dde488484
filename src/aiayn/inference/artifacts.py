"""Reading and validating the two model artifacts the pipeline hands on (building a decoder: ``aiayn.inference.load``).

The trained model folder (``artifacts/model``, written by the ``train`` stage), ``ModelBundle``::

    model.json         {"model": the resolved ModelConfig, provenance: seeds, the steps chosen, ...}
    model.safetensors  the weights ``train.select`` chose (one checkpoint or an average of several)
    spm.model          the joint sentencepiece model

The serving bundle (``artifacts/export``, written by ``aiayn.export.bundle.build_bundle``; ``read_bundle_info``)::

    bundle.json        what to load: {"format": 1, "variant", "runtime", "compute_type", "decode"}
    model.json         the trained model's model.json
    spm.model          the sentencepiece model (the only tokenizer the model knows)
    ct2/               runtime "ctranslate2": a CTranslate2 model directory (config.json, model.bin, ...)
    model.safetensors  runtime "eager": the float weights, decoded by our own ``aiayn.inference.search``
    model_card.json    ...and model_card.md: facts for people (not read here)

Every failure is one line: ``FileNotFoundError`` for a missing file, ``aiayn.checkpoint.CheckpointError``
for a malformed ``model.json`` or weights that do not fit, ``aiayn.tokenizer.TokenizerError`` for an
unreadable ``spm.model``, ``BundleError`` for a malformed serving bundle.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from aiayn.checkpoint import CheckpointError, load_checkpoint, load_model_weights
from aiayn.config.schema import ModelConfig
from aiayn.model import Transformer
from aiayn.tokenizer import Tokenizer

__all__ = [
    "BundleError", "EAGER", "BUNDLE_FORMAT", "CT2_FILES", "ModelBundle", "read_bundle_info",
    "read_model_config", "resolve_device",
]  # fmt: skip

#: Variant name of the eager float model: the quantize stage's reference and the serving bundle's
#: variant when no quantized variant passed the gate (runtime "eager").
EAGER = "eager-float32"
BUNDLE_FORMAT = 1
#: The files of a CTranslate2 model directory a serving bundle ships (under ``ct2/``).
CT2_FILES = ("config.json", "model.bin", "shared_vocabulary.json")


class BundleError(ValueError):
    """A serving bundle is missing a file, malformed, or names an unknown runtime (one-line message)."""


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; anything else as ``torch.device`` understands it.

    Raises ``ValueError`` for an unknown device string or CUDA asked for but not available.
    """
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"unknown device {device!r}: use auto, cpu or cuda[:N]") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but CUDA is not available here (use --device auto or cpu)")
    return dev


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def _read_model_json(path: Path) -> tuple[dict[str, Any], ModelConfig]:
    """``(model.json as a dict, its validated ModelConfig)``; ``CheckpointError`` (one line) if malformed."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("model"), dict):
        raise CheckpointError(f"{path}: no 'model' mapping (a model.json written by `aiayn train` has one)")
    try:
        return meta, ModelConfig(**meta["model"])
    except ValidationError as e:
        errors = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'model'}: {err['msg']}" for err in e.errors())
        raise CheckpointError(f"{path}: invalid model config: {errors}") from None
    except TypeError as e:
        raise CheckpointError(f"{path}: invalid model config: {e}") from None


def read_model_config(path: str | Path) -> ModelConfig:
    """The validated ``ModelConfig`` of a ``model.json`` (either artifact's). Raises ``OSError`` when it
    cannot be read and ``CheckpointError`` (one line) when it is malformed."""
    return _read_model_json(Path(path))[1]


@dataclass(frozen=True)
class ModelBundle:
    """A trained model folder, loaded: ``model`` (eval mode, on its device), ``tokenizer`` and
    ``meta`` (``model.json``: the config under ``"model"``, provenance beside it)."""

    path: Path
    model: Transformer
    tokenizer: Tokenizer
    meta: dict[str, Any]

    @property
    def config(self) -> ModelConfig:
        return self.model.cfg

    @classmethod
    def load(cls, model_dir: str | Path, *, weights: str | Path | None = None,
             device: str | torch.device = "auto") -> "ModelBundle":
        """Load the folder ``model_dir`` (optionally other weights: a ``.safetensors`` or a training
        checkpoint's ``ckpt_*.json``) onto ``device`` (``resolve_device``: the model is built there, so
        ``attention_backend: auto`` picks the Triton kernel on CUDA).

        Raises ``FileNotFoundError`` for a missing ``model.json``, ``spm.model`` or weights file,
        ``CheckpointError`` for a malformed ``model.json``, unreadable weights or weights/tokenizer that
        do not fit the model, ``TokenizerError`` for an unreadable ``spm.model`` and ``ValueError`` for
        an unusable ``device``. Every message is one line.
        """
        model_dir = Path(model_dir)
        for name in ("model.json", "spm.model"):
            if not (model_dir / name).exists():
                raise FileNotFoundError(f"{model_dir / name} not found: train a model first (`aiayn train` or `dvc repro`)")
        meta, cfg = _read_model_json(model_dir / "model.json")
        weights_path = Path(weights) if weights else model_dir / "model.safetensors"
        if not weights_path.is_file():
            raise FileNotFoundError(f"model weights {weights_path} not found (the bundle in {model_dir} is incomplete)")
        dev = resolve_device(device)
        if weights_path.suffix == ".json":  # a training checkpoint
            state = load_checkpoint(weights_path).model
        else:
            state = load_model_weights(weights_path)
        tokenizer = Tokenizer.load(model_dir / "spm.model")
        if tokenizer.vocab_size != cfg.vocab_size:
            raise CheckpointError(
                f"{model_dir / 'spm.model'} has {tokenizer.vocab_size} pieces but {model_dir / 'model.json'} "
                f"says vocab_size={cfg.vocab_size}"
            )
        model = Transformer(cfg, device=dev)
        try:
            model.load_state_dict(state)
        except RuntimeError as e:
            raise CheckpointError(
                f"weights {weights_path} do not fit the model in {model_dir / 'model.json'}: {_one_line(e)}"
            ) from None
        return cls(model_dir, model.eval(), tokenizer, meta)


def read_bundle_info(path: str | Path) -> dict[str, Any]:
    """``bundle.json`` of the serving bundle in ``path``. Raises ``BundleError`` (missing, not JSON, wrong format)."""
    f = Path(path) / "bundle.json"
    try:
        info = json.loads(f.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BundleError(f"{f} not found: not a serving bundle (build one with the export stage)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BundleError(f"{f}: not valid JSON ({e})") from None
    if not isinstance(info, dict) or info.get("format") != BUNDLE_FORMAT or info.get("runtime") not in ("ctranslate2", "eager"):
        raise BundleError(f"{f}: expected format {BUNDLE_FORMAT} with runtime 'ctranslate2' or 'eager', got {info!r:.200}")
    return info
