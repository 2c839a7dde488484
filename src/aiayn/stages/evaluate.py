"""``evaluate`` stage: translate the test sets with beam search and score them with sacreBLEU.

Outputs (``artifacts/eval``): ``{split}.hyp.{tgt_lang}`` (one detokenized
hypothesis per line) and ``scores.json`` (scores with their sacreBLEU signatures
and the decoding options); ``artifacts/eval_metrics.json`` holds the numbers
only (``{split: {bleu, chrf, bleu_lc_tok}}``, plus ``bleu_moses_lc_tok`` with ``evaluate.moses_bleu``:
``aiayn.evaluation.moses_bleu``) for ``dvc metrics show``; ``artifacts/plots/test_scores.json`` the same
BLEU/chrF as rows for ``dvc plots show``. Both are deterministic
bytes for a fixed model and params (two runs give the same ``dvc.lock`` hashes): wall-clock decode
seconds go to the log and the tracker only.

Output signals (``aiayn.quality.signals``, as the service logs them per answer): every answer's signals are
computed from the same hypotheses (``Decoder.translate_hyps``, whose 1-best is the translation: the hypothesis
files do not change). Per split, ``eval_metrics.json`` gains ``signal_mean`` (each signal's mean over the
answers where it has a value) and the tracker ``{split}.signal_mean.{signal}``. When the drift monitor's
output reference (``OUTPUT_REFERENCE``) exists and was built for this model (its ``reference.json`` names
this ``model.safetensors``' SHA-256), the tracker also gets ``{split}.flagged_share.{signal}`` and
``{split}.flagged_share.any``: the share of the split's answers its calibrated thresholds flag
(``aiayn.quality.calibration.flags``). Those shares go to the tracker only: the reference is a later
stage's output, so a DVC output of this stage cannot depend on it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from aiayn.config.schema import Params
from aiayn.data.readers import read_lines
from aiayn.inference.runtimes import DecodeOptions
from aiayn.faults import fault_point
from aiayn.io import atomic_dir, atomic_write_json, atomic_write_text, sha256_file
from aiayn.evaluation.moses_bleu import score_moses, tok_reference
from aiayn.progress import Progress
from aiayn.quality.calibration import OUTPUT_REFERENCE_PATH as OUTPUT_REFERENCE
from aiayn.quality.calibration import flags
from aiayn.quality.signals import SIGNALS, LanguageScorer, line_signals
from aiayn.recording import NULL_RECORDER, Recorder, StageRecord
from aiayn.evaluation.scoring import bleu_tokenizer, score
from aiayn.stages import Layout, split_reads
from aiayn.inference.translator import Translator

__all__ = ["run", "RECORD", "decode_split", "decode_split_signals", "score_split", "signal_summary",
           "OUTPUT_REFERENCE"]

log = logging.getLogger("aiayn")

#: How an evaluate run is recorded: BLEU and chrF per test set are the pipeline run's headline; it
#: reads the test splits (added by ``run``).
RECORD = StageRecord("evaluate", headline_metrics=r"^[\w-]+\.(bleu|chrf|bleu_moses_lc_tok)$")


def run(params: Params, layout: Layout, recorder: Recorder = NULL_RECORDER) -> dict[str, Any]:
    """Translate every ``params.data.test_splits`` source file and score it against its reference; record
    the scores, their signatures and the outputs into ``recorder``.

    Decodes on ``params.evaluate.device``; an over-long source line follows
    ``params.evaluate.long_policy`` (default ``error``: a benchmark never changes silently).
    Returns ``{split: {bleu, chrf, bleu_lc_tok, ...}}``. Raises
    ``FileNotFoundError`` if the model bundle or a prepared split is missing,
    ``aiayn.inference.translator.InputError`` (a ``ValueError``) for an over-long line under ``error``, and
    ``aiayn.evaluation.scoring.ScoringError`` if output still holds subword markers or the target language's BLEU
    tokenizer (``aiayn.evaluation.scoring.bleu_tokenizer``) is not available.
    """
    d, e = params.data, params.evaluate
    bleu_tokenizer(d.tgt_lang, e.bleu_tokenize)  # before decoding: a missing tokenizer fails fast
    translator = Translator.from_dir(layout.model, device=e.device)
    options = DecodeOptions.from_eval(e)
    metrics: dict[str, dict[str, Any]] = {}
    language, thresholds = LanguageScorer(), _output_thresholds(layout)
    scores: dict[str, Any] = {"decode": asdict(options) | {"long_policy": e.long_policy}, "device": str(translator.device),
                              "src_lang": d.src_lang, "tgt_lang": d.tgt_lang}
    record = RECORD.reading(*split_reads(layout, d.test_splits, (d.src_lang, d.tgt_lang), "test"))
    texts = {split: (read_lines(layout.prepared / f"{split}.{d.src_lang}"),
                     read_lines(layout.prepared / f"{split}.{d.tgt_lang}")) for split in d.test_splits}
    with recorder.start(record) as tracker, Progress("evaluate", sum(len(s) for s, _ in texts.values()),
                                                     every=250, unit="sentence") as bar:
        with atomic_dir(layout.eval) as out:
            for step, split in enumerate(d.test_splits):
                sources, references = texts[split]
                t0 = time.perf_counter()
                hyps, signals = decode_split_signals(translator, sources, options, e.long_policy, target_lang=d.tgt_lang,
                                                     language=language, progress=lambda n, s=split: bar.advance(n, s))
                seconds = time.perf_counter() - t0
                atomic_write_text(out / f"{split}.hyp.{d.tgt_lang}", "".join(h + "\n" for h in hyps))
                result = score_split(params, layout, split, hyps, references)
                names = ("bleu", "chrf", "bleu_lc_tok") + (("bleu_moses_lc_tok",) if e.moses_bleu else ())
                metrics[split] = {k: round(float(result[k]), 4) for k in names}
                scores[split] = result
                log.info("%s: BLEU %.2f chrF %.2f (%s) [%.1f s]", split, result["bleu"], result["chrf"],
                         result["bleu_signature"], seconds)
                tracker.log_metrics({f"{split}.{k}": v for k, v in metrics[split].items()}
                                    | {f"{split}.decode_seconds": seconds}, step=step)
                quality = signal_summary(signals, thresholds)
                metrics[split]["signal_mean"] = quality["signal_mean"]
                tracker.log_metrics({f"{split}.{kind}.{k}": v for kind in ("signal_mean", "flagged_share")
                                     for k, v in quality.get(kind, {}).items()}, step=step)
                tracker.set_tags({f"{split}.bleu_signature": result["bleu_signature"],
                                  f"{split}.chrf_signature": result["chrf_signature"]})
            atomic_write_json(out / "scores.json", scores)
        atomic_write_json(layout.eval_metrics, metrics)
        fault_point("evaluate.metrics_written")
        layout.plots.mkdir(parents=True, exist_ok=True)
        atomic_write_json(layout.plots / "test_scores.json",
                          [{"test_set": s, "bleu": m["bleu"], "chrf": m["chrf"]} for s, m in metrics.items()])
        tracker.log_artifacts(layout.eval, artifact_path="eval")
        tracker.log_artifact(layout.eval_metrics, artifact_path="eval")
    return metrics


def decode_split(translator: Translator, sources: list[str], options: DecodeOptions, long_policy: str,
                 progress: Callable[[int], None] | None = None) -> list[str]:
    """Translate ``sources`` (detokenized text, one sentence each) as the evaluate stage does: one detokenized
    hypothesis per source, in order. ``long_policy``: ``evaluate.long_policy`` for a line longer than the
    model accepts; ``progress(n)`` is called after each batch of ``n`` sentences. Raises
    ``aiayn.inference.translator.InputError`` (a ``ValueError``) for an over-long line under ``error``."""
    prepared = translator.prepare(sources, options, long=long_policy)
    return [line for chunk in translator.translate_prepared(prepared, options, batch_progress=progress)
            for line in chunk]


def decode_split_signals(translator: Translator, sources: list[str], options: DecodeOptions, long_policy: str, *,
                         target_lang: str, language: LanguageScorer | None,
                         progress: Callable[[int], None] | None = None) -> tuple[list[str], list[dict | None]]:
    """``decode_split``'s hypotheses (the same lines: the 1-best of ``Decoder.translate_hyps`` is
    ``translate_ids``'s output) and, per source, its answer's output signals (``None`` for a blank line)."""
    prepared = translator.prepare(sources, options, long=long_policy)
    hyps = translator.decoder.translate_hyps(prepared.units, options, n_best=1, progress=progress)
    lines = translator.output_lines(prepared.spans, [h[0].tokens if h else [] for h in hyps])
    return lines, line_signals(prepared.spans, prepared.units, hyps, lines, scored=True, target_lang=target_lang,
                               language=language)


def _output_thresholds(layout: Layout) -> dict[str, Any] | None:
    """The output reference's thresholds when it was built for the model in ``layout.model``, else ``None``
    (a log line says why)."""
    import json

    path = layout.root / OUTPUT_REFERENCE
    if not path.is_file():
        return None
    try:
        built_for = json.loads((path.parent / "reference.json").read_text(encoding="utf-8")).get("model_sha256")
        thresholds = json.loads(path.read_text(encoding="utf-8"))["thresholds"]
    except (OSError, ValueError, KeyError) as e:
        log.warning("%s is unreadable (%s): no flagged shares", path, e)
        return None
    if built_for != sha256_file(layout.model / "model.safetensors"):
        log.info("%s was built for another model: no flagged shares (signal means only)", path)
        return None
    return thresholds


def signal_summary(signals: list[dict | None], thresholds: dict[str, Any] | None) -> dict[str, dict[str, float]]:
    """``{"signal_mean": {signal: mean}}`` over the answers (``signals``: per source, ``None`` for a blank line)
    where the signal has a value, rounded to 6 decimals; with ``thresholds`` (an output reference's) also
    ``"flagged_share"``: per calibrated signal, and ``any``, the share of the answers flagged."""
    answered = [s for s in signals if s is not None]
    out: dict[str, dict[str, float]] = {"signal_mean": {}}
    for name in SIGNALS:
        values = [float(s[name]) for s in answered if s.get(name) is not None]
        if values:
            out["signal_mean"][name] = round(sum(values) / len(values), 6)
    if thresholds is not None and answered:
        judged = [flags(s, thresholds) for s in answered]
        out["flagged_share"] = {name: round(sum(j[name] for j in judged) / len(judged), 6) for name in thresholds}
        out["flagged_share"]["any"] = round(sum(any(j.values()) for j in judged) / len(judged), 6)
    return out


def score_split(params: Params, layout: Layout, split: str, hyps: list[str], references: list[str]) -> dict[str, Any]:
    """The evaluate stage's scores of one test split: sacreBLEU BLEU/chrF/``bleu_lc_tok`` with their signatures
    (``aiayn.evaluation.scoring.score``, BLEU tokenized by ``evaluate.bleu_tokenize``), plus ``bleu_moses_lc_tok`` when
    ``evaluate.moses_bleu`` (``aiayn.evaluation.moses_bleu.score_moses`` against the dataset's ``lc.norm.tok``
    reference when ``aiayn fetch --tok-references`` brought it into ``data/multi30k/tok/``, else against
    ``references`` put through the same steps). Raises ``aiayn.evaluation.scoring.ScoringError`` as ``score`` does and
    ``ValueError`` when the numbers of lines differ."""
    d = params.data
    result = score(hyps, references, tokenize=bleu_tokenizer(d.tgt_lang, params.evaluate.bleu_tokenize))
    if params.evaluate.moses_bleu:
        ref = tok_reference(layout.raw, split, d.tgt_lang)
        tokenized = ref.read_text(encoding="utf-8").splitlines() if ref.exists() else None
        result |= score_moses(hyps, references, d.tgt_lang, tokenized_references=tokenized)
    return result
