"""The parent model of a continued training (``train.init_from``): where it is, what it is, and whether this run
can continue it. Pure and light (no torch): the tokenize stage and ``aiayn check`` import it; the train stage
loads the weights (``aiayn.stages.train_job``).

A parent is a model folder: ``model.json`` (its ``ModelConfig`` under ``"model"``), ``model.safetensors`` and
``spm.model`` (the train stage's ``artifacts/model``, or an eager serving bundle). ``train.init_from`` names
it as a folder (relative to the project root) or as a registered version (``models:/NAME@ALIAS``,
``models:/NAME/VERSION``), which a resolver downloads into ``.aiayn/parents/NAME/vVERSION`` under the project root
(``aiayn.tracking.registered_parent``, reached through the stage's recorder: its ``resolve_registered_model``).

The tokenize stage resolves the parent, encodes the new corpus with the parent's sentencepiece model and records
the parent in ``artifacts/tokenized/parent.json`` (``ParentModel.record``: URI, version, source run, sha256 of
the weights and of the sentencepiece model, the architecture); the train stage continues exactly that parent
(a registered alias is pinned to the version tokenize resolved) and refuses one whose bytes changed since.
Every refusal is one line (``ParentModelError``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import sentencepiece as spm
from pydantic import ValidationError

from aiayn.config.finetune import (RESOLVED_FILE, FinetuneConfig, architecture_conflicts, is_registry_uri,
                                   registered_parent_dir, registry_parts)
from aiayn.config.schema import ModelConfig, TrainConfig
from aiayn.io import atomic_write_bytes, atomic_write_text, sha256_file
from aiayn.tokenizer import Tokenizer, TokenizerError

__all__ = ["PARENT_FILE", "REPLAY_SPLIT", "CACHE_DIR", "ParentModelError", "ParentModel", "Resolver",
           "resolve_parent", "open_parent", "architecture_problem", "check_architecture", "training_model_config",
           "write_parent_tokenizer", "unknown_rate", "check_unknown_rate", "recorded_parent", "parent_for_training"]

log = logging.getLogger("aiayn")

#: In ``artifacts/tokenized``: the parent the corpus was encoded for (``ParentModel.record``).
PARENT_FILE = "parent.json"
#: The encoded split of the parent's replayed training pairs in ``artifacts/tokenized`` (``train.finetune.replay_*``).
REPLAY_SPLIT = "parent_replay"
#: Under the project root: resolved registered parents, one folder per name and version (not a DVC output).
CACHE_DIR = Path(".aiayn") / "parents"

#: ``(uri, cache_root) -> {"model_dir", "version", "run_id", ...}``: a registered version downloaded under
#: ``cache_root`` (``aiayn.tracking.MlflowRecorder.resolve_registered_model``).
Resolver = Callable[[str, Path], dict[str, Any]]


class ParentModelError(ValueError):
    """The parent of ``train.init_from`` cannot be found, loaded or continued (one line naming it)."""


@dataclass(frozen=True)
class ParentModel:
    """A parent model folder, read: ``model`` is its ``model.json``'s ``"model"`` (a full ``ModelConfig`` dump)."""

    uri: str
    folder: Path
    model: dict[str, Any]
    weights_sha256: str
    spm_sha256: str
    version: str | None = None
    run_id: str | None = None

    @property
    def weights(self) -> Path:
        return self.folder / "model.safetensors"

    @property
    def spm(self) -> Path:
        return self.folder / "spm.model"

    def record(self) -> dict[str, Any]:
        """What names this parent, as JSON (deterministic: no local path)."""
        return {"uri": self.uri, "version": self.version, "run_id": self.run_id,
                "weights_sha256": self.weights_sha256, "spm_sha256": self.spm_sha256, "model": self.model}


