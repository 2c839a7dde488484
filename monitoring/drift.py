"""The drift check: a window of production inputs against the training reference, with Evidently.

``check(sentences, reference, cfg, translator)`` describes the window as the reference was
described (``monitoring.descriptors``), then runs two Evidently reports against the reference:

- **descriptor drift**: ``DataDriftPreset`` over the descriptors with ONE pinned statistical test
  for every column (``monitor.stattest``; per-descriptor thresholds in ``monitor.thresholds``).
  The main job pins ``wasserstein``: the Wasserstein distance between window and reference divided
  by the reference's standard deviation (an effect size), drift when >= ``stattest_threshold``
  (1.0). ``ks`` (the code default) is the two-sample Kolmogorov-Smirnov test, drift when its p-value
  < the threshold; with a 29k-sentence reference it flags statistically certain but harmless
  differences (test_2017_flickr's 11 % shorter captions: docs/studies/drift-thresholds.md). Evidently's own
  default switches between K-S and Wasserstein with the reference size; pinning keeps a verdict
  comparable from week to week, and the summary records the test Evidently reports it ran.
- **embedding drift**: ``EmbeddingsDrift`` on the PCA-reduced encoder embeddings
  (``monitor.embedding_method``, default MMD, Gretton et al. 2012). With
  ``monitor.embedding_bootstrap`` (default) it is Evidently's bootstrap test: drift when the
  statistic exceeds the ``monitor.embedding_quantile`` quantile of the same statistic between
  reference resamples of the window's size, so the false-alarm rate holds for 30 sentences as
  for 2,000 (a fixed threshold does not: MMD's noise shrinks with the window). Evidently's MMD
  default quantile is 0.05, which flags nearly every window; we always pass ours. The kernel test
  is quadratic in rows, so each side is a seeded sample of at most ``monitor.embedding_sample`` rows.

Verdict (``summary["verdict"]``):

- ``insufficient_data``: fewer than ``monitor.min_window`` sentences (no test is run; never a
  drift or no-drift verdict);
- ``drift``: at least ``monitor.drift_share`` of the descriptors drifted, or the embeddings did;
- ``no_drift`` otherwise.

``run_check`` is what ``aiayn monitor`` and the Prefect flow call: it reads the window (a text
file, or the last ``monitor.window_size`` sentences of the serving log), checks it, writes
``report.html`` (descriptors), ``embeddings.html``, ``outputs.html`` (the answers' signals:
``monitoring.output_check``) and ``summary.json`` into a fresh folder under
``artifacts/drift/`` (atomically), logs them to MLflow, and returns the summary with an exit code:
0 no drift, 1 drift, 2 the check could not run (``insufficient_data`` included).

Errors: ``DriftCheckError`` (the check cannot run: no or unreadable input, empty window, a
reference missing or built for another model, an unknown descriptor or test); its message says
what to do.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.config.schema import MonitorConfig, Params
from aiayn.stages import Layout
from monitoring.descriptors import DESCRIPTORS, Pca, describe, encoder_embeddings

__all__ = [
    "DriftCheckError",
    "Reference",
    "load_reference",
    "read_text_window",
    "read_log_window",
    "check",
    "CheckResult",
    "exit_code",
    "summary_exit_code",
    "run_check",
    "drift_dir",
    "EXIT_NO_DRIFT",
    "EXIT_DRIFT",
    "EXIT_CANNOT_RUN",
    "VERDICTS",
    "SUMMARY_SCHEMA_VERSION",
]

log = logging.getLogger("aiayn.monitor")

EXIT_NO_DRIFT, EXIT_DRIFT, EXIT_CANNOT_RUN = 0, 1, 2
VERDICTS = ("no_drift", "drift", "insufficient_data")
SUMMARY_SCHEMA_VERSION = 1
#: Numerical per-column tests of Evidently that the descriptors may be pinned to.
STATTESTS = ("ks", "wasserstein", "psi", "jensenshannon", "kl_div", "anderson", "mannw", "cramer_von_mises",
             "hellinger", "ed", "es", "t_test", "emp_mmd")
#: Evidently's default threshold of each embedding method (``legacy.metrics.data_drift.embedding_drift_methods``).
EMBEDDING_DEFAULT_THRESHOLDS = {"mmd": 0.015, "model": 0.55, "distance": 0.2, "ratio": 0.2}


class DriftCheckError(RuntimeError):
    """The check cannot run (exit status 2); the message names the input and what to do."""


# --------------------------------------------------------------------------- reference


@dataclass(frozen=True)
class Reference:
    """A loaded ``artifacts/monitor_reference``: descriptors ``{name: (n,)}``, embeddings ``(n, k)``,
    the PCA, the ``source_side`` piece table ``(vocab,)`` bool and ``meta`` (``reference.json``)."""

    descriptors: dict[str, np.ndarray]
    embeddings: np.ndarray
    pca: Pca
    source_side: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.embeddings)


def load_reference(directory: str | Path) -> Reference:
    """Load a reference folder. Raises ``DriftCheckError`` when it is missing or incomplete."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    directory = Path(directory)
    tensors_path, meta_path = directory / "reference.safetensors", directory / "reference.json"
    if not tensors_path.is_file() or not meta_path.is_file():
        raise DriftCheckError(f"no drift reference in {directory}: build it with `dvc repro monitor_reference` "
                              "(or `aiayn monitor-reference`)")
    try:
        t = load_file(str(tensors_path))
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        desc = {k: t[f"desc.{k}"] for k in meta["descriptors"]}
        ref = Reference(desc, t["embeddings"], Pca(t["pca.mean"], t["pca.components"]),
                        t["source_side"].astype(bool), meta)
    except (SafetensorError, OSError, ValueError, KeyError) as e:
        raise DriftCheckError(f"drift reference {directory} is unreadable ({type(e).__name__}: {e}); "
                              "rebuild it with `dvc repro monitor_reference`") from None
    return ref


