"""``export`` stage: the serving bundle (``artifacts/export``) and its MLflow Model Registry entry.

Variant: the quantize stage's ``serving.json`` (the first gate-passing variant of
``quantize.serving_preference``: ``ct2-int8`` by default on CPU); when none passed, the eager float
model. The bundle's model card holds the data hashes (``dvc.lock`` / ``data.dvc``), the seeds, the
resolved params, and BLEU/chrF per test set of the shipped variant with the sacreBLEU signatures of
the evaluate stage (same sacreBLEU settings). The bundle is deterministic bytes (two runs, or two
clones, give the same ``dvc.lock`` hash), so the git commit is not in it: it goes into the card of
the *registered* copy and the model version's tags, where it names the code that registered it.

Registry (through the recorder ``run`` is handed; MLflow's when tracking is on): the bundle is logged
as an MLflow pyfunc model (input: sentences; output: translations), registered as
``aiayn-{src_lang}-{tgt_lang}`` (``aiayn.config.schema.registered_model_name``; env ``AIAYN_REGISTERED_MODEL``
overrides), so champions never cross language pairs, and the alias ``champion`` moves to it only
when its ``quantize.gate_split`` BLEU is >= the current champion's of the same registered model
(``aiayn.tracking.choose_alias``); otherwise it becomes ``challenger``. A model whose training was cut
by the clock or a signal is always ``challenger`` (``registry_provenance``), and so is a model continued from a
parent (``train.init_from``): the promotion gate decides whether it replaces the champion (``aiayn.adaptation``).

After ``dvc repro`` the pipeline flow calls ``ensure_registered``: DVC's run-cache can restore this stage's
outputs without running it (treeverse/dvc#4551), and then nothing registers the bundle in a new or emptied
tracking store. It registers ``artifacts/export`` when no version of the model holds its digest
(``aiayn.export.bundle.bundle_sha256``), and does nothing when one does.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from aiayn.inference.artifacts import EAGER, read_bundle_info, read_model_config
from aiayn.config.schema import DataConfig, Params, corpus_identity, registered_model_name
from aiayn.inference.runtimes import DecodeOptions
from aiayn.exitcodes import training_was_cut
from aiayn.export.bundle import build_bundle, register_bundle
from aiayn.provenance import CORPUS_STAGE, current_hashes, git_commit, stage_paths
from aiayn.recording import NULL_RECORDER, Recorder, StageRecord
from aiayn.config.settings import Settings
from aiayn.stages import Layout
from aiayn.inference.translator import max_source_tokens

__all__ = ["run", "REGISTERED_MODEL", "RECORD", "registry_provenance", "ensure_registered"]

log = logging.getLogger("aiayn")

#: Registered model name of the default pair (``aiayn.config.schema.registered_model_name``: ``aiayn-{src}-{tgt}``
#: from ``params.data``; env ``AIAYN_REGISTERED_MODEL`` overrides).
REGISTERED_MODEL = registered_model_name(DataConfig())

#: How an export run is recorded: the variant, the model card, the registered version.
RECORD = StageRecord("export")

#: The input example of the registered pyfunc model.
EXAMPLE = ["A man is riding a bicycle down the street."]


def _read_json(path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} not found: run the stages before export (`dvc repro`)") from None


def _corpus(layout: Layout, params: Params) -> dict[str, Any]:
    """The corpus the model was trained on (``prepare``'s report: identity, resolved revision, pair counts)."""
    path = layout.prepare_report
    report = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    train = report.get("splits", {}).get(params.data.train_split, {})
    return (report.get("corpus") or corpus_identity(params.data)) | {"train_pairs": train.get("kept")}


def _limits(params: Params, max_source_tokens: int, corpus: dict[str, Any]) -> list[str]:
    d = params.data
    if corpus.get("kind") == "multi30k":
        domain = (f"Trained on {d.src_lang}->{d.tgt_lang} image captions (Multi30k, ~29k sentence pairs): short, "
                  "literal, descriptive sentences; expect much lower quality on other domains (news, dialogue, "
                  "technical text).")
    else:
        label = corpus.get("name") or corpus.get("path")
        domain = (f"Trained on {d.src_lang}->{d.tgt_lang} text of {label} ({corpus.get('train_pairs')} sentence "
                  "pairs); expect lower quality outside that corpus's domain.")
    return [
        domain,
        f"A source sentence is at most {max_source_tokens} sentencepiece tokens (with EOS); the service splits "
        "longer lines at sentence/clause/word boundaries and translates the pieces.",
        "Trained on single captions: a line holding several sentences is translated as one unit and can lose "
        "content; send one sentence per item.",
        "Characters the tokenizer never saw (emoji, other scripts) are dropped from the input (the service logs "
        "a warning).",
        "Quantized variants are re-evaluated (BLEU/chrF above): numbers for other variants do not carry over.",
    ]


def _shipped(params: Params, layout: Layout) -> tuple[str, str, dict[str, dict[str, Any]], dict[str, Any]]:
    """``(variant, why, scores, quantize report)``: the variant that ships (``serving.json``; eager when
    none passed the gate), why, and its scores per test split with evaluate's signatures."""
    q, d = params.quantize, params.data
    serving = _read_json(layout.quantized / "serving.json")
    report = _read_json(layout.quantized / "report.json")
    eval_scores = _read_json(layout.eval / "scores.json")
    variant = serving.get("variant") or EAGER
    why = serving.get("why", "") if serving.get("variant") else (
        f"no quantized variant passed the gate (max BLEU drop {q.max_bleu_drop}): the eager float model ships")
    scores: dict[str, dict[str, Any]] = {}
    for split in d.test_splits:
        ev = eval_scores[split]
        sigs = {"bleu_signature": ev["bleu_signature"], "chrf_signature": ev["chrf_signature"]}
        if variant == EAGER:
            scores[split] = {"bleu": round(float(ev["bleu"]), 4), "chrf": round(float(ev["chrf"]), 4)} | sigs
        else:
            s = report["variants"][variant]["scores"][split]
            scores[split] = {"bleu": s["bleu"], "chrf": s["chrf"], "bleu_delta_vs_float": s["bleu_delta"]} | sigs
    return variant, why, scores, report


def registry_provenance(model_meta: dict[str, Any], commit: str | None, dirty: bool | None,
                        init_from: str | None = None) -> dict[str, Any]:
    """What the registered version carries beyond the bundle (its tags and its card's provenance): the git
    commit, and ``train.budget_cut`` (``max_time_s`` or ``signal``) when training was cut, which makes the
    registry give it ``challenger`` whatever its BLEU (``aiayn.tracking.choose_alias``): a cut model is not
    the configured one, so it is never served as ``champion`` without a person choosing it. ``init_from``
    (``train.init_from``): the model continues a parent; ``aiayn.promotion_gate: pending`` makes it
    ``challenger`` until the promotion gate (``aiayn.adaptation``) decides."""
    out: dict[str, Any] = {"git_commit": commit, "git_dirty": dirty}
    if training_was_cut(model_meta.get("budget")):
        out["train.budget_cut"] = model_meta.get("stopped_by") or "unknown"
    if init_from:
        out |= {"train.init_from": init_from, "aiayn.promotion_gate": "pending"}
    return out


def run(params: Params, layout: Layout, recorder: Recorder = NULL_RECORDER) -> dict[str, Any]:
    """Build ``artifacts/export`` and register it through ``recorder``. Returns
    ``{variant, bundle, registered: {version, alias}|None}`` (None: the recorder registered nothing).

    Raises ``FileNotFoundError`` when an earlier stage's output is missing and
    ``aiayn.export.bundle.BundleError`` when the chosen variant's files are incomplete.
    """
    q, e, d = params.quantize, params.evaluate, params.data
    variant, why, scores, report = _shipped(params, layout)
    model_meta = _read_json(layout.model / "model.json")
    decode = DecodeOptions.from_eval(e)
    max_src = max_source_tokens(read_model_config(layout.model / "model.json").max_side_tokens, decode)
    name = registered_model_name(d, Settings.from_env().registered_model_override)
    corpus = _corpus(layout, params)
    card = {
        "name": name,
        "description": f"Transformer (Vaswani et al., 2017) {d.src_lang}->{d.tgt_lang} translation model, "
                       f"preset {model_meta.get('model_preset')}, trained by the aiayn pipeline.",
        "why": why,
        "scores": scores,
        "gate": {"split": q.gate_split, "max_bleu_drop": q.max_bleu_drop},
        "corpus": corpus,
        "training": {k: model_meta[k] for k in ("budget", "stopped_by", "step") if k in model_meta}
                    | ({"selection": model_meta["selection"].get("notes", [])} if "selection" in model_meta else {}),
        "provenance": {"seed": model_meta.get("seed"),
                       "data_seed": model_meta.get("data_seed"), "averaged_steps": model_meta.get("averaged_steps"),
                       "tokenizer_sha256": model_meta.get("tokenizer_sha256"),
                       # continued training (train.init_from): the parent it was adapted from
                       **({"adapted_from": model_meta["adapted_from"]} if "adapted_from" in model_meta else {}),
                       "data_hashes": _data_hashes(layout, params)},
        # the params that made the model; the drift monitor's block is not one of them (and is not
        # among this stage's DVC params, so it must not change the bundle either)
        # (nor is the export block: it says which formats are written, not how the model was made;
        # nor the adapt block: when the adapt flow runs and gates, not how the model was made)
        "params": params.model_dump(mode="json", exclude={"monitor", "export", "adapt"}),
        "limits": _limits(params, max_src, corpus),
        "max_source_tokens": max_src,
    }
    vinfo = report["variants"].get(variant, {})
    build_bundle(layout.export, model_dir=layout.model, variant=variant,
                 variant_dir=None if variant == EAGER else layout.quantized / variant,
                 compute_type=vinfo.get("compute_type"), decode=decode, card=card)
    log.info("export: %s bundle in %s (%s BLEU %.2f)", variant, layout.export, q.gate_split, scores[q.gate_split]["bleu"])
    hf_dir = None
    if "hf-marian" in params.export.formats:  # transformers is imported only when asked for
        from aiayn.export.hf_marian import HF_MARIAN_DIR, export_marian

        hf_dir = export_marian(layout.model, layout.export / HF_MARIAN_DIR, decode=decode, src_lang=d.src_lang,
                               tgt_lang=d.tgt_lang)
        log.info("export: Hugging Face Marian folder in %s", hf_dir)

    registered = None
    with recorder.start(RECORD) as tracker:
        tracker.set_tags({"export.variant": variant})
        tracker.log_artifact(layout.export / "model_card.md", artifact_path="export")
        registered = _register(tracker, layout, name=name, variant=variant, gate_split=q.gate_split,
                               bleu=float(scores[q.gate_split]["bleu"]), model_meta=model_meta,
                               init_from=params.train.init_from)
        if registered:
            log.info("export: registered %s version %s as %s", name, registered["version"], registered["alias"])
        if registered and hf_dir is not None and params.export.mlflow_transformers:
            hf_version = tracker.register_transformers_model(
                hf_dir, name=f"{name}-hf", alias=registered["alias"], task=f"translation_{d.src_lang}_to_{d.tgt_lang}",
                example=EXAMPLE)
            registered["transformers"] = {"name": f"{name}-hf", "version": hf_version}
    return {"variant": variant, "bundle": str(layout.export), "registered": registered,
            "hf_marian": None if hf_dir is None else str(hf_dir)}


def _register(tracker, layout: Layout, *, name: str, variant: str, gate_split: str, bleu: float,
              model_meta: dict[str, Any], if_absent: bool = False, init_from: str | None = None,
              ) -> dict[str, Any] | None:
    """``artifacts/export`` registered through ``tracker`` with this checkout's commit (``register_bundle``)."""
    commit, dirty = git_commit(layout.root)
    return register_bundle(tracker, layout.export, name=name, variant=variant, gate_split=gate_split, bleu=bleu,
                           example=EXAMPLE, provenance=registry_provenance(model_meta, commit, dirty, init_from),
                           if_absent=if_absent)


def ensure_registered(params: Params, layout: Layout, tracker) -> dict[str, Any] | None:
    """Make sure ``artifacts/export`` is a version of its registered model in ``tracker``'s store (an
    ``aiayn.tracking.Tracker``, e.g. the pipeline flow's ``orchestrate`` run): when no version holds the
    bundle's digest, register it as the export stage does (the alias by the champion rule, the gate BLEU
    and variant from the bundle's own card and ``bundle.json``), else do nothing. Returns
    ``register_bundle``'s result (``"already_registered": True`` when nothing was done), or None when
    tracking is off or MLflow failed (``tracker.disabled_reason``). The Hugging Face export is not
    re-registered. Raises ``aiayn.inference.artifacts.BundleError`` when ``artifacts/export`` holds no bundle."""
    info = read_bundle_info(layout.export)  # raises when artifacts/export holds no bundle
    card = _read_json(layout.export / "model_card.json")
    gate_split = params.quantize.gate_split
    model_json = layout.model / "model.json"
    model_meta = json.loads(model_json.read_text(encoding="utf-8")) if model_json.is_file() else {}
    name = registered_model_name(params.data, Settings.from_env().registered_model_override)
    return _register(tracker, layout, name=name, variant=info["variant"], gate_split=gate_split,
                     bleu=float(card["scores"][gate_split]["bleu"]), model_meta=model_meta, if_absent=True,
                     init_from=params.train.init_from)


def _data_hashes(layout: Layout, params: Params) -> dict[str, str]:
    """The DVC hashes of the data this model was made from, as they are now (``aiayn.provenance.current_hashes``): the
    corpus the ``corpus`` stage reads (its data dependency in ``dvc.yaml``, filled from ``params``: ``data/multi30k``,
    or a corpus of one's own, inside the project or not) and the three stages' outputs after it. Under ``dvc repro``
    these are ``dvc.lock``'s; after ``aiayn <stage>`` runs outside DVC the lock is a run behind (a fresh clone's
    names the main job's data), the files are not.

    Raises:
        ValueError: ``dvc.yaml`` or a ``*.dvc`` file is not valid YAML.
    """
    corpus = stage_paths(layout.root, CORPUS_STAGE, params.model_dump(mode="json"))
    keys = ("artifacts/corpus", "artifacts/prepared", "artifacts/tokenized")
    return current_hashes(layout.root, [*(corpus.deps[:1] if corpus else ()), *keys])
