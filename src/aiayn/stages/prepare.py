"""``prepare`` stage: the corpus snapshot -> validated, NFC-normalised, cleaned plain text, and a counted report.

Reads the ``corpus`` stage's snapshot (``layout.corpus``, ``aiayn.data.sources``); without one, a
Multi30k config reads ``layout.raw`` in place. Valid and test splits are read first and checked,
never filtered (``aiayn.data.hygiene.EvalChecks``); then train is streamed pair by pair through the
hygiene rules (``TrainRules``: empty, control characters, length and ratio, duplicates, test
contamination, optional language ID) straight into the output files, so memory stays flat at any
corpus size. ``max_train_pairs`` / ``max_eval_pairs`` keep the first N kept pairs. Writes, as one
atomic directory swap (a failure leaves the previous output as it was):

``layout.prepared/{split}.{src_lang}``, ``{split}.{tgt_lang}``
    UTF-8, one sentence per line, line N of one translates line N of the other.
``layout.prepared/report.json``
    ``{split: {"read": n, "kept": n, "dropped": {rule: n}}}`` where
    ``read == kept + sum(dropped.values())``; rules: ``aiayn.data.hygiene.TRAIN_RULES`` that ran
    (train only) and ``max_pairs`` (pairs beyond the ``max_*_pairs`` cap). This is also what ``run``
    returns.

and then ``layout.prepare_report`` (a DVC metric): ``{"corpus": identity, "pair", "splits": the
above, "checks": {split: {check: n}}, "rules": the hygiene settings}``; ``report_metrics`` flattens it
for a tracker.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from aiayn.config.schema import Params
from aiayn.data.readers import CorpusError
from aiayn.data.hygiene import EvalChecks, LanguageId, TrainRules, check_overlaps
from aiayn.data.sources import load_manifest, manifest_matches, multi30k_manifest, split_reader
from aiayn.faults import fault_point
from aiayn.io import atomic_dir, atomic_write_json
from aiayn.recording import NULL_RECORDER, Recorder, StageRecord
from aiayn.stages import Layout

__all__ = ["run", "raw_path", "source", "report_metrics", "RECORD"]

#: The stage's run: the hygiene counts (``report_metrics``), the report file as an artifact, and the
#: corpus identity as ``data.corpus.*`` tags, which the pipeline run gets too (its data version).
RECORD = StageRecord("prepare", headline_tags=r"^data\.corpus\.")

log = logging.getLogger("aiayn")


def raw_path(layout: Layout, split: str, lang: str) -> Path:
    """``layout.raw/{split}.{lang}.gz`` (Multi30k, fetched by ``aiayn fetch``)."""
    return layout.raw / f"{split}.{lang}.gz"


def source(params: Params, layout: Layout) -> tuple[Path, dict[str, Any]]:
    """``(folder, manifest)`` to read: the ``corpus`` snapshot, or Multi30k in place when there is none.

    Raises ``CorpusError`` when the snapshot holds another corpus, pair or splits (run ``aiayn corpus``),
    or there is no snapshot of a non-Multi30k corpus.
    """
    data = params.data
    manifest = load_manifest(layout.corpus)
    if manifest is not None:
        why = manifest_matches(manifest, data)
        if why is None:
            return layout.corpus, manifest
        if data.corpus.kind != "multi30k":
            raise CorpusError(f"{layout.corpus} is not this corpus ({why}): run `aiayn corpus` (or `dvc repro`) first")
    elif data.corpus.kind != "multi30k":
        raise CorpusError(f"no corpus snapshot in {layout.corpus}: run `aiayn corpus` (or `dvc repro`) first")
    return layout.raw, multi30k_manifest(layout.raw, data)


def run(params: Params, layout: Layout, recorder: Recorder = NULL_RECORDER) -> dict:
    """Run the stage; return the per-split report (also ``prepared/report.json``; the whole report is
    ``layout.prepare_report``, a DVC metric). ``recorder`` gets a ``prepare`` run (``RECORD``) with the
    report's counts as metrics (``report_metrics``, step 0), the report file as an artifact and the
    corpus identity (kind, pair, name or path, revision) as ``data.corpus.*`` tags.

    Raises ``CorpusError``: raw files missing (telling the user to run ``aiayn fetch``) or malformed
    (file + line), misaligned files, an empty line or control character in a valid/test split, splits
    that overlap entirely.
    """
    data = params.data
    folder, manifest = source(params, layout)
    lid = LanguageId((data.src_lang, data.tgt_lang)) if data.langid else None
    eval_splits = [s for s in data.splits if s != data.train_split]
    splits: dict[str, dict] = {}
    checks: dict[str, dict[str, int]] = {}
    with atomic_dir(layout.prepared) as tmp:
        digests, test_sources, outputs = {}, {}, {}
        for split in eval_splits:
            reader = split_reader(folder, manifest, split, data)
            check = EvalChecks(data, lid)
            pairs = []
            for lineno, src, tgt in reader:
                check.check(lineno, src, tgt, reader)
                pairs.append((src, tgt))
            digests[split], checks[split] = check.digests, check.counts
            if split in data.test_splits:
                test_sources[split] = {s for s, _ in pairs}
            cap = data.max_eval_pairs
            over = max(0, len(pairs) - cap) if cap is not None else 0
            outputs[split] = pairs[: len(pairs) - over]
            splits[split] = {"read": len(pairs), "kept": len(outputs[split]), "dropped": {"max_pairs": over}}
        rules = TrainRules(data, set().union(*test_sources.values()), lid)
        splits = {data.train_split: _stream_train(params, folder, manifest, rules, tmp)} | splits
        checks = ({data.train_split: rules.checks} if rules.checks else {}) | checks
        check_overlaps(digests, test_sources, rules.test_hits)
        for split, kept in outputs.items():
            for side, lang in enumerate((data.src_lang, data.tgt_lang)):
                with open(tmp / f"{split}.{lang}", "w", encoding="utf-8", newline="") as f:
                    f.writelines(pair[side] + "\n" for pair in kept)
        atomic_write_json(tmp / "report.json", splits)
    report = {"corpus": manifest["identity"], "pair": data.pair, "splits": splits, "checks": checks,
              "rules": {"dedup": data.dedup_on, "decontaminate": data.decontaminate, "langid": data.langid,
                        "min_words": data.min_words, "max_words": data.max_words, "max_ratio": data.max_ratio}}
    fault_point("prepare.folder_swapped")
    atomic_write_json(layout.prepare_report, report)
    with recorder.start(RECORD) as tracker:
        tracker.log_metrics(report_metrics(report), step=0)
        tracker.log_artifact(layout.prepare_report)
        tracker.set_tags({f"data.corpus.{k}": v for k, v in report["corpus"].items()
                          if isinstance(v, (str, int, float, bool))})
    for split, rep in splits.items():
        drops = ", ".join(f"{rule} {n}" for rule, n in rep["dropped"].items() if n) or "nothing"
        found = ", ".join(f"{c} {n}" for c, n in checks.get(split, {}).items() if n)
        log.info("prepare: %s: read %d, kept %d; dropped: %s%s", split, rep["read"], rep["kept"], drops,
                 f"; found (kept): {found}" if found else "")
    return splits


def _stream_train(params: Params, folder: Path, manifest: dict, rules: TrainRules, out: Path) -> dict:
    """Read train pair by pair through ``rules`` into ``out/{train}.{lang}``; return its report entry."""
    data = params.data
    cap = data.max_train_pairs
    read = kept = over = 0
    src_path, tgt_path = (out / f"{data.train_split}.{lang}" for lang in (data.src_lang, data.tgt_lang))
    with open(src_path, "w", encoding="utf-8", newline="") as fs, open(tgt_path, "w", encoding="utf-8", newline="") as ft:
        for _, src, tgt in split_reader(folder, manifest, data.train_split, data):
            read += 1
            if rules.verdict(src, tgt) is not None:
                continue
            if cap is not None and kept >= cap:
                over += 1
                continue
            kept += 1
            fs.write(src + "\n")
            ft.write(tgt + "\n")
    if kept == 0:
        raise CorpusError(f"no train pair survived the hygiene rules ({read} read; dropped {rules.dropped})")
    return {"read": read, "kept": kept, "dropped": {**rules.dropped, "max_pairs": over}}


def report_metrics(report: dict[str, Any]) -> dict[str, float]:
    """``layout.prepare_report`` flattened for a tracker: ``prepare.{split}.{read,kept}``,
    ``prepare.{split}.dropped.{rule}`` and ``prepare.{split}.found.{check}`` (counts)."""
    out: dict[str, float] = {}
    for split, rep in report["splits"].items():
        out[f"prepare.{split}.read"] = rep["read"]
        out[f"prepare.{split}.kept"] = rep["kept"]
        out |= {f"prepare.{split}.dropped.{rule}": n for rule, n in rep["dropped"].items()}
    for split, found in report.get("checks", {}).items():
        out |= {f"prepare.{split}.found.{name}": n for name, n in found.items()}
    return out
