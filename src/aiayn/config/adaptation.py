"""The ``adapt:`` block of ``params.yaml``: when to adapt the served model to its users' domain, and the
two-sided promotion gate an adapted model (the challenger) must pass to replace its parent (the champion).

Read by the ``adapt`` flow (``pipelines/adapt_flow.py``) and ``aiayn.adaptation``; no DVC stage reads it.
Units: BLEU points (sacreBLEU, 0-100), drift-check windows, reviewed sentence pairs.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["AdaptGateConfig", "AdaptTriggerConfig", "AdaptConfig", "PARENT_TEST_SPLITS"]

#: The parent's test sets by default: the main job's (Multi30k En-De) ``data.test_splits``.
PARENT_TEST_SPLITS = ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AdaptGateConfig(_Strict):
    """The two-sided promotion gate (``aiayn.adaptation.promotion_gate``): challenger and champion are
    decoded and scored on the same test sets in one run; the challenger is promoted only when it gains at
    least ``gain_min`` BLEU on the new domain AND loses at most ``loss_max`` BLEU on every old split."""

    new_domain_split: str | None = Field(None, description="The new domain's test split, read like the other "
                                         "test splits (artifacts/prepared/<split>.<lang>; in the reviewed corpus's "
                                         "folder as <split>.tsv). None: the adapt flow refuses to run, naming it.")
    old_splits: tuple[str, ...] = Field(PARENT_TEST_SPLITS, description="The parent's test sets: the challenger "
                                        "may lose at most loss_max BLEU on each.")
    gain_min: float = Field(1.0, ge=0.0, description="BLEU points the challenger must gain on new_domain_split.")
    loss_max: float = Field(0.5, ge=0.0, description="BLEU points the challenger may lose at most on each old split.")

    @model_validator(mode="after")
    def _check(self) -> "AdaptGateConfig":
        if not self.old_splits:
            raise ValueError("adapt.gate.old_splits is empty: the gate needs at least one of the parent's test sets")
        if len(set(self.old_splits)) != len(self.old_splits):
            raise ValueError(f"adapt.gate.old_splits repeat a split: {list(self.old_splits)}")
        if self.new_domain_split is not None and self.new_domain_split in self.old_splits:
            raise ValueError(f"adapt.gate.new_domain_split {self.new_domain_split!r} is also in adapt.gate.old_splits")
        return self


class AdaptTriggerConfig(_Strict):
    """When the ``adapt`` flow adapts: either condition is enough (both count from the last adaptation)."""

    drift_windows: int = Field(3, ge=1, description="The last N drift checks (artifacts/drift/*/summary.json) "
                               "all found drift.")
    reviewed_pairs: int = Field(500, ge=1, description="The reviewed corpus grew by at least K pairs.")


class AdaptConfig(_Strict):
    """Adapting the served model to its users' domain (``adapt`` flow; docs/operations.md)."""

    gate: AdaptGateConfig = AdaptGateConfig()
    trigger: AdaptTriggerConfig = AdaptTriggerConfig()
    reviewed_corpus: str = Field("data/reviewed/train.tsv", description="The reviewed pairs (source<TAB>target), "
                                 "written by `aiayn review import`; relative to the project root. The adapted "
                                 "model trains on it; its folder holds the val and test splits as <split>.tsv.")
