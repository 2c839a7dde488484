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
CTranslate2 variants of a model the converter cannot map (``check_supported``: e.g. rotary positions).
Raises ``QuantizeError`` when the ct2-float32 conversion does not reproduce the eager model's
teacher-forced scores (``quantize.score_tolerance``): that is a converter bug, not a quality issue.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aiayn.config import Params
from aiayn.corpus import read_lines
from aiayn.io import atomic_dir, atomic_write_json
from aiayn.quantize.checks import ACCEPTED, FAILED, SKIPPED, degenerate_lines, gate
from aiayn.quantize.converter import AiaynConverter, UnsupportedModelError, check_supported, load_bundle
from aiayn.quantize.ct2_translate import CT2Translator
from aiayn.quantize.eager import eager_logprobs, eager_translate_ids
from aiayn.quantize.fake_quant import LAYER_TYPES, with_fake_int8
from aiayn.quantize.outliers import activation_stats, write_report
from aiayn.quantize.throughput import measure, thread_count
from aiayn.quantize.variants import VARIANTS, build_ct2, build_torchao, dir_bytes, unavailable_reason
from aiayn.recording import NULL_RECORDER, Recorder, StageRecord
from aiayn.scoring import score
from aiayn.stages import Layout
from aiayn.translate import MAX_INPUT_TOKENS, DecodeOptions, Translator

__all__ = ["run", "QuantizeError", "RECORD"]

log = logging.getLogger("aiayn")

EAGER = "eager-float32"

#: How a quantize run is recorded: a variant's BLEU is not the pipeline run's headline (evaluate's is).
RECORD = StageRecord("quantize")

#: Alternating measurement rounds of ``_throughput`` (median and min-max reported).
THROUGHPUT_ROUNDS = 3


class QuantizeError(RuntimeError):
    """The conversion is wrong (teacher-forced scores differ from the eager model's)."""


def _bleu_chrf(tokenizer, outs: list[list[int]], refs: list[str]) -> dict[str, float]:
    r = score(tokenizer.decode(outs), refs)
    return {"bleu": round(float(r["bleu"]), 4), "chrf": round(float(r["chrf"]), 4)}


def _pairs(tokenizer, src_lines: list[str], tgt_lines: list[str], n: int) -> tuple[list[np.ndarray], list[list[int]]]:
    """The first ``n`` pairs whose source fits ``MAX_INPUT_TOKENS``: (sources with EOS, target ids)."""
    srcs, tgts = [], []
    for s, t in zip(tokenizer.encode(src_lines[: 4 * n]), tokenizer.encode(tgt_lines[: 4 * n])):
        if len(s) + 1 <= MAX_INPUT_TOKENS and t:
            srcs.append(np.asarray(s + [3], dtype=np.int64))
            tgts.append(t)
        if len(srcs) == n:
            break
    return srcs, tgts


