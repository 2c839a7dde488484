"""The request log keeps what was answered: WAL, atomic writes and prunes, opened by path or URL; schema
version 2 (the answer and its output signals beside the source), and a version-1 log migrated in place with
every row kept."""

from __future__ import annotations

import sqlite3
import time

import pytest

from support import tiny
from aiayn.serving.app import LogWriteError
from aiayn.serving.request_log import SCHEMA_VERSION, SqliteRequestLog, open_request_log

RequestLog = SqliteRequestLog

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


def test_request_log_is_wal_and_a_failed_write_raises(tmp_path):
    rl = RequestLog(tmp_path / "log.db")
    rl.write("r1", ts=time.time(), model={"name": "m", "version": "1", "variant": "v"}, beam_size=4,
             sources=["a", "b"], source_tokens=[2, 2], output_tokens=[3, 1], outputs=["x y", "z"])
    db = sqlite3.connect(tmp_path / "log.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("SELECT count(*) FROM sentences WHERE request_id='r1'").fetchone()[0] == 2
    with pytest.raises(LogWriteError, match="UNIQUE"):  # the same request id twice: nothing half-written
        rl.write("r1", ts=time.time(), model={}, beam_size=1, sources=["c"], source_tokens=[1], output_tokens=[1], outputs=["c"])
    assert db.execute("SELECT count(*) FROM sentences").fetchone()[0] == 2
    old = time.time() - 40 * 86400
    rl.write("old", ts=old, model={}, beam_size=1, sources=["c"], source_tokens=[1], output_tokens=[1], outputs=["c"])
    assert rl.prune(30) == 1
    assert db.execute("SELECT count(*) FROM requests").fetchone()[0] == 1
    rl.close()


def test_a_failed_prune_rolls_back_and_pruned_text_leaves_the_file(tmp_path):
    """At the log's level: a prune that fails (a trigger raising on DELETE, as a
    full disk would) is rolled back, so later writes succeed and another writer is not locked out;
    a prune that works leaves none of the deleted text in the database or its WAL."""
    path = tmp_path / "log.db"
    rl = RequestLog(path, busy_timeout_ms=2000)
    old = time.time() - 40 * 86400
    rl.write("old", ts=old, model={}, beam_size=1, sources=["zqzq secret caption"], source_tokens=[3],
             output_tokens=[3], outputs=["x"])
    other = sqlite3.connect(path, timeout=2)
    other.execute("CREATE TRIGGER no_delete BEFORE DELETE ON sentences BEGIN SELECT RAISE(ABORT, 'disk full'); END")
    other.commit()
    with pytest.raises(LogWriteError, match="disk full"):
        rl.prune(30)
    rl.write("new", ts=time.time(), model={}, beam_size=1, sources=["a man"], source_tokens=[2], output_tokens=[2],
             outputs=["y"])  # the connection is not left inside the failed transaction
    other.execute("DROP TRIGGER no_delete")  # ...and holds no lock
    other.commit()
    other.close()
    assert rl.counts() == {"requests": 2, "sentences": 2} and rl.request_ids() == {"old": 1, "new": 1}
    assert rl.prune(30) == 1 and rl.counts() == {"requests": 1, "sentences": 1}
    assert [s.source for s in rl.latest(5)] == ["a man"]
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("log.db*"))
    assert b"zqzq secret caption" not in stored
    rl.close()


def test_the_log_is_opened_by_path_or_url_and_read_only_opens_create_nothing(tmp_path):
    from aiayn.serving.request_log import PostgresRequestLog, RequestLogError, open_request_log, redact

    with open_request_log(f"sqlite:///{tmp_path / 'a.db'}") as rl:
        assert isinstance(rl, RequestLog) and rl.counts() == {"requests": 0, "sentences": 0}
    with pytest.raises(RequestLogError, match="no request log"):
        open_request_log(tmp_path / "none.db", read_only=True)
    assert not (tmp_path / "none.db").exists()
    assert redact("postgresql://serving:s3cret@db:5432/serving") == "postgresql://serving:***@db:5432/serving"
    with pytest.raises(RequestLogError) as e:  # nothing listens there: one line, no password
        PostgresRequestLog(f"postgresql://u:s3cret@127.0.0.1:{tiny.free_port()}/x", connect_timeout_s=2)
    assert "s3cret" not in str(e.value) and "***" in str(e.value)