# --------------------------------------------------------------------------- windows


def read_text_window(path: str | Path) -> list[str]:
    """Sentences of a UTF-8 text file, one per line; blank lines skipped.

    Raises ``DriftCheckError`` for a missing/unreadable file or invalid UTF-8 (naming the line).
    """
    from aiayn.inference.text import InputError, read_input

    path = Path(path)
    try:
        lines = read_input(path.read_bytes(), source=str(path))
    except OSError as e:
        raise DriftCheckError(f"cannot read the window {path}: {e.strerror or e}") from None
    except InputError as e:  # its hint names `aiayn translate`'s option, which the monitor has not
        raise DriftCheckError(f"{str(e).split('; use --encoding-errors')[0]}: re-encode the file as UTF-8") from None
    return [s for s in lines if s.strip()]


def read_log_window(target: str | Path, size: int) -> tuple[list[str], dict[str, Any]]:
    """The last ``size`` sentences of the serving request log, oldest first, read through
    ``aiayn.serving.request_log`` (``target``: the SQLite file, opened read-only so a running service is
    never blocked, or a PostgreSQL URL: the log replicas share).

    Returns ``(sentences, info)`` with ``info = {"log": where (no password), "first_ts", "last_ts",
    "model_versions"}`` (Unix seconds; the model versions that answered them). Raises
    ``DriftCheckError`` for a missing log, a file that is not a request log, or any database error.
    """
    from aiayn.serving.request_log import RequestLogError, is_url, open_request_log, redact

    where = redact(str(target)) if is_url(target) else str(target)
    if not is_url(target) and not Path(target).is_file():
        raise DriftCheckError(f"no serving log at {target}: start `aiayn serve` (it writes the log), or pass --input FILE")
    try:
        with open_request_log(target, read_only=True) as request_log:
            rows = request_log.latest(int(size))
    except RequestLogError as e:
        raise DriftCheckError(f"serving log {where} is unreadable ({e})") from None
    info = {"log": where, "first_ts": rows[0].ts if rows else None, "last_ts": rows[-1].ts if rows else None,
            "model_versions": sorted({str(r.model_version) for r in rows if r.model_version is not None})}
    info["signals"] = [r.signals for r in rows if r.source.strip()]  # per sentence; None: logged before schema 2
    return [r.source for r in rows if r.source.strip()], info


# --------------------------------------------------------------------------- the check


