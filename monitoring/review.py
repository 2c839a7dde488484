"""The human review queue: flagged answers (and a seeded sample of unflagged ones) go to a translator,
their verdicts come back into the request log, their corrections into a training corpus.

- ``export_queue``: every logged answer with signals is flagged by the output reference's thresholds
  (``aiayn.quality.calibration.flags``); flagged ones (``reason``: the signals, comma-separated) and a
  ``sample`` share of the unflagged ones (``reason`` ``sample``; drawn per answer from ``seed`` and its
  ``(request_id, idx)``, so the draw does not depend on what else is in the log) are queued in the log's
  ``review`` table (an answer already queued is never queued twice). Every queued answer not yet
  reviewed is written for the translator: ``review.tsv`` (request_id, idx, source, output, reason),
  ``review.json`` (Label Studio tasks: ``[{"id", "data": {request_id, idx, source, output, reason}}]``)
  and ``label_config.xml`` (the labeling config: Choices ``verdict``, TextArea ``correction``).
- ``import_reviews``: a TSV (header: request_id, idx, verdict, correction, optional reviewer; the
  export's source/output/reason columns may stay) or a Label Studio JSON export (tasks with
  ``annotations``: the last annotation of a task counts). Everything is validated before anything is
  written (``ReviewError`` naming the line or task; the log and the corpus unchanged), then the
  verdicts go to the log in one transaction and the reviewed pairs are appended to
  ``data/reviewed/train.tsv`` (source<TAB>target, deduplicated, written to a new file and renamed):
  ``corrected`` -> (source, correction), ``correct`` -> (source, output), ``wrong`` -> nothing.
- ``review_stats``: per signal, the flagged answers judged wrong vs correct (the detector's precision),
  and the wrong rate of the sampled unflagged answers (what the detectors miss).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from aiayn.io import atomic_write_text
from aiayn.quality.calibration import flags
from aiayn.serving.request_log import VERDICTS, RequestLog, ReviewItem

__all__ = ["ReviewError", "ImportResult", "REVIEWED_CORPUS", "export_queue", "select", "import_reviews",
           "read_reviews", "review_stats", "label_config"]

#: The reviewed-pairs corpus, relative to the project root (``data.corpus: {kind: tsv, path: data/reviewed}``).
REVIEWED_CORPUS = Path("data") / "reviewed" / "train.tsv"
_TSV_REQUIRED = ("request_id", "idx", "verdict", "correction")
_TSV_OPTIONAL = ("reviewer", "source", "output", "reason")
_TSV_EXPORT = ("request_id", "idx", "source", "output", "reason")


class ReviewError(ValueError):
    """A review file that cannot be imported (one line naming the file and line or task)."""


def label_config() -> str:
    """Label Studio's labeling config for the exported tasks."""
    return """<View>
  <Header value="Source"/>
  <Text name="source" value="$source"/>
  <Header value="Machine translation"/>
  <Text name="output" value="$output"/>
  <Header value="Flagged by" size="6"/>
  <Text name="reason" value="$reason"/>
  <Choices name="verdict" toName="output" choice="single" showInline="true" required="true">
    <Choice value="correct"/>
    <Choice value="wrong"/>
  </Choices>
  <TextArea name="correction" toName="output" placeholder="The correct translation (when wrong)"
            editable="true" maxSubmissions="1"/>
</View>
"""


def _sampled(seed: int, request_id: str, idx: int, share: float) -> bool:
    return random.Random(f"{seed}:{request_id}:{idx}").random() < share


def select(log: RequestLog, thresholds: dict[str, Any], *, sample: float, seed: int,
           limit: int | None = None) -> tuple[list[tuple[str, int, str]], dict[str, int]]:
    """``(to queue, counts)``: answers not yet queued, flagged ones first, then the sampled unflagged ones,
    at most ``limit`` in all; ``counts``: answers judged, flagged, sampled, already queued."""
    queued = {(r.request_id, r.idx) for r in log.review_items()}
    flagged, sampled, counts = [], [], {"answers": 0, "flagged": 0, "sampled": 0, "already_queued": 0}
    for a in log.answers():
        if a.signals is None:
            continue
        counts["answers"] += 1
        names = [n for n, bad in flags(a.signals, thresholds).items() if bad]
        if not names and not _sampled(seed, a.request_id, a.idx, sample):
            continue
        if (a.request_id, a.idx) in queued:
            counts["already_queued"] += 1
            continue
        (flagged if names else sampled).append((a.request_id, a.idx, ",".join(names) or "sample"))
    picked = (flagged + sampled)[: limit if limit is not None else None]
    counts["flagged"] = sum(1 for p in picked if p[2] != "sample")
    counts["sampled"] = len(picked) - counts["flagged"]
    return picked, counts


def _tsv_field(text: Any) -> str:
    return " ".join(str("" if text is None else text).replace("\t", " ").splitlines())