def run(params: Params, layout: Layout, recorder: Recorder = NULL_RECORDER) -> dict[str, Any]:
    """Build, evaluate and gate every ``params.quantize.variants``; record params, metrics, statuses and
    reports into ``recorder``; returns the per-variant summary."""
    q, d, e = params.quantize, params.data, params.evaluate
    if q.gate_split not in d.test_splits:
        raise ValueError(f"quantize.gate_split={q.gate_split!r} is not one of data.test_splits {list(d.test_splits)}")
    model, tokenizer, _meta = load_bundle(layout.model)
    max_pos = model.cfg.max_positions
    encoder = Translator(model, tokenizer)
    options = DecodeOptions(beam_size=e.beam_size, len_penalty=e.len_penalty, max_len_a=e.max_len_a,
                            max_len_b=e.max_len_b, max_tokens=e.max_tokens)
    greedy = replace(options, beam_size=1)
    threads = q.num_threads or torch.get_num_threads()
    t_start = time.perf_counter()

    tests = {}
    for split in d.test_splits:
        refs = read_lines(layout.prepared / f"{split}.{d.tgt_lang}")
        tests[split] = (encoder.encode(read_lines(layout.prepared / f"{split}.{d.src_lang}")), refs)

    report: dict[str, Any] = {"decode": options.__dict__ | {"threads": threads}, "gate": {
        "split": q.gate_split, "max_bleu_drop": q.max_bleu_drop}, "variants": {}}
    metrics: dict[str, Any] = {}
    timings: dict[str, float] = {}

    # ---------------------------------------------------------------- eager float reference
    with thread_count(threads):
        t0 = time.perf_counter()
        eager_out = {s: eager_translate_ids(model, srcs, options) for s, (srcs, _) in tests.items()}
        timings[EAGER] = time.perf_counter() - t0
    eager_scores = {s: _bleu_chrf(tokenizer, eager_out[s], tests[s][1]) for s in tests}
    metrics[EAGER] = {s: v for s, v in eager_scores.items()} | {"bytes": (layout.model / "model.safetensors").stat().st_size}
    log.info("eager float: %s [%.1f s]", eager_scores, timings[EAGER])
    report["eager_vs_evaluate"] = _against_evaluate(layout.eval_metrics, eager_scores)

    wanted = list(q.variants)
    if any(VARIANTS[v].library == "ctranslate2" for v in wanted) and "ct2-float32" not in wanted:
        wanted.insert(0, "ct2-float32")  # the parity reference of every CTranslate2 variant

    translators: dict[str, CT2Translator] = {}
    outputs: dict[str, dict[str, list[list[int]]]] = {}
    with recorder.start(RECORD) as tracker:
        tracker.log_params({f"quantize.{k}": v for k, v in q.model_dump(mode="json").items()})
        with atomic_dir(layout.quantized) as out:
            for name in wanted:
                v = VARIANTS[name]
                entry: dict[str, Any] = v.metadata()
                reason = unavailable_reason(v)
                if not reason and v.library == "ctranslate2":
                    try:
                        check_supported(model.cfg)  # e.g. rope/alibi/rmsnorm: no CTranslate2 mapping
                    except UnsupportedModelError as err:
                        reason = f"not convertible to CTranslate2: {err}"
                if reason:
                    entry |= {"status": SKIPPED, "reason": reason}
                    report["variants"][name] = entry
                    metrics[name] = {"status": SKIPPED, "rejected": 0}
                    log.info("%s: skipped (%s)", name, reason)
                    continue
                vdir = out / name
                try:
                    if v.library == "ctranslate2":
                        build_ct2(v, model, tokenizer, vdir, layout.model / "spm.model")
                        tr = CT2Translator(vdir, tokenizer, max_positions=max_pos, device=v.device,
                                           compute_type=v.compute_type, inter_threads=threads)
                        translators[name] = tr
                        decode = lambda srcs, o=options, tr=tr: tr.translate_ids(srcs, o)  # noqa: E731
                    else:
                        qm = build_torchao(v, model, vdir, layout.model / "spm.model")
                        decode = lambda srcs, o=options, qm=qm: eager_translate_ids(qm, srcs, o)  # noqa: E731
                except Exception as err:  # noqa: BLE001 - a GPU library failing must not hide the CPU results
                    if v.library == "ctranslate2" and v.device == "cpu":
                        raise
                    entry |= {"status": FAILED, "reason": f"{type(err).__name__}: {err}"}
                    report["variants"][name] = entry
                    metrics[name] = {"status": FAILED, "rejected": 0}
                    log.warning("%s: failed to build: %s", name, err)
                    continue

                if name == "ct2-float32":
                    report["score_check"] = _score_check(params, layout, model, tokenizer, tr)
                    if not report["score_check"]["passed"]:
                        raise QuantizeError(
                            f"ct2-float32 teacher-forced log-probs differ from the eager model's by "
                            f"{report['score_check']['max_abs_diff']:.3g} > quantize.score_tolerance={q.score_tolerance}: "
                            "the conversion is wrong (position table order? pre/post-norm mapping?)"
                        )
                t0 = time.perf_counter()
                outputs[name] = {s: decode(srcs) for s, (srcs, _) in tests.items()}
                timings[name] = time.perf_counter() - t0
                vm: dict[str, Any] = {}
                for s in tests:
                    sc = _bleu_chrf(tokenizer, outputs[name][s], tests[s][1])
                    vm[s] = sc | {"bleu_delta": round(sc["bleu"] - eager_scores[s]["bleu"], 4),
                                  "chrf_delta": round(sc["chrf"] - eager_scores[s]["chrf"], 4)}
                bad = {s: degenerate_lines(outputs[name][s], eager_out[s]) for s in tests}
                status = gate(vm[q.gate_split]["bleu_delta"], q.max_bleu_drop)
                model_bytes = dir_bytes(vdir) - (vdir / "spm.model").stat().st_size
                vm |= {"status": status, "rejected": int(status != ACCEPTED), "bytes": model_bytes,
                       "degenerate_lines": sum(len(b) for b in bad.values())}
                entry |= {"status": status, "bytes": model_bytes, "scores": {s: vm[s] for s in tests},
                          "degenerate_lines": {s: b[:20] for s, b in bad.items()}}
                atomic_write_json(vdir / "variant.json", entry)
                report["variants"][name] = entry
                metrics[name] = vm
                log.info("%s: %s BLEU %s (delta %+.2f) %d bytes [%.1f s]", name, status, vm[q.gate_split]["bleu"],
                         vm[q.gate_split]["bleu_delta"], model_bytes, timings[name])

            if "ct2-float32" in translators:
                report["parity"] = _parity(model, tokenizer, translators["ct2-float32"], tests[q.gate_split][0],
                                           greedy, q.parity_min_agreement, eager_out[q.gate_split],
                                           outputs["ct2-float32"][q.gate_split])
                metrics["parity"] = {k: report["parity"][k] for k in ("greedy_agreement", "beam_agreement", "passed")}
                metrics["parity"]["passed"] = int(metrics["parity"]["passed"])

            calib = _pairs(tokenizer, read_lines(layout.prepared / f"{d.train_split}.{d.src_lang}"),
                           read_lines(layout.prepared / f"{d.train_split}.{d.tgt_lang}"), q.calibration_sentences)
            with thread_count(threads):
                stats = activation_stats(model, *calib, factor=q.outlier_factor)
            write_report(stats, out / "outliers", factor=q.outlier_factor)
            report["outliers"] = {s.layer: {"outlier_channels": s.outlier_channels, "top_ratio": round(s.top_ratio, 3)}
                                  for s in stats}
            metrics["outlier_channels"] = sum(s.outlier_channels for s in stats)

            if q.layer_attribution and "ct2-float32" in translators:
                report["layer_attribution"] = _attribution(model, tokenizer, q.gate_split, tests[q.gate_split], options, threads,
                                                           q.attribution_sentences, outputs)

            wall: dict[str, Any] = {}  # wall-clock: quantize_throughput.json and MLflow, never a DVC out
            if q.throughput:
                wall["throughput"] = _throughput(model, translators, tests[q.gate_split][0], options, q)

            serving = next((n for n in q.serving_preference
                            if report["variants"].get(n, {}).get("status") == ACCEPTED), None)
            report["serving_default"] = serving
            metrics["serving_default"] = serving
            atomic_write_json(out / "serving.json", {"variant": serving, "why": "first accepted variant of "
                                                     f"quantize.serving_preference {list(q.serving_preference)}"})
            atomic_write_json(out / "report.json", report)

        wall["stage_seconds"] = round(time.perf_counter() - t_start, 1)
        wall["decode_seconds"] = {k: round(v, 2) for k, v in timings.items()}
        atomic_write_json(layout.quantize_metrics, metrics)
        atomic_write_json(layout.quantize_throughput, wall)

        flat = {"stage_seconds": wall["stage_seconds"]}
        for name, vm in [*metrics.items(), *wall.get("throughput", {}).items()]:
            if isinstance(vm, dict):
                for k, val in vm.items():
                    if isinstance(val, dict):
                        flat |= {f"{name}.{k}.{kk}": vv for kk, vv in val.items() if isinstance(vv, (int, float))}
                    elif isinstance(val, (int, float)):
                        flat[f"{name}.{k}"] = val
        tracker.log_metrics(flat, step=0)
        tracker.set_tags({"quantize.serving_default": str(serving)} |
                         {f"quantize.{n}.status": r["status"] for n, r in report["variants"].items()})
        tracker.log_artifacts(layout.quantized / "outliers", artifact_path="quantize/outliers")
        tracker.log_artifact(layout.quantized / "report.json", artifact_path="quantize")
        tracker.log_artifact(layout.quantize_metrics, artifact_path="quantize")
        tracker.log_artifact(layout.quantize_throughput, artifact_path="quantize")
    return {n: {"status": r["status"]} | ({"bleu_delta": r["scores"][q.gate_split]["bleu_delta"]} if "scores" in r else {})
            for n, r in report["variants"].items()} | {"serving_default": serving}


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


