"""The human review queue (monitoring.review, `aiayn review`): flagged answers and a seeded sample go to a
translator, their verdicts come back into the request log's review table, their corrections into a TSV
corpus the training pipeline reads. Bad files change nothing; a re-import changes nothing."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aiayn.cli.main import app
from aiayn.config.checks import check_params
from aiayn.config.schema import params_from_dict
from aiayn.data.readers import TsvPairs
from aiayn.serving.request_log import SqliteRequestLog
from monitoring.review import REVIEWED_CORPUS, ReviewError, export_queue, import_reviews, review_stats, select

MODEL = {"name": "m", "version": "1", "variant": "ct2-int8"}
#: A hand-written output reference: low Seq-Logprob and a high copy rate flag.
REFERENCE = {"format": "aiayn-output-reference/1", "false_flag_rate": 0.05, "thresholds": {
    "seq_logprob": {"tail": "low", "low": -1.0, "n": 100, "flag_rate": 0.05},
    "copy_rate": {"tail": "high", "high": 0.5, "n": 100, "flag_rate": 0.05}}}
GOOD = {"seq_logprob": -0.3, "copy_rate": 0.1}
#: request id -> [(source, output, signals)]
ANSWERS = {
    "r1": [("A dog runs.", "Ein Hund rennt.", GOOD), ("A cat sleeps.", "A cat sleeps.", {"seq_logprob": -0.4, "copy_rate": 0.9})],
    "r2": [("Two men talk.", "Zwei Frauen.", {"seq_logprob": -2.5, "copy_rate": 0.1}),
           ("A red car.", "Ein rotes Auto.", GOOD)],
    "r3": [("A child plays.", "Ein Kind spielt.", GOOD), ("Old text.", "Alter Text.", None)],
}


def _project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "artifacts" / "monitor_reference").mkdir(parents=True)
    (root / "artifacts" / "monitor_reference" / "output_reference.json").write_text(json.dumps(REFERENCE))
    (root / "params.yaml").write_text("{}\n")
    with SqliteRequestLog(root / "serving" / "requests.db") as log:
        for n, (rid, rows) in enumerate(ANSWERS.items()):
            log.write(rid, ts=1000.0 + n, model=MODEL, beam_size=4, sources=[r[0] for r in rows],
                      source_tokens=[3] * len(rows), output_tokens=[3] * len(rows), outputs=[r[1] for r in rows],
                      signals=[r[2] for r in rows])
    return root


def _cli(*args: str):
    return CliRunner().invoke(app, ["review", *args])


def _review_rows(root: Path) -> list[tuple]:
    db = sqlite3.connect(root / "serving" / "requests.db")
    try:
        return db.execute("SELECT * FROM review ORDER BY request_id, idx").fetchall()
    finally:
        db.close()


def _label_studio_export(tasks: list[dict], verdicts: dict[tuple[str, int], tuple[str, str | None]]) -> list[dict]:
    """The tasks as Label Studio exports them once annotated (JSON export: a list of tasks with annotations)."""
    out = []
    for task in tasks:
        verdict, correction = verdicts[(task["data"]["request_id"], task["data"]["idx"])]
        result = [{"id": "v1", "from_name": "verdict", "to_name": "output", "type": "choices",
                   "value": {"choices": [verdict]}}]
        if correction is not None:
            result.append({"id": "c1", "from_name": "correction", "to_name": "output", "type": "textarea",
                           "value": {"text": [correction]}})
        out.append({**task, "annotations": [{"id": 7, "completed_by": {"id": 1, "email": "anna@example.org"},
                                             "result": result, "was_cancelled": False,
                                             "created_at": "2026-12-07T12:00:00.000000Z"}],
                    "predictions": []})
    return out


def test_export_queues_flagged_answers_and_a_seeded_sample_once(tmp_path):
    root = _project(tmp_path)
    result = _cli("export", "--root", str(root), "--sample", "0.0", "--out", "out")
    assert result.exit_code == 0, result.output
    assert "queued 2 (2 flagged, 0 sampled) of 5 answers" in result.output
    rows = _review_rows(root)
    assert [(r[0], r[1], r[2]) for r in rows] == [("r1", 1, "copy_rate"), ("r2", 0, "seq_logprob")]
    tsv = (root / "out" / "review.tsv").read_text().splitlines()
    assert tsv[0] == "request_id\tidx\tsource\toutput\treason" and tsv[1] == "r1\t1\tA cat sleeps.\tA cat sleeps.\tcopy_rate"
    tasks = json.loads((root / "out" / "review.json").read_text())
    assert tasks[1] == {"id": 2, "data": {"request_id": "r2", "idx": 0, "source": "Two men talk.",
                                          "output": "Zwei Frauen.", "reason": "seq_logprob"}}
    config = (root / "out" / "label_config.xml").read_text()
    assert all(s in config for s in ('name="verdict"', 'name="correction"', 'name="output"', 'name="source"'))
    again = _cli("export", "--root", str(root), "--sample", "1.0", "--out", "out")  # idempotent; the sample adds the rest
    assert "queued 3 (0 flagged, 3 sampled)" in again.output and "2 already queued" in again.output
    assert _cli("export", "--root", str(root), "--sample", "1.0", "--out", "out").output.startswith("queued 0")
    assert len(_review_rows(root)) == 5


def test_the_sample_is_seeded_per_answer_and_limited(tmp_path):
    root = _project(tmp_path)
    with SqliteRequestLog(root / "serving" / "requests.db") as log:
        a, _ = select(log, REFERENCE["thresholds"], sample=0.5, seed=3)
        assert select(log, REFERENCE["thresholds"], sample=0.5, seed=3)[0] == a
        picked, counts = select(log, REFERENCE["thresholds"], sample=1.0, seed=3, limit=3)
        assert len(picked) == 3 and counts["flagged"] == 2 and picked[2][2] == "sample"  # flagged first


def test_label_studio_round_trip_records_verdicts_and_feeds_the_corpus(tmp_path):
    root = _project(tmp_path)
    assert _cli("export", "--root", str(root), "--sample", "0.0", "--out", "out").exit_code == 0
    tasks = json.loads((root / "out" / "review.json").read_text())
    export = tmp_path / "ls_export.json"
    export.write_text(json.dumps(_label_studio_export(tasks, {("r1", 1): ("correct", None),
                                                              ("r2", 0): ("wrong", "Zwei Männer reden.")})))
    result = _cli("import", str(export), "--root", str(root))
    assert result.exit_code == 0, result.output
    assert "2 recorded, 0 updated, 0 unchanged" in result.output and "2 pair(s) appended" in result.output
    rows = {(r[0], r[1]): r for r in _review_rows(root)}
    assert rows[("r2", 0)][4:7] == ("corrected", "Zwei Männer reden.", "anna@example.org")
    assert rows[("r1", 1)][4:7] == ("correct", None, "anna@example.org")
    assert rows[("r2", 0)][7] == pytest.approx(1796644800.0)  # the annotation's created_at
    corpus = root / REVIEWED_CORPUS
    assert corpus.read_text() == "A cat sleeps.\tA cat sleeps.\nTwo men talk.\tZwei Männer reden.\n"
    before = (corpus.read_bytes(), _review_rows(root))
    again = _cli("import", str(export), "--root", str(root))  # a re-import changes nothing
    assert "0 recorded, 0 updated, 2 unchanged" in again.output and "0 pair(s) appended" in again.output
    assert (corpus.read_bytes(), _review_rows(root)) == before
    # the corpus is a training source the project reads: `aiayn check` accepts it, the TSV reader reads it
    for split in ("val", "test"):
        (corpus.parent / f"{split}.tsv").write_text("A dog.\tEin Hund.\n")
    params = params_from_dict({"data": {"corpus": {"kind": "tsv", "path": str(corpus.parent)}, "valid_split": "val",
                                        "test_splits": ["test"]}, "quantize": {"gate_split": "test"}})
    assert check_params(params, root) == []
    assert [(s, t) for _, s, t in TsvPairs(corpus, "en", "de")] == [("A cat sleeps.", "A cat sleeps."),
                                                                     ("Two men talk.", "Zwei Männer reden.")]
    stats = _cli("stats", "--root", str(root), "--json")
    s = json.loads(stats.output)
    assert s["signals"]["seq_logprob"] == {"reviewed": 1, "wrong": 1, "correct": 0, "precision": 1.0}
    assert s["signals"]["copy_rate"]["precision"] == 0.0 and s["reviewed"] == 2


def test_a_tsv_import_deduplicates_and_updates_an_earlier_verdict(tmp_path):
    root = _project(tmp_path)
    with SqliteRequestLog(root / "serving" / "requests.db") as log:
        export_queue(log, REFERENCE["thresholds"], root / "out", sample=1.0, seed=0)
        first = tmp_path / "first.tsv"
        first.write_text("request_id\tidx\tverdict\tcorrection\nr1\t0\tcorrect\t\n")
        assert import_reviews(log, first, root / REVIEWED_CORPUS, reviewer="bob", now=5.0).recorded == 1
        second = tmp_path / "second.tsv"
        second.write_text("request_id\tidx\tverdict\tcorrection\treviewer\n"
                          "r1\t0\twrong\t\tcarl\n"
                          "r2\t0\tcorrected\tZwei Männer.\t\n"
                          "r2\t0\tcorrected\tZwei Männer reden.\t\n")
        result = import_reviews(log, second, root / REVIEWED_CORPUS, reviewer="bob", now=6.0)
        assert (result.recorded, result.updated, len(result.duplicates)) == (1, 1, 1)
        assert "second.tsv:3 overridden by" in result.duplicates[0] and "r1/0: correct -> wrong" in result.replaced[0]
        items = {(i.request_id, i.idx): i for i in log.review_items()}
        assert (items[("r1", 0)].verdict, items[("r1", 0)].reviewer) == ("wrong", "carl")
        assert (items[("r2", 0)].correction, items[("r2", 0)].reviewer, items[("r2", 0)].reviewed_at) == \
            ("Zwei Männer reden.", "bob", 6.0)
        s = review_stats(log.review_items())
        assert s["sample"] == {"reviewed": 1, "wrong": 1, "correct": 0, "wrong_rate": 1.0}
    # the earlier 'correct' pair stays (the corpus is append-only), the last correction is added once
    assert (root / REVIEWED_CORPUS).read_text().splitlines() == ["A dog runs.\tEin Hund rennt.",
                                                                 "Two men talk.\tZwei Männer reden."]


BAD_FILES = {
    "wrong columns": ("request_id\tidx\tjudgement\n r1\t1\tcorrect\n", r"bad\.tsv:1: wrong columns .*missing \['verdict', 'correction'\]"),
    "unknown request": ("request_id\tidx\tverdict\tcorrection\nr1\t1\tcorrect\t\nzz\t0\tcorrect\t\n", r"bad\.tsv:3: unknown request_id 'zz'"),
    "unknown idx": ("request_id\tidx\tverdict\tcorrection\nr1\t7\tcorrect\t\n", r"bad\.tsv:2: request 'r1' has no idx 7"),
    "bad verdict": ("request_id\tidx\tverdict\tcorrection\nr1\t1\tmaybe\t\n", r"bad\.tsv:2: verdict 'maybe' is not one of"),
    "empty correction": ("request_id\tidx\tverdict\tcorrection\nr1\t1\tcorrect\t\nr2\t0\tcorrected\t \n", r"bad\.tsv:3: verdict 'corrected' with an empty"),
    "short row": ("request_id\tidx\tverdict\tcorrection\nr1\t1\tcorrect\n", r"bad\.tsv:2: 3 columns, the header has 4"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_file_is_refused_naming_the_line_and_changes_nothing(tmp_path, case):
    root = _project(tmp_path)
    assert _cli("export", "--root", str(root), "--sample", "0.0", "--out", "out").exit_code == 0
    corpus = root / REVIEWED_CORPUS
    corpus.parent.mkdir(parents=True)
    corpus.write_text("Old.\tAlt.\n")
    before = (corpus.read_bytes(), _review_rows(root))
    text, message = BAD_FILES[case]
    (tmp_path / "bad.tsv").write_text(text)
    result = _cli("import", str(tmp_path / "bad.tsv"), "--root", str(root), "--reviewer", "bob")
    assert result.exit_code == 2
    import re

    assert re.search(message, result.output), result.output
    assert (corpus.read_bytes(), _review_rows(root)) == before


def test_a_label_studio_task_with_an_empty_correction_is_refused(tmp_path):
    root = _project(tmp_path)
    with SqliteRequestLog(root / "serving" / "requests.db") as log:
        export_queue(log, REFERENCE["thresholds"], root / "out", sample=0.0, seed=0)
        tasks = json.loads((root / "out" / "review.json").read_text())
        bad = tmp_path / "ls.json"
        bad.write_text(json.dumps(_label_studio_export(tasks, {("r1", 1): ("correct", None), ("r2", 0): ("wrong", " ")})))
        with pytest.raises(ReviewError, match=r"ls\.json: task 2 \(id 2\): the correction is empty"):
            import_reviews(log, bad, root / REVIEWED_CORPUS)
        assert all(i.verdict is None for i in log.review_items())
    assert not (root / REVIEWED_CORPUS).exists()


def test_review_rows_are_pruned_with_their_sentences(tmp_path):
    root = _project(tmp_path)
    with SqliteRequestLog(root / "serving" / "requests.db") as log:
        export_queue(log, REFERENCE["thresholds"], root / "out", sample=1.0, seed=0)
        assert log.prune(1.0, now=1001.5 + 86400) == 2  # r1 (ts 1000) and r2 (ts 1001) go
        assert [(i.request_id, i.idx) for i in log.review_items()] == [("r3", 0)]
    assert len(_review_rows(root)) == 1