def _descriptor_names(cfg: MonitorConfig, ref: Reference) -> list[str]:
    names = list(cfg.descriptors) if cfg.descriptors is not None else list(DESCRIPTORS)
    unknown = [n for n in names if n not in DESCRIPTORS]
    if unknown or not names:
        raise DriftCheckError(f"monitor.descriptors {unknown or names} not among {list(DESCRIPTORS)}")
    missing = [n for n in names if n not in ref.descriptors]
    if missing:
        raise DriftCheckError(f"the reference lacks descriptor(s) {missing}: rebuild it (`dvc repro monitor_reference`)")
    bad = sorted(set(cfg.thresholds) - set(names))
    if bad:
        raise DriftCheckError(f"monitor.thresholds names descriptor(s) {bad} that are not tested ({names})")
    if cfg.stattest not in STATTESTS:
        raise DriftCheckError(f"monitor.stattest {cfg.stattest!r} is not one of {list(STATTESTS)}")
    return names


def _evidently() -> Any:
    os.environ.setdefault("DO_NOT_TRACK", "1")  # Evidently's telemetry
    import evidently

    return evidently


def _embedding_method(cfg: MonitorConfig) -> Any:
    from evidently.legacy.metrics.data_drift import embedding_drift_methods as m

    make = getattr(m, cfg.embedding_method)
    if cfg.embedding_bootstrap:
        return make(bootstrap=True, quantile_probability=cfg.embedding_quantile)
    return make(threshold=cfg.embedding_threshold or EMBEDDING_DEFAULT_THRESHOLDS[cfg.embedding_method])


def _sample(n: int, k: int, seed: int) -> np.ndarray:
    if n <= k:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=k, replace=False))


def _descriptor_report(cur: dict[str, np.ndarray], ref: Reference, names: list[str], cfg: MonitorConfig):
    import pandas as pd

    ev = _evidently()
    from evidently.presets import DataDriftPreset

    definition = ev.DataDefinition(numerical_columns=names)
    cur_df = pd.DataFrame({k: cur[k] for k in names})
    ref_df = pd.DataFrame({k: ref.descriptors[k] for k in names})
    report = ev.Report([DataDriftPreset(columns=names, method=cfg.stattest, threshold=cfg.stattest_threshold,
                                        per_column_threshold=dict(cfg.thresholds) or None,
                                        drift_share=cfg.drift_share)], include_tests=True)
    with np.errstate(divide="ignore", invalid="ignore"):  # Evidently's summaries of constant columns (unk_rate)
        return report.run(current_data=ev.Dataset.from_pandas(cur_df, data_definition=definition),
                          reference_data=ev.Dataset.from_pandas(ref_df, data_definition=definition))


def _parse_descriptor_snapshot(snapshot: Any, names: list[str], cfg: MonitorConfig) -> dict[str, dict[str, Any]]:
    """Per descriptor: the test Evidently ran, its statistic and threshold, drifted (its test failed)."""
    d = snapshot.dict()
    metric_by_id = {m["id"]: m for m in d["metrics"]}
    out: dict[str, dict[str, Any]] = {}
    for t in d["tests"]:
        metric = metric_by_id.get(t["metric_config"]["metric_id"], {})
        conf = metric.get("config", {})
        if conf.get("type") != "evidently:metric_v2:ValueDrift":
            continue
        column = conf["column"]
        out[column] = {
            "test": conf.get("method"),
            "test_description": t.get("description", ""),
            "statistic": float(metric["value"]),
            "threshold": float(conf.get("threshold")),
            "drifted": t["status"] == "FAIL",
        }
    missing = [n for n in names if n not in out]
    if missing:  # Evidently changed its output: better no verdict than a wrong one
        raise DriftCheckError(f"Evidently reported no drift test for {missing}; cannot decide")
    for n in names:
        if out[n]["test"] != cfg.stattest:
            raise DriftCheckError(f"Evidently ran {out[n]['test']!r} for {n}, not the pinned {cfg.stattest!r}")
    return {n: out[n] for n in names}