def export_queue(log: RequestLog, thresholds: dict[str, Any], out: Path, *, sample: float = 0.05, seed: int = 0,
                 limit: int | None = None, now: float | None = None) -> dict[str, Any]:
    """Queue (``select``) and write the pending queue to ``out`` (module docstring); returns counts."""
    if not 0 <= sample <= 1:
        raise ReviewError(f"--sample must be in [0, 1], got {sample}")
    picked, counts = select(log, thresholds, sample=sample, seed=seed, limit=limit)
    counts["queued"] = log.queue(picked, queued_at=time.time() if now is None else now)
    pending = [r for r in log.review_items() if r.verdict is None]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = ["\t".join(_TSV_EXPORT)] + ["\t".join(_tsv_field(v) for v in (r.request_id, r.idx, r.source, r.output,
                                                                          r.reason)) for r in pending]
    atomic_write_text(out / "review.tsv", "\n".join(rows) + "\n")
    tasks = [{"id": n, "data": {"request_id": r.request_id, "idx": r.idx, "source": r.source,
                                "output": r.output or "", "reason": r.reason}} for n, r in enumerate(pending, 1)]
    atomic_write_text(out / "review.json", json.dumps(tasks, ensure_ascii=False, indent=2) + "\n")
    atomic_write_text(out / "label_config.xml", label_config())
    counts["pending"] = len(pending)
    return counts


# --------------------------------------------------------------------------- import


@dataclass
class _Review:
    where: str  # "file:line" or "file: task N"
    request_id: str
    idx: int
    verdict: str
    correction: str | None
    reviewer: str | None
    reviewed_at: float | None


@dataclass
class ImportResult:
    """What an import did: reviews ``recorded`` (new), ``updated`` (an earlier verdict replaced), ``unchanged``,
    ``duplicates`` (lines or tasks overridden by a later one in the file), pairs ``appended`` to the corpus."""

    recorded: int = 0
    updated: int = 0
    unchanged: int = 0
    appended: int = 0
    duplicates: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)


def _int(value: Any, where: str) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise ReviewError(f"{where}: idx {value!r} is not an integer") from None


def _read_tsv(path: Path, text: str) -> list[_Review]:
    lines = text.splitlines()
    if not lines:
        raise ReviewError(f"{path}: empty file (expected a header: {', '.join(_TSV_REQUIRED)}[, reviewer])")
    header = [h.strip() for h in lines[0].split("\t")]
    missing = [c for c in _TSV_REQUIRED if c not in header]
    unknown = [c for c in header if c not in _TSV_REQUIRED + _TSV_OPTIONAL]
    if missing or unknown or len(set(header)) != len(header):
        raise ReviewError(f"{path}:1: wrong columns {header}: need {list(_TSV_REQUIRED)} (reviewer optional)"
                          + (f"; missing {missing}" if missing else "") + (f"; unknown {unknown}" if unknown else ""))
    out = []
    for n, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != len(header):
            raise ReviewError(f"{path}:{n}: {len(fields)} columns, the header has {len(header)}")
        row = dict(zip(header, fields))
        where = f"{path}:{n}"
        out.append(_Review(where, row["request_id"].strip(), _int(row["idx"], where), row["verdict"].strip(),
                           row["correction"].strip() or None, (row.get("reviewer") or "").strip() or None, None))
    return out


def _timestamp(value: Any, where: str) -> float | None:
    if value in (None, ""):
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ReviewError(f"{where}: created_at {value!r} is not an ISO time") from None


def _from_annotation(task: dict[str, Any], where: str) -> _Review:
    data = task.get("data")
    if not isinstance(data, dict) or "request_id" not in data or "idx" not in data:
        raise ReviewError(f"{where}: no data.request_id/data.idx (not a task exported by `aiayn review export`)")
    annotations = [a for a in task.get("annotations") or [] if not a.get("was_cancelled")]
    if not annotations:
        raise ReviewError(f"{where}: no annotation")
    ann = annotations[-1]
    verdict, correction = None, None
    for r in ann.get("result") or []:
        value = r.get("value") or {}
        if r.get("from_name") == "verdict" and r.get("type") == "choices":
            verdict = (value.get("choices") or [None])[0]
        elif r.get("from_name") == "correction" and r.get("type") == "textarea":
            correction = "\n".join(value.get("text") or []).strip()
            if not correction:
                raise ReviewError(f"{where}: the correction is empty")
    if verdict == "wrong" and correction:
        verdict = "corrected"
    if verdict is None:
        raise ReviewError(f"{where}: no verdict (a Choices result from_name 'verdict')")
    by = ann.get("completed_by")
    by = by.get("email") or by.get("username") or by.get("id") if isinstance(by, dict) else by
    return _Review(where, str(data["request_id"]), _int(data["idx"], where), str(verdict), correction,
                   None if by in (None, "") else str(by), _timestamp(ann.get("created_at"), where))


