"""Continued training from a parent model: the ``train.finetune`` block and the pure rules of ``train.init_from``.

``train.init_from`` names the parent: a registered version (``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``)
or a model folder (the train stage's ``artifacts/model``, or an eager serving bundle: ``model.json``,
``model.safetensors`` and ``spm.model``). The parent's weights, its sentencepiece model and its architecture are
kept; the optimizer and the learning-rate schedule start fresh (``FinetuneConfig``). Loading and checking the
parent: ``aiayn.init_from``; resolving a registered version: ``aiayn.tracking.registered_parent``.

No import of ``aiayn`` here: ``aiayn.config.schema`` imports this module.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["FinetuneConfig", "ARCHITECTURE_KEYS", "REGISTRY_PREFIX", "is_registry_uri", "registry_parts",
           "architecture_conflicts", "registered_parent_dir", "RESOLVED_FILE"]

#: A registered version's URI starts with this (MLflow's model URI scheme).
REGISTRY_PREFIX = "models:/"

#: The ``ModelConfig`` fields that make the weights' shapes and meaning: a config naming another value than the
#: parent's for one of them cannot continue the parent. ``vocab_size`` is the parent's tokenizer's; ``dropout``,
#: ``attention_dropout`` and ``attention_backend`` are training or runtime choices and may change.
ARCHITECTURE_KEYS = ("arch", "d_model", "n_heads", "n_kv_heads", "d_ff", "n_layers", "max_positions", "norm",
                     "norm_type", "activation", "share_embeddings", "positions")

#: In a resolved registered parent's folder (``registered_parent_dir``): what was resolved
#: (``{"uri", "name", "version", "run_id", "weights_from"}``), written last: the folder is complete.
RESOLVED_FILE = "resolved.json"


class FinetuneConfig(BaseModel):
    """How a run that starts from ``train.init_from`` trains; read only when ``init_from`` is set.

    Schedule: warmup over ``warmup_steps`` to ``lr_scale`` times the peak of the train block's own schedule
    (``train.lr_scale``, ``train.warmup_steps``), then the train block's ``lr_decay``
    (``aiayn.train.schedule.finetune_train_config``); the optimizer's moments start at zero.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    warmup_steps: int = Field(200, ge=1, description="Warmup of the fresh schedule (updates).")
    lr_scale: float = Field(0.5, gt=0.0, description="Peak lr as a share of the train block's own peak.")
    replay_share: float = Field(0.0, ge=0.0, le=0.9, description="Share of each epoch's pairs drawn from the "
                                "parent's training pairs (replay_path), so the old domain is not forgotten; the "
                                "draw is a pure function of (data_seed, epoch).")
    replay_path: str | None = Field(None, description="The parent's prepared training pair as a path prefix P "
                                    "(relative to the project root): P.<src_lang> and P.<tgt_lang>, e.g. "
                                    "../parent/artifacts/prepared/train. Needed when replay_share > 0.")
    warn_unk_rate: float = Field(0.01, ge=0.0, le=1.0, description="Warn when more than this share of the new "
                                 "training text's pieces are unknown to the parent's sentencepiece model.")
    max_unk_rate: float = Field(0.05, ge=0.0, le=1.0, description="Refuse the new corpus above this unknown-piece "
                                "share (the parent's vocabulary does not cover it).")

    @model_validator(mode="after")
    def _check(self) -> "FinetuneConfig":
        if self.warn_unk_rate > self.max_unk_rate:
            raise ValueError(f"finetune.warn_unk_rate {self.warn_unk_rate} > finetune.max_unk_rate {self.max_unk_rate}")
        if self.replay_share > 0 and not self.replay_path:
            raise ValueError(f"finetune.replay_share {self.replay_share} needs finetune.replay_path (the parent's "
                             "prepared training pair, a path prefix P: P.<src_lang>, P.<tgt_lang>)")
        return self


def is_registry_uri(init_from: str) -> bool:
    """``init_from`` names a registered version (``models:/...``), not a folder."""
    return init_from.startswith(REGISTRY_PREFIX)


def registry_parts(uri: str) -> tuple[str, str | None, str | None]:
    """``models:/NAME@ALIAS`` -> ``(name, alias, None)``; ``models:/NAME/VERSION`` -> ``(name, None, version)``.
    Raises ``ValueError`` (one line) for anything else."""
    rest = uri[len(REGISTRY_PREFIX):] if is_registry_uri(uri) else ""
    name, alias, version = rest, None, None
    if "@" in rest:
        name, alias = rest.split("@", 1)
    elif "/" in rest:
        name, version = rest.rsplit("/", 1)
    if not name or not (alias or (version and version.isdigit())):
        raise ValueError(f"train.init_from {uri!r}: a registered model is models:/NAME@ALIAS or models:/NAME/VERSION")
    return name, alias, version


def architecture_conflicts(mine: dict[str, Any], parent: dict[str, Any]) -> list[str]:
    """``"key: <mine> (parent <parent's>)"`` for each ``ARCHITECTURE_KEYS`` field whose value differs between two
    ``ModelConfig.model_dump()`` dicts (empty: the same architecture)."""
    return [f"{k}: {mine.get(k)!r} (parent {parent.get(k)!r})" for k in ARCHITECTURE_KEYS if mine.get(k) != parent.get(k)]


def registered_parent_dir(cache_root: str | Path, name: str, version: str) -> Path:
    """Where a resolved registered version is kept under ``cache_root`` (one folder per name and version: a
    version's bytes never change, so a kept one is not downloaded again)."""
    return Path(cache_root) / re.sub(r"[^A-Za-z0-9._-]", "_", name) / f"v{version}"