def _embedding_test(cur_emb: np.ndarray, ref: Reference, cfg: MonitorConfig) -> tuple[dict[str, Any], Any]:
    """The embedding drift decision: ``(summary entry, render)``. ``render()`` builds Evidently's
    ``EmbeddingsDrift`` report on the same samples and checks that it scores them as the method did
    (Evidently's report computes a t-SNE of both samples for its plot, seconds per window, so it is
    built only when a report is written: ``run_check``)."""
    import pandas as pd

    method = _embedding_method(cfg)
    cols = [f"e{i}" for i in range(cur_emb.shape[1])]
    ref_rows = _sample(len(ref), cfg.embedding_sample, cfg.reference_seed)
    cur_rows = _sample(len(cur_emb), cfg.embedding_sample, cfg.reference_seed + 1)
    cur_df = pd.DataFrame(cur_emb[cur_rows], columns=cols)
    ref_df = pd.DataFrame(ref.embeddings[ref_rows], columns=cols)
    # the method itself gives the decision (bootstrap or threshold); Evidently's report gives the score only
    score, drifted, _ = method(cur_df.copy(), ref_df.copy())

    def render() -> Any:
        ev = _evidently()
        from evidently.metrics import EmbeddingsDrift

        definition = ev.DataDefinition(numerical_columns=cols, embeddings={"encoder": cols})
        report = ev.Report([EmbeddingsDrift(embeddings_name="encoder", drift_method=_embedding_method(cfg))])
        snapshot = report.run(current_data=ev.Dataset.from_pandas(cur_df, data_definition=definition),
                              reference_data=ev.Dataset.from_pandas(ref_df, data_definition=definition))
        reported = float(snapshot.dict()["metrics"][0]["value"])
        if not np.isclose(reported, float(score), rtol=1e-6, atol=1e-12):
            raise DriftCheckError(f"Evidently's report scored the embeddings {reported}, its method {score}: "
                                  "cannot decide")
        return snapshot

    return {"method": cfg.embedding_method, "statistic": float(score),
            "test": (f"bootstrap: drift when above its {cfg.embedding_quantile:g} quantile on reference "
                     "resamples" if cfg.embedding_bootstrap else f"drift when above {method.threshold:g}"),
            "threshold": None if cfg.embedding_bootstrap else float(method.threshold),
            "drifted": bool(drifted), "dims": int(cur_emb.shape[1]),
            "reference_rows": int(len(ref_rows)), "current_rows": int(len(cur_rows))}, render


@dataclass
class CheckResult:
    """``summary`` (JSON-ready; see ``check``), the descriptor report's Evidently snapshot and the
    embedding report's builder (both None when no test ran; ``embedding_snapshot()`` renders it)."""

    summary: dict[str, Any]
    descriptor_snapshot: Any = None
    render_embeddings: Callable[[], Any] | None = None

    @property
    def exit_code(self) -> int:
        return exit_code(self.summary["verdict"])

    def embedding_snapshot(self) -> Any:
        """Evidently's ``EmbeddingsDrift`` snapshot of this check (None without one); raises
        ``DriftCheckError`` when it scores the embeddings differently from the verdict's method."""
        return self.render_embeddings() if self.render_embeddings is not None else None


def exit_code(verdict: str) -> int:
    """0 for ``no_drift``, 1 for ``drift``, 2 for anything else (``insufficient_data``)."""
    return {"no_drift": EXIT_NO_DRIFT, "drift": EXIT_DRIFT}.get(verdict, EXIT_CANNOT_RUN)


def summary_exit_code(summary: dict[str, Any]) -> int:
    """``exit_code`` of the input verdict, except that an output alarm (``monitoring.output_check``) is 1
    whatever the inputs did: the answers look broken."""
    if (summary.get("outputs") or {}).get("verdict") == "alarm":
        return EXIT_DRIFT
    return exit_code(summary["verdict"])