def open_parent(folder: str | Path, uri: str, *, version: str | None = None, run_id: str | None = None,
                digests: bool = True) -> ParentModel:
    """Read the parent folder: its architecture, that its vocabulary loads and has the model's size, that it has float
    weights (``digests``: their sha256 and the vocabulary's; else empty). Raises ``ParentModelError`` naming what
    cannot be loaded."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ParentModelError(f"train.init_from {uri}: no model folder at {folder}")
    weights = folder / "model.safetensors"
    if not weights.is_file() and (folder / "bundle.json").is_file():
        raise ParentModelError(f"train.init_from {uri}: {folder} is a CTranslate2 serving bundle without float "
                               "weights; give the train stage's model folder (artifacts/model) or an eager bundle")
    for need in ("model.json", "spm.model", "model.safetensors"):
        if not (folder / need).is_file():
            raise ParentModelError(f"train.init_from {uri}: {folder / need} not found (a model folder holds model.json, "
                                   "model.safetensors and spm.model)")
    try:
        model = ModelConfig(**json.loads((folder / "model.json").read_text(encoding="utf-8"))["model"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        why = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()) \
            if isinstance(e, ValidationError) else " ".join(str(e).split())
        raise ParentModelError(f"train.init_from {uri}: the parent's architecture {folder / 'model.json'} cannot be "
                               f"loaded: {why}") from None
    try:
        pieces = Tokenizer.load(folder / "spm.model").vocab_size
    except TokenizerError as e:
        raise ParentModelError(f"train.init_from {uri}: the parent's vocabulary {folder / 'spm.model'} cannot be loaded: "
                               f"{' '.join(str(e).split())}") from None
    if pieces != model.vocab_size:
        raise ParentModelError(f"train.init_from {uri}: the parent's vocabulary {folder / 'spm.model'} has {pieces} "
                               f"pieces but its model.json says vocab_size={model.vocab_size}")
    shas = (sha256_file(weights), sha256_file(folder / "spm.model")) if digests else ("", "")
    return ParentModel(uri, folder, model.model_dump(mode="json"), *shas, version, run_id)


def resolve_parent(init_from: str, root: str | Path, resolver: Resolver | None = None) -> ParentModel:
    """The parent ``init_from`` names: a folder (relative to ``root``) or a registered version, taken from
    ``root/CACHE_DIR`` when that exact version was resolved before, else through ``resolver``. Raises
    ``ParentModelError`` (one line; the resolver's ``RuntimeError``, e.g. ``aiayn.tracking.RegistryError``, too)."""
    root = Path(root)
    if not is_registry_uri(init_from):
        folder = Path(init_from)
        return open_parent(folder if folder.is_absolute() else root / folder, init_from)
    try:
        name, _, version = registry_parts(init_from)
    except ValueError as e:
        raise ParentModelError(str(e)) from None
    if version is not None:
        kept = registered_parent_dir(root / CACHE_DIR, name, version)
        if (kept / RESOLVED_FILE).is_file():
            info = json.loads((kept / RESOLVED_FILE).read_text(encoding="utf-8"))
            return open_parent(kept, init_from, version=version, run_id=info.get("run_id"))
    if resolver is None:
        raise ParentModelError(f"train.init_from {init_from}: a registered model is resolved through the MLflow "
                               "registry, which this run was not handed (run `aiayn tokenize` or the pipeline, or "
                               "give a model folder)")
    try:
        info = resolver(init_from, root / CACHE_DIR)
    except RuntimeError as e:  # the registry's one-line errors (aiayn.tracking.RegistryError): bad input, not a crash
        raise ParentModelError(f"train.init_from {init_from}: {' '.join(str(e).split())}") from None
    return open_parent(info["model_dir"], init_from, version=str(info["version"]), run_id=info.get("run_id"))


def architecture_problem(model: ModelConfig, parent_model: dict[str, Any], uri: str) -> str | None:
    """One line naming the ``model`` fields that contradict the parent's architecture, or None."""
    conflicts = architecture_conflicts(model.model_dump(mode="json"), parent_model)
    if not conflicts:
        return None
    return (f"train.init_from {uri}: the model block contradicts the parent's architecture: {'; '.join(conflicts)} "
            "(the architecture comes from the parent: set these model keys to the parent's)")


def check_architecture(model: ModelConfig, parent: ParentModel) -> None:
    """Raise ``ParentModelError`` (``architecture_problem``) when ``model`` contradicts the parent's architecture."""
    problem = architecture_problem(model, parent.model, parent.uri)
    if problem:
        raise ParentModelError(problem)


def training_model_config(model: ModelConfig, parent: ParentModel) -> ModelConfig:
    """The model a continued run trains: the parent's (architecture and vocabulary), with ``model``'s dropout,
    attention dropout and attention backend (training and runtime choices)."""
    keep = {k: getattr(model, k) for k in ("dropout", "attention_dropout", "attention_backend")}
    return ModelConfig(**(parent.model | keep))


def write_parent_tokenizer(parent: ParentModel, model_path: Path) -> Path:
    """The parent's sentencepiece model at ``model_path`` (its bytes) and ``.vocab`` beside it (``piece<TAB>score``,
    as the tokenize stage writes for a model it trains). Returns ``model_path``."""
    data = parent.spm.read_bytes()
    sp = spm.SentencePieceProcessor(model_proto=data)
    atomic_write_bytes(model_path, data)
    atomic_write_text(model_path.with_suffix(".vocab"),
                      "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.get_piece_size())))
    return model_path


def unknown_rate(stats: dict[str, Any]) -> float:
    """Share of a split's pieces (both sides) that are the unknown piece, from the tokenize stage's split stats."""
    tokens = stats["src_tokens"] + stats["tgt_tokens"]
    return (stats["src_unk"] + stats["tgt_unk"]) / tokens if tokens else 0.0


def check_unknown_rate(rate: float, ft: FinetuneConfig, uri: str, what: str) -> None:
    """Warn above ``ft.warn_unk_rate``; raise ``ParentModelError`` above ``ft.max_unk_rate`` (the rate and the cut)."""
    if rate > ft.max_unk_rate:
        raise ParentModelError(f"train.init_from {uri}: {rate:.2%} of {what}'s pieces are unknown to the parent's "
                               f"sentencepiece model, above train.finetune.max_unk_rate {ft.max_unk_rate:.2%}: its "
                               "vocabulary does not cover this corpus")
    if rate > ft.warn_unk_rate:
        log.warning("train.init_from %s: %.2f%% of %s's pieces are unknown to the parent's sentencepiece model "
                    "(above train.finetune.warn_unk_rate %.2f%%)", uri, 100 * rate, what, 100 * ft.warn_unk_rate)


def recorded_parent(tokenized: str | Path) -> dict[str, Any] | None:
    """The parent ``tokenized`` (``artifacts/tokenized``) was encoded for (``PARENT_FILE``), or None."""
    path = Path(tokenized) / PARENT_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def parent_for_training(cfg: TrainConfig, root: str | Path, tokenized: str | Path,
                        resolver: Resolver | None = None) -> ParentModel | None:
    """The parent the train stage continues (None without ``cfg.init_from``): the one the tokenize stage recorded,
    a registered alias pinned to the version it resolved then. Raises ``ParentModelError`` when ``tokenized`` was
    made for another parent (or none) or the parent's bytes changed since (rerun the tokenize stage)."""
    recorded = recorded_parent(tokenized)
    if cfg.init_from is None:
        if recorded is not None:
            raise ParentModelError(f"{tokenized} was encoded for train.init_from {recorded['uri']}, but train.init_from "
                                   "is null: rerun the tokenize stage")
        return None
    if recorded is None or recorded.get("uri") != cfg.init_from:
        made_for = f"train.init_from {recorded['uri']}" if recorded else "training from scratch"
        raise ParentModelError(f"{tokenized} was made for {made_for}, not train.init_from {cfg.init_from}: rerun the "
                               "tokenize stage")
    uri = cfg.init_from
    if is_registry_uri(uri) and recorded.get("version") is not None:
        uri = f"models:/{registry_parts(uri)[0]}/{recorded['version']}"
    parent = replace(resolve_parent(uri, root, resolver), uri=cfg.init_from)
    if (parent.weights_sha256, parent.spm_sha256) != (recorded["weights_sha256"], recorded["spm_sha256"]):
        raise ParentModelError(f"train.init_from {cfg.init_from}: the parent's weights or vocabulary changed since the "
                               "tokenize stage encoded the corpus for it: rerun the tokenize stage")
    return parent