def _score_check(params: Params, layout: Layout, model, tokenizer, tr: CT2Translator) -> dict[str, Any]:
    """Teacher-forced log-probs, CTranslate2 vs. eager, per token on a valid-split slice."""
    d, q = params.data, params.quantize
    srcs, tgts = _pairs(tokenizer, read_lines(layout.prepared / f"{d.valid_split}.{d.src_lang}"),
                        read_lines(layout.prepared / f"{d.valid_split}.{d.tgt_lang}"), q.score_check_sentences)
    ours = eager_logprobs(model, srcs, tgts)
    theirs = tr.score_ids(srcs, tgts)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(ours, theirs))
    return {"sentences": len(srcs), "max_abs_diff": diff, "tolerance": q.score_tolerance, "passed": diff <= q.score_tolerance}


def _parity(model, tokenizer, tr, sources, greedy, min_agreement, eager_beam, ct2_beam) -> dict[str, Any]:
    """ct2-float32 vs. eager: greedy token-for-token agreement (mismatches with the log-prob gap under
    the eager model) and beam agreement with our GNMT re-ranking."""
    ours = eager_translate_ids(model, sources, greedy)
    theirs = tr.translate_ids(sources, greedy)
    diff = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    mism = []
    for i in diff[:20]:
        lp_ours, lp_theirs = (float(x.sum()) for x in eager_logprobs(model, [sources[i]] * 2, [ours[i], theirs[i]]))
        mism.append({"line": i + 1, "logprob_gap": round(lp_ours - lp_theirs, 6),
                     "eager": tokenizer.decode([ours[i]])[0], "ct2": tokenizer.decode([theirs[i]])[0]})
    agree = 1 - len(diff) / len(sources)
    beam_agree = sum(a == b for a, b in zip(eager_beam, ct2_beam)) / len(sources)
    return {"greedy_agreement": round(agree, 5), "beam_agreement": round(beam_agree, 5), "sentences": len(sources),
            "passed": agree >= min_agreement, "min_agreement": min_agreement, "mismatches": mism}