def check(sentences: Sequence[str], ref: Reference, cfg: MonitorConfig, translator: Any | None = None) -> CheckResult:
    """Check one window (see the module doc for the verdict rule).

    ``translator``: ``aiayn.inference.translator.Translator`` of the reference's model (its tokenizer for the
    descriptors, its encoder for the embeddings; ``cfg.embedding_method`` None: descriptors only).
    It may be None only when the window is below ``min_window`` (no test runs). The summary holds ``verdict``,
    ``window`` (sentences), ``reference`` (sentences, model SHA-256), ``descriptors`` (per name:
    test, statistic, threshold, drifted, current and reference mean), ``drifted_share``,
    ``drift_share``, ``embeddings`` (method, statistic, threshold, drifted, rows) or None, and
    ``seconds``. Raises ``DriftCheckError`` for an empty window or a config the reference cannot serve.
    """
    t0 = time.perf_counter()
    names = _descriptor_names(cfg, ref)
    n = len(sentences)
    if n == 0:
        raise DriftCheckError("the window holds no sentences: nothing to check (never a 'no drift' verdict)")
    summary: dict[str, Any] = {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "verdict": "insufficient_data",
        "window": {"sentences": n, "min_window": cfg.min_window},
        "reference": {"sentences": len(ref), "model_sha256": ref.meta.get("model_sha256"),
                      "split": ref.meta.get("split")},
        "descriptors": {},
        "drifted_share": None,
        "drift_share": cfg.drift_share,
        "embeddings": None,
        "drifted": [],
    }
    if n < cfg.min_window:
        summary["reason"] = f"{n} sentences < monitor.min_window {cfg.min_window}: no verdict"
        summary["seconds"] = round(time.perf_counter() - t0, 3)
        return CheckResult(summary)

    if translator is None:
        raise DriftCheckError("the check needs the reference's model (its tokenizer and encoder)")
    cur = describe(sentences, translator.tokenizer, ref.source_side)
    desc_snapshot = _descriptor_report(cur, ref, names, cfg)
    tests = _parse_descriptor_snapshot(desc_snapshot, names, cfg)
    for k in names:
        tests[k]["current_mean"] = round(float(cur[k].mean()), 6)
        tests[k]["reference_mean"] = round(float(ref.descriptors[k].mean()), 6)
    drifted_share = sum(t["drifted"] for t in tests.values()) / len(names)
    render_embeddings, emb = None, None
    if cfg.embedding_method is not None:
        cur_emb = ref.pca.transform(encoder_embeddings(translator, sentences))
        emb, render_embeddings = _embedding_test(cur_emb, ref, cfg)
    drift = drifted_share >= cfg.drift_share or bool(emb and emb["drifted"])
    summary.update(verdict="drift" if drift else "no_drift", descriptors=tests,
                   drifted_share=round(drifted_share, 6), embeddings=emb,
                   drifted=[k for k, t in tests.items() if t["drifted"]] + (["embeddings"] if emb and emb["drifted"] else []))
    summary["seconds"] = round(time.perf_counter() - t0, 3)
    return CheckResult(summary, desc_snapshot, render_embeddings)


# --------------------------------------------------------------------------- the command


def drift_dir(layout: Layout) -> Path:
    """Where checks write their reports: ``artifacts/drift/<UTC time>/`` (not a DVC output)."""
    return layout.root / "artifacts" / "drift"


def _open_translator(layout: Layout, ref: Reference):
    from aiayn.checkpoint import CheckpointError
    from aiayn.io import sha256_file
    from aiayn.tokenizer import TokenizerError
    from aiayn.inference.translator import Translator

    weights = layout.model / "model.safetensors"
    if not weights.is_file():
        raise DriftCheckError(f"{weights} not found: the check embeds with the model the reference was built from")
    digest = sha256_file(weights)
    if ref.meta.get("model_sha256") != digest:
        raise DriftCheckError(f"the drift reference was built for another model (sha256 "
                              f"{str(ref.meta.get('model_sha256'))[:12]}, {weights} is {digest[:12]}): "
                              "rebuild it with `dvc repro monitor_reference`")
    try:
        return Translator.from_dir(layout.model, device="cpu")
    except (OSError, CheckpointError, TokenizerError) as e:
        raise DriftCheckError(f"cannot load the model in {layout.model}: {e}") from None


