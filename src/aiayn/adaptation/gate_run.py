"""The promotion gate's run: challenger and champion decoded and scored on the same test sets in one run,
the two-sided decision (``aiayn.adaptation.promotion_gate``), and its record.

``run_gate`` is the gate proper, stage-shaped (``params``, ``layout``, a recorder): it scores two serving
bundles with the evaluate stage's code (``aiayn.stages.evaluate.decode_split`` and ``score_split``: the
``evaluate`` block's decoding options and sacreBLEU settings, ``artifacts/prepared`` test text), decides,
writes ``artifacts/gate/`` (``decision.json``, and the challenger's model card with its "Promotion gate"
section: ``model_card.json``/``.md``) and records the numbers, the decision and those files into its run.

``promotion_gate`` is what the ``adapt`` flow calls after the adapted pipeline ran (train from the champion,
evaluate, quantize, export, which registered the bundle as ``challenger``): it finds the challenger's version
(the exported bundle's digest), downloads the champion's bundle, runs ``run_gate`` with MLflow's recorder
(nested under the adapted pipeline run) and applies the decision to the registry
(``aiayn.tracking.promotion.apply_gate_decision``: both outcomes as version tags; a promotion through
``champion_history.promote``; a refusal moves nothing).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

import torch

from aiayn.adaptation.promotion_gate import GateError, decide, gate_metrics, summary_line
from aiayn.config.schema import Params
from aiayn.data.readers import read_lines
from aiayn.export.model_card import render_card
from aiayn.inference.load import ServingBundle
from aiayn.inference.runtimes import DecodeOptions
from aiayn.inference.translator import Translator
from aiayn.io import atomic_dir, atomic_write_json, atomic_write_text
from aiayn.recording import BAD_KEY_CHARS, NULL_RECORDER, Recorder, StageRecord
from aiayn.stages import Layout, split_reads
from aiayn.stages.evaluate import decode_split, score_split

__all__ = ["RECORD", "gate_dir", "score_bundle", "run_gate", "promotion_gate"]

log = logging.getLogger("aiayn")

#: How a gate run is recorded: its numbers and its decision are the (adapted) pipeline run's headline.
RECORD = StageRecord("promotion_gate", headline_metrics=r"^gate\.", headline_tags=r"^gate\.decision$")


def gate_dir(layout: Layout) -> Path:
    """Where the gate writes: ``artifacts/gate`` (not a DVC output)."""
    return layout.root / "artifacts" / "gate"


def _device(choice: str) -> str:
    return "cuda" if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()) else "cpu"


def score_bundle(params: Params, layout: Layout, bundle: Path, splits: list[str]) -> dict[str, dict[str, Any]]:
    """``{split: scores}`` of the serving bundle in ``bundle`` on ``splits`` of ``artifacts/prepared``, decoded
    and scored as the evaluate stage does (``evaluate`` block). Raises ``FileNotFoundError`` for a split that
    is not prepared, and what decoding and scoring raise."""
    d, e = params.data, params.evaluate
    loaded = ServingBundle.load(bundle, device=_device(e.device), threads=torch.get_num_threads())
    translator = Translator(loaded.tokenizer, loaded.decoder)
    options = DecodeOptions.from_eval(e)
    out = {}
    for split in splits:
        sources = read_lines(layout.prepared / f"{split}.{d.src_lang}")
        references = read_lines(layout.prepared / f"{split}.{d.tgt_lang}")
        hyps = decode_split(translator, sources, options, e.long_policy)
        out[split] = score_split(params, layout, split, hyps, references)
        log.info("gate: %s %s BLEU %.2f", bundle.name, split, out[split]["bleu"])
    return out


def run_gate(params: Params, layout: Layout, recorder: Recorder = NULL_RECORDER, *, parent_bundle: Path,
             challenger_bundle: Path | None = None, models: dict[str, str] | None = None) -> dict[str, Any]:
    """Score ``challenger_bundle`` (default ``artifacts/export``) and ``parent_bundle`` on the new domain's
    split and the old splits (``adapt.gate``), decide, write ``artifacts/gate`` and record into ``recorder``
    (module doc). ``models``: ``{"challenger": ..., "parent": ...}`` labels (e.g. ``models:/NAME/3``) for the
    card and the tags. Returns the decision with ``summary`` (one line), ``models`` and ``run_id`` (the
    recorder's run, None for one without). Raises ``GateError`` (an unset or unprepared split, different
    signatures) and what ``score_bundle`` raises; then nothing is written."""
    gate = params.adapt.gate
    if gate.new_domain_split is None:
        raise GateError("adapt.gate.new_domain_split is not set: the gate has no new domain to measure")
    splits = [gate.new_domain_split, *gate.old_splits]
    langs = (params.data.src_lang, params.data.tgt_lang)
    missing = [f"{split}.{lang}" for split in splits for lang in langs
               if not (layout.prepared / f"{split}.{lang}").is_file()]
    if missing:
        raise GateError(f"the gate's test text is not prepared: {', '.join(missing)} missing in {layout.prepared} "
                        "(data.test_splits must hold adapt.gate.new_domain_split and adapt.gate.old_splits)")
    challenger_bundle = Path(challenger_bundle or layout.export)
    challenger = score_bundle(params, layout, challenger_bundle, splits)
    parent = score_bundle(params, layout, Path(parent_bundle), splits)
    decision = decide(challenger, parent, new_domain_split=gate.new_domain_split, old_splits=gate.old_splits,
                      gain_min=gate.gain_min, loss_max=gate.loss_max)
    decision |= {"summary": summary_line(decision), "models": dict(models or {})}
    card_path = challenger_bundle / "model_card.json"
    card = json.loads(card_path.read_text(encoding="utf-8")) if card_path.is_file() else None
    record = RECORD.reading(*split_reads(layout, splits, langs, "test"))
    with recorder.start(record) as run:
        with atomic_dir(gate_dir(layout)) as out:
            atomic_write_json(out / "decision.json", decision)
            if card is not None:
                card["promotion_gate"] = decision
                atomic_write_json(out / "model_card.json", card)
                atomic_write_text(out / "model_card.md", render_card(card))
        run.log_metrics(gate_metrics(decision), step=0)
        run.set_tags({"gate.decision": "promote" if decision["promote"] else "refuse",
                      "gate.summary": decision["summary"][:4000],
                      **{f"gate.{k}": v for k, v in decision["models"].items()},
                      **{f"gate.{BAD_KEY_CHARS.sub('_', s)}.bleu_signature": sig
                         for s, sig in decision["signatures"].items()}})
        run.log_artifacts(gate_dir(layout), artifact_path="gate")
        decision["run_id"] = getattr(run, "run_id", None)
    log.info("promotion gate: %s", decision["summary"])
    return decision


def promotion_gate(params: Params, layout: Layout, *, name: str, tracking_uri: str,
                   parent_run_id: str | None = None) -> dict[str, Any]:
    """The gate after an adapted pipeline run (module doc), for registered model ``name`` in the store at
    ``tracking_uri``; its run nests under ``parent_run_id`` (the adapted pipeline run) when given. Returns
    ``run_gate``'s decision with ``registry`` (``apply_gate_decision``'s answer). Raises
    ``aiayn.tracking.RegistryError`` (no challenger version, no champion, the champion moved since the
    adapted run resolved it) and what ``run_gate`` raises: the champion is untouched then."""
    from aiayn.config.settings import Settings
    from aiayn.export.bundle import bundle_sha256
    from aiayn.init_from import recorded_parent
    from aiayn.tracking import MlflowRecorder, RegistryError, download_registered_bundle
    from aiayn.tracking.promotion import apply_gate_decision, challenger_version

    version = challenger_version(name, bundle_sha256(layout.export), tracking_uri=tracking_uri)
    settings = dataclasses.replace(Settings.from_env(), parent_run_id=parent_run_id or None)
    recorder = MlflowRecorder(layout.root, tracking_uri=tracking_uri, settings=settings,
                              params=params.model_dump(mode="json"))
    with tempfile.TemporaryDirectory(prefix="aiayn-gate-") as tmp:
        parent_version, parent_bundle = download_registered_bundle(name, "champion", tracking_uri=tracking_uri,
                                                                   dst=tmp)
        adapted_from = (recorded_parent(layout.tokenized) or {}).get("version")
        if adapted_from is not None and str(adapted_from) != str(parent_version):
            raise RegistryError(f"the champion of {name} is version {parent_version}, but the adapted model continued "
                                f"version {adapted_from}: the gate compares a model with its own parent; adapt again")
        if str(parent_version) == str(version):
            raise RegistryError(f"version {version} of {name} is the champion already: nothing to gate")
        decision = run_gate(params, layout, recorder, parent_bundle=parent_bundle,
                            models={"challenger": f"models:/{name}/{version}",
                                    "parent": f"models:/{name}/{parent_version}"})
    decision["registry"] = apply_gate_decision(
        decision, name=name, version=version, parent_version=parent_version, tracking_uri=tracking_uri,
        summary=decision["summary"], metrics=gate_metrics(decision), run_id=decision["run_id"])
    return decision
