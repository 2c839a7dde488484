"""``quantize`` stage: build quantized variants of ``artifacts/model``, evaluate each like the float
model, check parity, report activation outliers and gate on BLEU.

Outputs: ``artifacts/quantized/`` (DVC ``outs``): one folder per built variant (CTranslate2 model or
torchao state dict + ``spm.model`` + ``variant.json``), ``report.json`` (deterministic: scores,
statuses, parity, score check, layer attribution, serving default), ``serving.json`` and
``outliers/`` (CSV, markdown, PNG). ``artifacts/quantize_metrics.json`` (DVC ``metrics``):
per variant BLEU/chrF and deltas vs. the eager float model per test set, bytes, status. Both are
deterministic bytes (two runs give the same ``dvc.lock`` hashes). Wall-clock numbers (decode
throughput, stage seconds) go to ``artifacts/quantize_throughput.json``, a top-level ``dvc.yaml``
metrics file outside every stage's outputs, and to the tracker.

Threads: CTranslate2 decodes with ``inter_threads = quantize.num_threads`` workers of one thread
each (batches in parallel: its throughput configuration, and outputs that do not depend on the
core count); batch-1 latency is measured with ``intra_threads`` instead (one sentence at a time).

Gate: a variant whose BLEU on ``quantize.gate_split`` is more than ``quantize.max_bleu_drop`` below
the eager float model's is ``rejected`` (in ``variant.json``, the report and the metrics) and never
becomes the serving default. CUDA-only variants are ``skipped`` with the reason on a CPU machine, and
CTranslate2 variants of a model the converter cannot map (``check_supported``: e.g. ALiBi positions).
Raises ``QuantizeError`` when the ct2-float32 conversion does not reproduce the eager model's
teacher-forced scores (``quantize.score_tolerance``): that is a converter bug, not a quality issue.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aiayn.inference.artifacts import EAGER, ModelBundle
from aiayn.config.schema import EOS_ID, Params
from aiayn.data.readers import read_lines
from aiayn.inference.runtimes import CT2Decoder, DecodeOptions, EagerDecoder
from aiayn.progress import Progress
from aiayn.faults import fault_point
from aiayn.io import atomic_dir, atomic_write_json
from aiayn.model import Transformer
from aiayn.quantize.gate import ACCEPTED, FAILED, REJECTED, SKIPPED, degenerate_lines, gate
from aiayn.export.ctranslate2 import AiaynConverter, UnsupportedModelError, check_supported
from aiayn.quantize.int8 import ACCUMULATIONS, decode_under, int8_accumulation
from aiayn.quantize.fake_quant import LAYER_TYPES, with_fake_int8
from aiayn.quantize.outliers import activation_stats, write_report
from aiayn.quantize.throughput import measure, thread_count
from aiayn.quantize.variants import VARIANTS, Variant, build_ct2, build_torchao, dir_bytes, unavailable_reason
from aiayn.recording import NULL_RECORDER, Recorder, StageRecord
from aiayn.evaluation.scoring import score
from aiayn.stages import Layout
from aiayn.tokenizer import Tokenizer
from aiayn.inference.translator import Translator

__all__ = ["run", "QuantizeError", "RECORD"]

log = logging.getLogger("aiayn")

#: How a quantize run is recorded: a variant's BLEU is not the pipeline run's headline (evaluate's is).
RECORD = StageRecord("quantize")

#: Alternating measurement rounds of ``_throughput`` (median and min-max reported).
THROUGHPUT_ROUNDS = 3

#: The parity reference of every CTranslate2 variant (built first whenever one is asked for).
CT2_REFERENCE = "ct2-float32"

#: Longest source (tokens with EOS) of a sentence pair ``_pairs`` takes for the teacher-forced score
#: check and the outlier calibration: keeps those one-sentence forward passes small (far above any
#: Multi30k source, so no pair is skipped there).
SAMPLE_MAX_SOURCE_TOKENS = 256


class QuantizeError(RuntimeError):
    """The conversion is wrong (teacher-forced scores differ from the eager model's)."""


@dataclass
class _Run:
    """What the stage's steps share: the eager float model (CPU) and its decoder, the decoding options,
    the test sets (``split -> (sources with EOS, references)``), and what they measured so far:
    ``report`` (report.json), ``metrics`` (quantize_metrics.json), wall-clock ``timings`` (seconds),
    the eager outputs and scores, the built CTranslate2 decoders and every variant's output ids."""

    params: Params
    layout: Layout
    model: Transformer
    tokenizer: Tokenizer
    eager: EagerDecoder
    options: DecodeOptions
    threads: int
    tests: dict[str, tuple[list[np.ndarray], list[str]]]
    report: dict[str, Any]
    metrics: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    eager_out: dict[str, list[list[int]]] = field(default_factory=dict)
    eager_scores: dict[str, dict[str, float]] = field(default_factory=dict)
    ct2: dict[str, CT2Decoder] = field(default_factory=dict)
    outputs: dict[str, dict[str, list[list[int]]]] = field(default_factory=dict)


def _bleu_chrf(tokenizer, outs: list[list[int]], refs: list[str]) -> dict[str, float]:
    r = score(tokenizer.decode(outs), refs)
    return {"bleu": round(float(r["bleu"]), 4), "chrf": round(float(r["chrf"]), 4)}


def _pairs(tokenizer, src_lines: list[str], tgt_lines: list[str], n: int) -> tuple[list[np.ndarray], list[list[int]]]:
    """The first ``n`` pairs whose source fits ``SAMPLE_MAX_SOURCE_TOKENS`` and whose target is not
    empty: (sources with EOS, target ids)."""
    srcs, tgts = [], []
    for s, t in zip(tokenizer.encode(src_lines[: 4 * n]), tokenizer.encode(tgt_lines[: 4 * n])):
        if len(s) + 1 <= SAMPLE_MAX_SOURCE_TOKENS and t:
            srcs.append(np.asarray(s + [EOS_ID], dtype=np.int64))
            tgts.append(t)
        if len(srcs) == n:
            break
    return srcs, tgts


def run(params: Params, layout: Layout, recorder: Recorder = NULL_RECORDER) -> dict[str, Any]:
    """Build, evaluate and gate every ``params.quantize.variants``; record params, metrics, statuses and
    reports into ``recorder``; returns the per-variant summary."""
    q = params.quantize
    if q.gate_split not in params.data.test_splits:
        raise ValueError(f"quantize.gate_split={q.gate_split!r} is not one of data.test_splits "
                         f"{list(params.data.test_splits)}")
    t_start = time.perf_counter()
    st = _start(params, layout)
    _eager_reference(st)
    wanted = _wanted(q.variants)
    phases = len(wanted) + 3 + int(q.layer_attribution) + int(q.throughput)  # variants, parity, outliers, ..., serving
    # no ETA: the phases take from 0 s (a variant this host cannot run) to ~70 s (throughput), so a rate over
    # phases predicted 0:08 with 72 s left; the bar shows phase k of n and the time elapsed
    with recorder.start(RECORD) as tracker, Progress("quantize", phases, unit="phase", eta=False) as bar:
        tracker.log_params({f"quantize.{k}": v for k, v in q.model_dump(mode="json").items()})
        with atomic_dir(layout.quantized) as out:
            for name in wanted:
                _variant(st, name, out / name)
                bar.advance(1, f"{name}: {st.report['variants'].get(name, {}).get('status', '?')}")
            if CT2_REFERENCE in st.ct2:
                _parity(st)
            bar.advance(1, "parity")
            _outliers(st, out / "outliers")
            bar.advance(1, "outliers")
            if q.layer_attribution and CT2_REFERENCE in st.ct2:
                st.report["layer_attribution"] = _attribution(st)
            if q.layer_attribution:
                bar.advance(1, "layer attribution")
            wall: dict[str, Any] = {}  # wall-clock: quantize_throughput.json and MLflow, never a DVC out
            if q.throughput:
                wall["throughput"] = _throughput(st)
                bar.advance(1, "throughput")
            serving = _serving_default(st, out / "serving.json")
            atomic_write_json(out / "report.json", st.report)
            bar.advance(1, f"serving default: {serving}")

        wall["stage_seconds"] = round(time.perf_counter() - t_start, 1)
        wall["decode_seconds"] = {k: round(v, 2) for k, v in st.timings.items()}
        atomic_write_json(layout.quantize_metrics, st.metrics)
        atomic_write_json(layout.quantize_throughput, wall)

        tracker.log_metrics(_flat_metrics(st.metrics, wall), step=0)
        tracker.set_tags({"quantize.serving_default": str(serving)} |
                         {f"quantize.{n}.status": r["status"] for n, r in st.report["variants"].items()})
        tracker.log_artifacts(layout.quantized / "outliers", artifact_path="quantize/outliers")
        tracker.log_artifact(layout.quantized / "report.json", artifact_path="quantize")
        tracker.log_artifact(layout.quantize_metrics, artifact_path="quantize")
        tracker.log_artifact(layout.quantize_throughput, artifact_path="quantize")
    return {n: {"status": r["status"]} | ({"bleu_delta": r["scores"][q.gate_split]["bleu_delta"]} if "scores" in r else {})
            for n, r in st.report["variants"].items()} | {"serving_default": serving}


def _start(params: Params, layout: Layout) -> _Run:
    """The eager float model on CPU, the decoding options (the ``evaluate`` block), the encoded test
    sets and the report's fixed fields."""
    q, d = params.quantize, params.data
    bundle = ModelBundle.load(layout.model, device="cpu")
    eager = EagerDecoder(bundle.model)
    options = DecodeOptions.from_eval(params.evaluate)
    threads = q.num_threads or torch.get_num_threads()
    encoder = Translator(bundle.tokenizer, eager)
    tests = {}
    for split in d.test_splits:
        refs = read_lines(layout.prepared / f"{split}.{d.tgt_lang}")
        tests[split] = (encoder.encode(read_lines(layout.prepared / f"{split}.{d.src_lang}")), refs)
    report: dict[str, Any] = {"decode": options.__dict__ | {"threads": threads}, "gate": {
        "split": q.gate_split, "max_bleu_drop": q.max_bleu_drop}, "variants": {}}
    return _Run(params, layout, bundle.model, bundle.tokenizer, eager, options, threads, tests, report)


def _eager_reference(st: _Run) -> None:
    """Decode every test set with the eager float model (``threads`` torch threads): the reference of
    every variant's deltas, checked against the ``evaluate`` stage's scores."""
    with thread_count(st.threads):
        t0 = time.perf_counter()
        st.eager_out = {s: st.eager.translate_ids(srcs, st.options) for s, (srcs, _) in st.tests.items()}
        st.timings[EAGER] = time.perf_counter() - t0
    st.eager_scores = {s: _bleu_chrf(st.tokenizer, st.eager_out[s], st.tests[s][1]) for s in st.tests}
    st.metrics[EAGER] = dict(st.eager_scores) | {"bytes": (st.layout.model / "model.safetensors").stat().st_size}
    log.info("eager float: %s [%.1f s]", st.eager_scores, st.timings[EAGER])
    st.report["eager_vs_evaluate"] = _against_evaluate(st.layout.eval_metrics, st.eager_scores)


def _wanted(variants: tuple[str, ...]) -> list[str]:
    """``variants`` in order, with ``CT2_REFERENCE`` first when a CTranslate2 variant is asked for without it."""
    wanted = list(variants)
    if any(VARIANTS[v].library == "ctranslate2" for v in wanted) and CT2_REFERENCE not in wanted:
        wanted.insert(0, CT2_REFERENCE)
    return wanted


def _not_built(st: _Run, name: str, entry: dict[str, Any], status: str, reason: str) -> None:
    entry |= {"status": status, "reason": reason}
    st.report["variants"][name] = entry
    st.metrics[name] = {"status": status, "rejected": 0}


def _build(st: _Run, v: Variant, vdir: Path, entry: dict[str, Any]) -> CT2Decoder | EagerDecoder | None:
    """Build variant ``v`` into ``vdir`` and return its decoder; None (recorded as skipped or failed)
    when it cannot run here. A CPU CTranslate2 variant failing to build raises: that is our bug."""
    reason = unavailable_reason(v)
    if not reason and v.library == "ctranslate2":
        try:
            check_supported(st.model.cfg)  # e.g. rope/alibi/rmsnorm: no CTranslate2 mapping
        except UnsupportedModelError as err:
            reason = f"not convertible to CTranslate2: {err}"
    if reason:
        _not_built(st, v.name, entry, SKIPPED, reason)
        log.info("%s: skipped (%s)", v.name, reason)
        return None
    try:
        if v.library == "ctranslate2":
            build_ct2(v, st.model, st.tokenizer, vdir, st.layout.model / "spm.model")
            decoder = CT2Decoder(vdir, st.tokenizer, max_side_tokens=st.model.max_side_tokens, device=v.device,
                                 compute_type=v.compute_type, inter_threads=st.threads)
            st.ct2[v.name] = decoder
            return decoder
        return EagerDecoder(build_torchao(v, st.model, vdir, st.layout.model / "spm.model"))
    except Exception as err:  # noqa: BLE001 - a GPU library failing must not hide the CPU results
        if v.library == "ctranslate2" and v.device == "cpu":
            raise
        _not_built(st, v.name, entry, FAILED, f"{type(err).__name__}: {err}")
        log.warning("%s: failed to build: %s", v.name, err)
        return None


def _variant(st: _Run, name: str, vdir: Path) -> None:
    """Build variant ``name``, decode every test set with it, score it against the eager reference and
    gate it on ``quantize.gate_split``: ``vdir/variant.json`` and the variant's report and metrics
    entries. ``CT2_REFERENCE`` passes the teacher-forced score check first (``QuantizeError``)."""
    q = st.params.quantize
    entry: dict[str, Any] = VARIANTS[name].metadata()
    decoder = _build(st, VARIANTS[name], vdir, entry)
    if decoder is None:
        return
    if name == CT2_REFERENCE:
        _score_check(st, decoder)
    t0 = time.perf_counter()
    st.outputs[name] = {s: decoder.translate_ids(srcs, st.options) for s, (srcs, _) in st.tests.items()}
    st.timings[name] = time.perf_counter() - t0
    vm: dict[str, Any] = {}
    for s in st.tests:
        sc = _bleu_chrf(st.tokenizer, st.outputs[name][s], st.tests[s][1])
        vm[s] = sc | {"bleu_delta": round(sc["bleu"] - st.eager_scores[s]["bleu"], 4),
                      "chrf_delta": round(sc["chrf"] - st.eager_scores[s]["chrf"], 4)}
    bad = {s: degenerate_lines(st.outputs[name][s], st.eager_out[s]) for s in st.tests}
    status = gate(vm[q.gate_split]["bleu_delta"], q.max_bleu_drop)
    if isinstance(decoder, CT2Decoder) and decoder.compute_type.startswith("int8") and VARIANTS[name].device == "cpu":
        entry["int8_sums"] = _int8_sums_gate(st, name, decoder, vdir)
        if any(g.get("status") == REJECTED for g in entry["int8_sums"]["gated"].values()):
            status = REJECTED
    model_bytes = dir_bytes(vdir) - (vdir / "spm.model").stat().st_size
    vm |= {"status": status, "rejected": int(status != ACCEPTED), "bytes": model_bytes,
           "degenerate_lines": sum(len(b) for b in bad.values())}
    entry |= {"status": status, "bytes": model_bytes, "scores": {s: vm[s] for s in st.tests},
              "degenerate_lines": {s: b[:20] for s, b in bad.items()}}
    fault_point("quantize.variant_unrecorded")
    atomic_write_json(vdir / "variant.json", entry)
    st.report["variants"][name] = entry
    st.metrics[name] = vm
    log.info("%s: %s BLEU %s (delta %+.2f) %d bytes [%.1f s]", name, status, vm[q.gate_split]["bleu"],
             vm[q.gate_split]["bleu_delta"], model_bytes, st.timings[name])


def _int8_sums_gate(st: _Run, name: str, decoder: CT2Decoder, vdir: Path) -> dict[str, Any]:
    """The gate split decoded under BOTH ways an x86 CPU's CTranslate2 sums int8 products
    (``aiayn.quantize.int8``: exact with VNNI; int16-saturating with oneDNN on CPUs without VNNI, e.g.
    AMD Zen 2/3): this host's way is the stage's own decode; the other one runs in a subprocess set to
    compute it. The bundle may be served on either kind of host, so the variant passes only when it
    passes the gate both ways. Returns ``{"this_host": ..., "gated": {way: {bleu, bleu_delta, status} or
    {status: skipped, reason}}}``."""
    q = st.params.quantize
    host = int8_accumulation()
    srcs, refs = st.tests[q.gate_split]
    base = st.eager_scores[q.gate_split]["bleu"]
    gated: dict[str, Any] = {}
    for way in ACCUMULATIONS:
        if way == host["accumulation"]:
            ids = st.outputs[name][q.gate_split]
        else:
            ids, other = decode_under(way, vdir, srcs, st.options, max_side_tokens=st.model.max_side_tokens,
                                      compute_type=decoder.compute_type, inter_threads=st.threads)
            if ids is None:
                gated[way] = {"status": SKIPPED, "reason": f"this host cannot compute it ({other['why']})"}
                log.warning("int8 sums %s: not measurable here (%s)", way, other["why"])
                continue
        bleu = _bleu_chrf(st.tokenizer, ids, refs)["bleu"]
        delta = round(bleu - base, 4)
        gated[way] = {"bleu": bleu, "bleu_delta": delta, "status": gate(delta, q.max_bleu_drop)}
        log.info("int8 sums %s: BLEU %.2f (delta %+.2f) on %s", way, bleu, delta, q.gate_split)
    return {"this_host": host, "gated": gated}


def _outliers(st: _Run, out_dir: Path) -> None:
    """Per-channel activation statistics of the eager model on ``quantize.calibration_sentences`` train
    pairs: the outlier report in ``out_dir`` and its summary in the report and metrics."""
    q, d = st.params.quantize, st.params.data
    calib = _pairs(st.tokenizer, read_lines(st.layout.prepared / f"{d.train_split}.{d.src_lang}"),
                   read_lines(st.layout.prepared / f"{d.train_split}.{d.tgt_lang}"), q.calibration_sentences)
    with thread_count(st.threads):
        stats = activation_stats(st.model, *calib, factor=q.outlier_factor)
    write_report(stats, out_dir, factor=q.outlier_factor)
    st.report["outliers"] = {s.layer: {"outlier_channels": s.outlier_channels, "top_ratio": round(s.top_ratio, 3)}
                             for s in stats}
    st.metrics["outlier_channels"] = sum(s.outlier_channels for s in stats)


def _serving_default(st: _Run, path: Path) -> str | None:
    """The first accepted variant of ``quantize.serving_preference`` (None: the eager model ships),
    written to ``path`` (``serving.json``) and into the report and metrics."""
    q = st.params.quantize
    serving = next((n for n in q.serving_preference
                    if st.report["variants"].get(n, {}).get("status") == ACCEPTED), None)
    st.report["serving_default"] = serving
    st.metrics["serving_default"] = serving
    atomic_write_json(path, {"variant": serving, "why": "first accepted variant of "
                                                        f"quantize.serving_preference {list(q.serving_preference)}"})
    return serving


def _flat_metrics(metrics: dict[str, Any], wall: dict[str, Any]) -> dict[str, float]:
    """``metrics`` and the throughput numbers as flat ``{variant.key[.subkey]: number}`` for the tracker."""
    flat = {"stage_seconds": wall["stage_seconds"]}
    for name, vm in [*metrics.items(), *wall.get("throughput", {}).items()]:
        if isinstance(vm, dict):
            for k, val in vm.items():
                if isinstance(val, dict):
                    flat |= {f"{name}.{k}.{kk}": vv for kk, vv in val.items() if isinstance(vv, (int, float))}
                elif isinstance(val, (int, float)):
                    flat[f"{name}.{k}"] = val
    return flat


def _against_evaluate(path: Path, eager_scores: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The eager reference decoded here vs. the ``evaluate`` stage's scores (``artifacts/eval_metrics.json``):
    the same model and decoding options must give the same BLEU/chrF, so every delta in this stage is
    measured from the numbers users see. A difference is logged as a warning and recorded, not raised
    (batch composition may differ from evaluate's, which can flip a near-tie)."""
    if not path.is_file():
        return {"checked": False, "reason": f"{path.name} not found (run the evaluate stage first)"}
    import json

    theirs = json.loads(path.read_text(encoding="utf-8"))
    out: dict[str, Any] = {"checked": True, "splits": {}}
    for split, ours in eager_scores.items():
        ev = theirs.get(split)
        if ev is None:
            out["splits"][split] = {"evaluate": None, "quantize": ours}
            continue
        same = all(abs(float(ev[k]) - ours[k]) < 1e-3 for k in ("bleu", "chrf"))
        out["splits"][split] = {"evaluate": {k: ev[k] for k in ("bleu", "chrf")}, "quantize": ours, "equal": same}
        if not same:
            log.warning("eager reference differs from the evaluate stage on %s: %s vs %s", split, ours, ev)
    out["equal"] = all(v.get("equal", False) for v in out["splits"].values())
    return out


def _score_check(st: _Run, ct2: CT2Decoder) -> None:
    """Teacher-forced log-probs, CTranslate2 (``ct2``: ``CT2_REFERENCE``) vs. eager, per token on a
    valid-split slice, into the report; raises ``QuantizeError`` over ``quantize.score_tolerance``."""
    d, q = st.params.data, st.params.quantize
    srcs, tgts = _pairs(st.tokenizer, read_lines(st.layout.prepared / f"{d.valid_split}.{d.src_lang}"),
                        read_lines(st.layout.prepared / f"{d.valid_split}.{d.tgt_lang}"), q.score_check_sentences)
    ours = st.eager.score_ids(srcs, tgts)
    theirs = ct2.score_ids(srcs, tgts)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs))
    st.report["score_check"] = {"sentences": len(srcs), "max_abs_diff": diff, "tolerance": q.score_tolerance,
                                "passed": diff <= q.score_tolerance}
    if not st.report["score_check"]["passed"]:
        raise QuantizeError(
            f"{CT2_REFERENCE} teacher-forced log-probs differ from the eager model's by {diff:.3g} > "
            f"quantize.score_tolerance={q.score_tolerance}: the conversion is wrong (position table order? "
            "pre/post-norm mapping?)"
        )


def _parity(st: _Run) -> None:
    """``CT2_REFERENCE`` vs. eager on ``quantize.gate_split``, into the report and metrics: greedy
    token-for-token agreement (mismatches with the log-prob gap under the eager model) and beam
    agreement with our GNMT re-ranking."""
    q = st.params.quantize
    sources, ct2 = st.tests[q.gate_split][0], st.ct2[CT2_REFERENCE]
    greedy = replace(st.options, beam_size=1)
    ours = st.eager.translate_ids(sources, greedy)
    theirs = ct2.translate_ids(sources, greedy)
    diff = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    mism = []
    for i in diff[:20]:
        lp_ours, lp_theirs = (float(x.sum()) for x in st.eager.score_ids([sources[i]] * 2, [ours[i], theirs[i]]))
        mism.append({"line": i + 1, "logprob_gap": round(lp_ours - lp_theirs, 6),
                     "eager": st.tokenizer.decode([ours[i]])[0], "ct2": st.tokenizer.decode([theirs[i]])[0]})
    agree = 1 - len(diff) / len(sources)
    eager_beam, ct2_beam = st.eager_out[q.gate_split], st.outputs[CT2_REFERENCE][q.gate_split]
    beam_agree = sum(a == b for a, b in zip(eager_beam, ct2_beam)) / len(sources)
    st.report["parity"] = {"greedy_agreement": round(agree, 5), "beam_agreement": round(beam_agree, 5),
                           "sentences": len(sources), "passed": agree >= q.parity_min_agreement,
                           "min_agreement": q.parity_min_agreement, "mismatches": mism}
    st.metrics["parity"] = {k: st.report["parity"][k] for k in ("greedy_agreement", "beam_agreement", "passed")}
    st.metrics["parity"]["passed"] = int(st.metrics["parity"]["passed"])


def _attribution(st: _Run) -> dict[str, Any]:
    """BLEU change of CTranslate2's int8 weight rounding applied to one layer type at a time (decoded by
    CTranslate2 in float32, so only that type's weights differ from ct2-float32), on the first
    ``quantize.attribution_sentences`` gate-split sentences; ``all`` = every type at once (weights
    only: the rest of the real int8 loss comes from int8 activations)."""
    split, n = st.params.quantize.gate_split, st.params.quantize.attribution_sentences
    srcs, refs = st.tests[split][0][:n], st.tests[split][1][:n]
    ref_bleu = _bleu_chrf(st.tokenizer, st.outputs[CT2_REFERENCE][split][:n], refs)["bleu"]
    res: dict[str, Any] = {"sentences": len(srcs), f"{CT2_REFERENCE}_bleu": ref_bleu}
    if "ct2-int8" in st.outputs:
        int8_bleu = _bleu_chrf(st.tokenizer, st.outputs["ct2-int8"][split][:n], refs)["bleu"]
        res["ct2-int8_bleu_delta"] = round(int8_bleu - ref_bleu, 4)
    with tempfile.TemporaryDirectory() as tmp:
        for lt in (*LAYER_TYPES, "all"):
            fq = with_fake_int8(st.model, LAYER_TYPES if lt == "all" else (lt,))
            AiaynConverter(fq, st.tokenizer).convert(str(Path(tmp) / lt), quantization="float32", force=True)
            ct2 = CT2Decoder(Path(tmp) / lt, st.tokenizer, max_side_tokens=st.model.max_side_tokens,
                             inter_threads=st.threads)
            bleu = _bleu_chrf(st.tokenizer, ct2.translate_ids(srcs, st.options), refs)["bleu"]
            res[lt] = {"bleu": bleu, "bleu_delta": round(bleu - ref_bleu, 4)}
    return res


def _throughput(st: _Run) -> dict[str, Any]:
    """Sentences/s and target tokens/s at batch 1 and 32 for each thread count: eager and every CPU
    CTranslate2 variant on the same gate-split slices, ``THROUGHPUT_ROUNDS`` alternating rounds (eager,
    then each variant, then again), each number the median with its min-max; ``speedup_vs_eager`` is
    the median of the per-round ratios (same round, same sentences) with its min-max.

    Thread policy at ``t`` threads: eager = ``torch.set_num_threads(t)``; CTranslate2 batch 1 (latency:
    one sentence at a time) = one worker with ``intra_threads=t``; batch 32 (throughput) = ``t``
    workers with ``intra_threads=1`` (``inter_threads=t``), CTranslate2's documented throughput setup."""
    q, options, sources = st.params.quantize, st.options, st.tests[st.params.quantize.gate_split][0]
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    ct2: dict[tuple[str, int, int], CT2Decoder] = {}
    for _ in range(THROUGHPUT_ROUNDS):
        for threads in q.throughput_threads:
            for batch, n in ((1, q.throughput_batch1_sentences), (32, q.throughput_batch32_sentences)):
                key, srcs = f"b{batch}_t{threads}", sources[:n]
                with thread_count(threads):
                    runs.setdefault((EAGER, key), []).append(
                        measure(lambda s, b=batch: st.eager.translate_ids(s, options, batch_size=b), srcs))
                for name, dec in st.ct2.items():
                    if dec.translator.device != "cpu":
                        continue
                    if (name, threads, batch) not in ct2:
                        inter, intra = (1, threads) if batch == 1 else (threads, 1)
                        ct2[name, threads, batch] = CT2Decoder(
                            dec.model_dir, dec.tokenizer, max_side_tokens=dec.max_side_tokens,
                            compute_type=dec.compute_type, intra_threads=intra, inter_threads=inter)
                    ct = ct2[name, threads, batch]
                    runs.setdefault((name, key), []).append(
                        measure(lambda s, ct=ct, b=batch: ct.translate_ids(s, options, batch_size=b), srcs))
    return _throughput_summary(runs)


def _throughput_summary(runs: dict[tuple[str, str], list[dict[str, float]]]) -> dict[str, Any]:
    """``{variant: {b{batch}_t{threads}: median, min, max (and speedup vs eager)}}`` from ``_throughput``'s rounds."""
    out: dict[str, Any] = {}
    for (name, key), ms in runs.items():
        entry: dict[str, Any] = {"rounds": len(ms)}
        for k in ("sentences_per_s", "tokens_per_s"):
            vals = [m[k] for m in ms]
            entry |= {k: round(float(np.median(vals)), 2), f"{k}_min": round(min(vals), 2), f"{k}_max": round(max(vals), 2)}
        if name != EAGER:
            ratios = [m["sentences_per_s"] / e["sentences_per_s"] for m, e in zip(ms, runs[EAGER, key])]
            threads, batch = int(key.split("_t")[1]), int(key[1:].split("_")[0])
            entry |= {"speedup_vs_eager": round(float(np.median(ratios)), 3), "speedup_min": round(min(ratios), 3),
                      "speedup_max": round(max(ratios), 3),
                      "ct2_inter_threads": 1 if batch == 1 else threads, "ct2_intra_threads": threads if batch == 1 else 1}
        out.setdefault(name, {})[key] = entry
    return out