def _outputs(params: Params, layout: Layout, sentences: list[str],
             signals: list | None) -> tuple[dict[str, Any], Callable[[], Any] | None]:
    """The output check of the window (``monitoring.output_check``): the logged answers' signals, or
    for a window without them (a text file, a log from before schema 2) the serving bundle's answers.
    Returns ``(section, render)``: ``render()`` builds ``outputs.html``'s Evidently snapshot (None when the
    window was not judged) and raises ``DriftCheckError`` when its tests disagree with the section's alarms."""
    from monitoring.output_check import (answer_signals, load_output_reference, output_report, output_section,
                                         served_translator)
    from monitoring.reference import reference_dir

    reference = load_output_reference(reference_dir(layout))
    if reference is not None and (signals is None or all(s is None for s in signals)):
        if len(sentences) >= params.monitor.min_window:
            translator, options, _ = served_translator(params, layout)
            signals = answer_signals(translator, options, sentences, reference["tgt_lang"])[1]
    section = output_section(reference, signals, params.monitor)
    if section["verdict"] not in ("ok", "alarm"):
        return section, None

    def render() -> Any:
        snapshot, failed = output_report(reference, signals, section)
        if failed != sorted(section["alarms"]):
            raise DriftCheckError(f"Evidently's output tests failed for {failed}, the binomial tests alarmed for "
                                  f"{sorted(section['alarms'])}: cannot decide")
        return snapshot

    return section, render


def run_check(params: Params, layout: Layout, *, input_path: str | Path | None = None,
              out_dir: str | Path | None = None, track: bool = True,
              log_url: str | None = None) -> tuple[dict[str, Any], Path | None]:
    """Read the window, check it, write the reports; returns ``(summary, report folder)``.

    Window: ``input_path`` (a text file, one sentence per line), else the last
    ``monitor.window_size`` sentences of the serving log: ``log_url`` (a PostgreSQL URL), else
    ``AIAYN_REQUEST_LOG_URL`` (``aiayn.config.settings``), else ``monitor.log_path`` (relative to the
    project root).
    The folder (default ``artifacts/drift/<UTC time>``) gets ``summary.json`` always,
    ``report.html``/``embeddings.html`` when the tests ran and ``outputs.html`` when the answers were judged
    (``monitoring.output_check.output_report``). Raises ``DriftCheckError`` (exit 2).
    """
    from aiayn.io import atomic_dir, atomic_write_json

    cfg = params.monitor
    from monitoring.reference import reference_dir

    ref = load_reference(reference_dir(layout))
    _descriptor_names(cfg, ref)  # config errors before any expensive step
    if input_path is not None:
        sentences = read_text_window(input_path)
        source = {"file": str(input_path)}
        signals = None
    else:
        from aiayn.config.settings import Settings

        log_path = Path(cfg.log_path)
        target = log_url or Settings.from_env().request_log_url or (
            log_path if log_path.is_absolute() else layout.root / log_path)
        sentences, source = read_log_window(target, cfg.window_size)
        signals = source.pop("signals")
    if not sentences:
        where = source.get("file") or source.get("log")
        raise DriftCheckError(f"the window ({where}) holds no sentences: nothing to check")
    translator = _open_translator(layout, ref) if len(sentences) >= cfg.min_window else None
    result = check(sentences, ref, cfg, translator)
    summary = result.summary
    summary["window"].update(source)
    summary["outputs"], render_outputs = _outputs(params, layout, sentences, signals)
    summary["checked_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    summary["monitor_params"] = cfg.model_dump(mode="json")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    target = Path(out_dir) if out_dir is not None else drift_dir(layout) / stamp
    with atomic_dir(target) as tmp:
        if result.descriptor_snapshot is not None:
            result.descriptor_snapshot.save_html(str(tmp / "report.html"))
        if (embedding_snapshot := result.embedding_snapshot()) is not None:
            embedding_snapshot.save_html(str(tmp / "embeddings.html"))
        if render_outputs is not None:
            render_outputs().save_html(str(tmp / "outputs.html"))
        atomic_write_json(tmp / "summary.json", summary)
    moved = f"drifted: {', '.join(summary['drifted']) or 'none'}" if summary["descriptors"] else "no test ran"
    log.info("drift check: %s (%d sentences; %s); reports in %s", summary["verdict"],
             summary["window"]["sentences"], moved, target)
    if track:
        from aiayn.tracking import log_drift_check

        log_drift_check(layout.root, summary, target)
    return summary, target

