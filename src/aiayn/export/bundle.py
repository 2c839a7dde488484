"""The serving bundle: what leaves the pipeline for a serving team, and its registry hand-off.

A bundle is one self-contained folder (``artifacts/export`` from the ``export`` stage; its layout and
loader: ``aiayn.inference.load``): ``bundle.json`` (variant, runtime, compute type, decoding
options), the trained model's ``model.json`` and ``spm.model``, the model (``ct2/`` for CTranslate2,
``model.safetensors`` for the eager runtime) and the model card (``model_card.json`` data hashes,
seeds, params, variant, BLEU/chrF per test set with their sacreBLEU signatures, known limits;
``model_card.md`` the same facts, for people).

The variant is the first quantize-gate-passing one of ``quantize.serving_preference`` (``ct2-int8``
by default, CPU); when none passed, the eager float model (``aiayn.inference.artifacts.EAGER``): a rejected variant
never ships. The model card's markdown: ``aiayn.export.model_card``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from aiayn.export.model_card import render_card
from aiayn.inference.artifacts import BUNDLE_FORMAT, CT2_FILES, EAGER, BundleError
from aiayn.inference.load import BundlePredictor
from aiayn.inference.runtimes import DecodeOptions
from aiayn.faults import fault_point
from aiayn.io import atomic_dir, atomic_write_json, atomic_write_text

__all__ = ["build_bundle", "register_bundle", "bundle_sha256", "BUNDLE_SHA256_TAG"]

#: The version tag naming the registered bundle's digest (``aiayn.tracking.registry.BUNDLE_SHA256_TAG``).
BUNDLE_SHA256_TAG = "aiayn.bundle_sha256"


def bundle_sha256(bundle: str | Path) -> str:
    """The bundle's content digest: sha256 over each file's relative path and sha256, in path order
    (the same bytes give the same digest in any clone)."""
    root, h = Path(bundle), hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        with open(path, "rb") as f:
            file_hex = hashlib.file_digest(f, "sha256").hexdigest()
        h.update(f"{path.relative_to(root).as_posix()}\0{file_hex}\n".encode())
    return h.hexdigest()


def register_bundle(tracker, bundle: str | Path, *, name: str, variant: str, gate_split: str, bleu: float,
                    example: list[str], provenance: dict[str, Any] | None = None,
                    if_absent: bool = False) -> dict[str, Any] | None:
    """Register ``bundle`` through ``tracker`` (an ``aiayn.tracking.Tracker``) as a pyfunc model run by
    ``BundlePredictor``. ``provenance`` (e.g. the git commit) goes into the model card of the
    registered copy and into the version's tags, never into ``bundle`` itself (a DVC output: it stays
    deterministic bytes). The version's tags also carry ``bundle_sha256(bundle)`` (``BUNDLE_SHA256_TAG``):
    the registry's idempotency key is made from it, and ``if_absent=True`` (a ``Tracker`` only) registers
    nothing when a version holds that digest already. Returns ``Tracker.register_translation_model``'s result."""
    import tempfile

    provenance = dict(provenance or {})
    digest = {BUNDLE_SHA256_TAG: bundle_sha256(bundle)}
    absent = {"if_absent": True} if if_absent else {}  # a NullRun takes no such argument
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "bundle"
        shutil.copytree(bundle, copy)
        card = json.loads((copy / "model_card.json").read_text(encoding="utf-8"))
        card["provenance"] = card.get("provenance", {}) | provenance
        atomic_write_json(copy / "model_card.json", card)
        atomic_write_text(copy / "model_card.md", render_card(card))
        return tracker.register_translation_model(copy, name=name, variant=variant, gate_split=gate_split, bleu=bleu,
                                                  example=example, predictor=BundlePredictor,
                                                  tags=provenance | digest, **absent)


def build_bundle(
    out_dir: str | Path,
    *,
    model_dir: str | Path,
    variant: str,
    variant_dir: str | Path | None,
    compute_type: str | None,
    decode: DecodeOptions,
    card: dict[str, Any],
) -> Path:
    """Write the bundle for ``variant`` into ``out_dir`` (atomically replaced).

    ``variant == EAGER``: the float weights of ``model_dir``; otherwise ``variant_dir`` is the
    quantize stage's CTranslate2 folder for it. ``card``: the model card fields (``render_card``).
    Raises ``BundleError`` when a needed file is missing.
    """
    model_dir = Path(model_dir)
    for name in ("model.json", "spm.model", *(("model.safetensors",) if variant == EAGER else ())):
        if not (model_dir / name).is_file():
            raise BundleError(f"{model_dir / name} not found (run the train stage first)")
    if variant != EAGER:
        if variant_dir is None or any(not (Path(variant_dir) / n).is_file() for n in CT2_FILES):
            raise BundleError(f"{variant_dir}: not a CTranslate2 model folder (run the quantize stage first)")
    info = {"format": BUNDLE_FORMAT, "variant": variant, "runtime": "eager" if variant == EAGER else "ctranslate2",
            "compute_type": None if variant == EAGER else compute_type, "decode": decode.__dict__}
    with atomic_dir(Path(out_dir)) as out:
        for name in ("model.json", "spm.model"):
            shutil.copyfile(model_dir / name, out / name)
        if variant == EAGER:
            shutil.copyfile(model_dir / "model.safetensors", out / "model.safetensors")
        else:
            (out / "ct2").mkdir()
            for name in CT2_FILES:
                shutil.copyfile(Path(variant_dir) / name, out / "ct2" / name)
        fault_point("bundle.model_copied")
        atomic_write_json(out / "bundle.json", info)
        full = card | {"variant": variant, "runtime": info["runtime"], "compute_type": info["compute_type"],
                       "decode": info["decode"]}
        atomic_write_json(out / "model_card.json", full)
        atomic_write_text(out / "model_card.md", render_card(full))
    return Path(out_dir)