def read_reviews(path: str | Path) -> list[_Review]:
    """The reviews in a TSV or Label Studio JSON export (by content: a JSON list is Label Studio's),
    not yet checked against the log. Raises ``ReviewError``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ReviewError(f"{path}: cannot read ({e})") from None
    if not text.lstrip().startswith("["):
        return _read_tsv(path, text)
    try:
        tasks = json.loads(text)
    except json.JSONDecodeError as e:
        raise ReviewError(f"{path}: not JSON ({e})") from None
    out = []
    for n, task in enumerate(tasks, 1):
        where = f"{path}: task {n}" + (f" (id {task.get('id')})" if isinstance(task, dict) and "id" in task else "")
        if not isinstance(task, dict):
            raise ReviewError(f"{where}: not an object")
        out.append(_from_annotation(task, where))
    return out


def _validate(reviews: Sequence[_Review], queue: dict[tuple[str, int], ReviewItem],
              reviewer: str | None) -> None:
    ids = {rid for rid, _ in queue}
    for r in reviews:
        if r.request_id not in ids:
            raise ReviewError(f"{r.where}: unknown request_id {r.request_id!r} (not in the review queue)")
        if (r.request_id, r.idx) not in queue:
            raise ReviewError(f"{r.where}: request {r.request_id!r} has no idx {r.idx} in the review queue")
        if r.verdict not in VERDICTS:
            raise ReviewError(f"{r.where}: verdict {r.verdict!r} is not one of {', '.join(VERDICTS)}")
        if r.verdict == "corrected" and not r.correction:
            raise ReviewError(f"{r.where}: verdict 'corrected' with an empty correction")
        if r.verdict == "correct" and r.correction:
            raise ReviewError(f"{r.where}: verdict 'correct' with a correction (use 'corrected' or 'wrong')")
        if r.verdict == "wrong" and r.correction:
            r.verdict = "corrected"
        if not (r.reviewer or reviewer):
            raise ReviewError(f"{r.where}: no reviewer (give --reviewer NAME or a reviewer column)")


def _pair(item: ReviewItem, verdict: str, correction: str | None) -> tuple[str, str] | None:
    target = correction if verdict == "corrected" else item.output if verdict == "correct" else None
    if not target or not item.source.strip():
        return None
    return _tsv_field(item.source), _tsv_field(target)


def import_reviews(log: RequestLog, path: str | Path, corpus: str | Path, *, reviewer: str | None = None,
                   now: float | None = None) -> ImportResult:
    """Validate, then record the reviews in ``path`` and append the reviewed pairs to ``corpus`` (module
    docstring). Raises ``ReviewError`` (nothing changed) or ``LogWriteError`` (log and corpus unchanged)."""
    reviews = read_reviews(path)
    queue = {(r.request_id, r.idx): r for r in log.review_items()}
    _validate(reviews, queue, reviewer)
    result, last = ImportResult(), {}
    for r in reviews:
        key = (r.request_id, r.idx)
        if key in last:
            result.duplicates.append(f"{last[key].where} overridden by {r.where}")
        last[key] = r
    at, records, pairs = time.time() if now is None else now, [], []
    for key, r in last.items():
        item, who = queue[key], r.reviewer or reviewer
        pair = _pair(item, r.verdict, r.correction)
        if pair:
            pairs.append(pair)
        if (item.verdict, item.correction, item.reviewer) == (r.verdict, r.correction, who):
            result.unchanged += 1
            continue
        if item.verdict is None:
            result.recorded += 1
        else:
            result.updated += 1
            result.replaced.append(f"{key[0]}/{key[1]}: {item.verdict} -> {r.verdict}")
        records.append((key[0], key[1], r.verdict, r.correction, who, r.reviewed_at or at))
    corpus = Path(corpus)
    old = corpus.read_text(encoding="utf-8") if corpus.is_file() else ""
    have = set(old.splitlines())
    new = list(dict.fromkeys(f"{s}\t{t}" for s, t in pairs if f"{s}\t{t}" not in have))
    if records:
        log.record_reviews(records)
    if new:
        corpus.parent.mkdir(parents=True, exist_ok=True)
        sep = "" if not old or old.endswith("\n") else "\n"
        atomic_write_text(corpus, old + sep + "\n".join(new) + "\n")
    result.appended = len(new)
    return result


# --------------------------------------------------------------------------- stats


def review_stats(items: Sequence[ReviewItem]) -> dict[str, Any]:
    """Per signal: reviewed flagged answers judged ``wrong`` (wrong or corrected) and ``correct``, with the
    ``precision`` (wrong share; ``None`` before any review); ``sample``: the same for sampled answers
    (its ``wrong_rate``: what the detectors miss); ``queued``/``reviewed`` totals."""
    signals: dict[str, dict[str, Any]] = {}
    sample = {"reviewed": 0, "wrong": 0, "correct": 0}
    for it in items:
        if it.verdict is None:
            continue
        bad = it.verdict in ("wrong", "corrected")
        targets = [sample] if it.reason == "sample" else [
            signals.setdefault(n, {"reviewed": 0, "wrong": 0, "correct": 0}) for n in it.reason.split(",") if n]
        for t in targets:
            t["reviewed"] += 1
            t["wrong" if bad else "correct"] += 1
    for t in signals.values():
        t["precision"] = round(t["wrong"] / t["reviewed"], 4) if t["reviewed"] else None
    sample["wrong_rate"] = round(sample["wrong"] / sample["reviewed"], 4) if sample["reviewed"] else None
    return {"queued": len(items), "reviewed": sum(1 for i in items if i.verdict is not None),
            "signals": dict(sorted(signals.items())), "sample": sample}