def _attribution(model, tokenizer, split, test, options, threads, n, outputs) -> dict[str, Any]:
    """BLEU change of CTranslate2's int8 weight rounding applied to one layer type at a time (decoded by
    CTranslate2 in float32, so only that type's weights differ from ct2-float32), on the first ``n``
    gate-split sentences; ``all`` = every type at once (weights only: the rest of the real int8 loss
    comes from int8 activations)."""
    srcs, refs = test[0][:n], test[1][:n]
    ref_bleu = _bleu_chrf(tokenizer, outputs["ct2-float32"][split][:n], refs)["bleu"]
    res: dict[str, Any] = {"sentences": len(srcs), "ct2-float32_bleu": ref_bleu}
    if "ct2-int8" in outputs:
        res["ct2-int8_bleu_delta"] = round(_bleu_chrf(tokenizer, outputs["ct2-int8"][split][:n], refs)["bleu"] - ref_bleu, 4)
    with tempfile.TemporaryDirectory() as tmp:
        for lt in (*LAYER_TYPES, "all"):
            fq = with_fake_int8(model, LAYER_TYPES if lt == "all" else (lt,))
            AiaynConverter(fq, tokenizer).convert(str(Path(tmp) / lt), quantization="float32", force=True)
            tr = CT2Translator(Path(tmp) / lt, tokenizer, max_positions=model.cfg.max_positions, inter_threads=threads)
            bleu = _bleu_chrf(tokenizer, tr.translate_ids(srcs, options), refs)["bleu"]
            res[lt] = {"bleu": bleu, "bleu_delta": round(bleu - ref_bleu, 4)}
    return res


def _throughput(model, translators, sources, options, q) -> dict[str, Any]:
    """Sentences/s and target tokens/s at batch 1 and 32 for each thread count: eager and every CPU
    CTranslate2 variant on the same slices, ``THROUGHPUT_ROUNDS`` alternating rounds (eager, then each
    variant, then again), each number the median with its min-max; ``speedup_vs_eager`` is the median
    of the per-round ratios (same round, same sentences) with its min-max.

    Thread policy at ``t`` threads: eager = ``torch.set_num_threads(t)``; CTranslate2 batch 1 (latency:
    one sentence at a time) = one worker with ``intra_threads=t``; batch 32 (throughput) = ``t``
    workers with ``intra_threads=1`` (``inter_threads=t``), CTranslate2's documented throughput setup."""
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    ct2: dict[tuple[str, int, int], CT2Translator] = {}
    for _ in range(THROUGHPUT_ROUNDS):
        for threads in q.throughput_threads:
            for batch, n in ((1, q.throughput_batch1_sentences), (32, q.throughput_batch32_sentences)):
                key, srcs = f"b{batch}_t{threads}", sources[:n]
                with thread_count(threads):
                    runs.setdefault((EAGER, key), []).append(
                        measure(lambda s, b=batch: eager_translate_ids(model, s, options, batch_size=b), srcs))
                for name, tr in translators.items():
                    if tr.translator.device != "cpu":
                        continue
                    if (name, threads, batch) not in ct2:
                        inter, intra = (1, threads) if batch == 1 else (threads, 1)
                        ct2[name, threads, batch] = CT2Translator(
                            tr.model_dir, tr.tokenizer, max_positions=tr.max_positions, compute_type=tr.compute_type,
                            intra_threads=intra, inter_threads=inter)
                    ct = ct2[name, threads, batch]
                    runs.setdefault((name, key), []).append(
                        measure(lambda s, ct=ct, b=batch: ct.translate_ids(s, options, batch_size=b), srcs))
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
