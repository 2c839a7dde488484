"""The request log keeps what was answered: schema version 2 (the answer and its output signals beside
the source), and a version-1 log migrated in place with every row kept."""

from __future__ import annotations

import sqlite3

from aiayn.serving.request_log import SCHEMA_VERSION, SqliteRequestLog, open_request_log

#: The version-1 schema exactly as logs written before output signals hold it.
V1_TABLES = """
    CREATE TABLE requests (
        request_id TEXT PRIMARY KEY, ts REAL NOT NULL, model_name TEXT, model_version TEXT,
        variant TEXT, n_sentences INTEGER NOT NULL, beam_size INTEGER);
    CREATE TABLE sentences (
        request_id TEXT NOT NULL, idx INTEGER NOT NULL, ts REAL NOT NULL, source TEXT NOT NULL,
        source_tokens INTEGER, output_tokens INTEGER, output_chars INTEGER,
        PRIMARY KEY (request_id, idx));
    CREATE INDEX sentences_ts ON sentences (ts);
"""
MODEL = {"name": "m", "version": "1", "variant": "ct2-int8"}


def _v1_log(path, n_requests: int) -> None:
    db = sqlite3.connect(path)
    db.executescript(V1_TABLES)
    for r in range(n_requests):
        db.execute("INSERT INTO requests VALUES (?, ?, 'm', '1', 'ct2-int8', 2, 4)", (f"old{r}", 1000.0 + r))
        for i in range(2):
            db.execute("INSERT INTO sentences VALUES (?, ?, ?, ?, 5, 6, 20)", (f"old{r}", i, 1000.0 + r, f"src {r}.{i}"))
    db.commit()
    db.close()


def test_a_version_1_log_migrates_in_place_and_keeps_every_row(tmp_path):
    path = tmp_path / "requests.db"
    _v1_log(path, 3)
    with open_request_log(path, read_only=True) as old:  # a reader opens it as it is
        assert old.schema_version() == 1
        assert [s.source for s in old.latest(10)] == [f"src {r}.{i}" for r in range(3) for i in range(2)]
        assert old.latest(1)[0].output is None
    with SqliteRequestLog(path) as log:  # a writer migrates it
        assert log.schema_version() == SCHEMA_VERSION == 2
        assert log.counts() == {"requests": 3, "sentences": 6}
        assert log.review_items() == []  # the review queue (an additive table) is there, empty
        log.write("new", ts=2000.0, model=MODEL, beam_size=4, sources=["A dog."], source_tokens=[3],
                  output_tokens=[3], outputs=["Ein Hund."], signals=[{"seq_logprob": -0.4, "copy_rate": 0.0}])
        rows = log.latest(10)
    assert len(rows) == 7 and [r.source for r in rows[:6]] == [f"src {r}.{i}" for r in range(3) for i in range(2)]
    assert all(r.output is None and r.signals is None for r in rows[:6])
    assert (rows[6].output, rows[6].signals) == ("Ein Hund.", {"seq_logprob": -0.4, "copy_rate": 0.0})
    with SqliteRequestLog(path) as again:  # migrating twice changes nothing
        assert again.schema_version() == 2 and again.counts() == {"requests": 4, "sentences": 7}


def test_answers_are_pruned_with_their_sources(tmp_path):
    with SqliteRequestLog(tmp_path / "r.db") as log:
        log.write("a", ts=1000.0, model=MODEL, beam_size=4, sources=["x"], source_tokens=[2], output_tokens=[2],
                  outputs=["Qzxv pruned answer"], signals=[None])
        log.write("b", ts=1e9, model=MODEL, beam_size=4, sources=["p"], source_tokens=[2], output_tokens=[2],
                  outputs=["q"])
        assert log.prune(1.0, now=1e9 + 10) == 1
        assert [(r.source, r.output) for r in log.latest(5)] == [("p", "q")]
    raw = b"".join(f.read_bytes() for f in tmp_path.glob("r.db*"))
    assert b"Qzxv pruned answer" not in raw  # secure_delete and the WAL truncation leave no copy of the answer


def test_a_version_2_log_without_a_review_table_gets_one_and_keeps_its_rows(tmp_path):
    path = tmp_path / "requests.db"
    with SqliteRequestLog(path) as log:
        log.write("a", ts=1000.0, model=MODEL, beam_size=4, sources=["x"], source_tokens=[2], output_tokens=[2],
                  outputs=["y"], signals=[{"copy_rate": 0.0}])
    db = sqlite3.connect(path)
    db.execute("DROP TABLE review")  # as logs written before the review queue are
    db.commit()
    db.close()
    with SqliteRequestLog(path) as log:
        assert log.schema_version() == 2 and log.counts() == {"requests": 1, "sentences": 1}
        assert log.queue([("a", 0, "sample"), ("a", 0, "sample")], queued_at=5.0) == 1
        assert log.queue([("a", 0, "copy_rate")], queued_at=6.0) == 0  # never queued twice
        assert [(i.request_id, i.idx, i.source, i.output, i.reason, i.queued_at) for i in log.review_items()] == \
            [("a", 0, "x", "y", "sample", 5.0)]
