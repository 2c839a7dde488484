"""A version-1 request log in a real PostgreSQL migrates to schema 2 in place, every row kept: what
tests/test_request_log.py checks for SQLite, on the backend ``aiayn serve`` replicas share
(aiayn.serving.request_log.PostgresRequestLog)."""

from __future__ import annotations

import pytest

from aiayn.serving.request_log import SCHEMA_VERSION, PostgresRequestLog, open_request_log

pytestmark = [pytest.mark.services, pytest.mark.slow]

#: The version-1 schema as logs written before output signals hold it (PostgreSQL types).
V1_TABLES = """
    CREATE TABLE requests (
        request_id TEXT PRIMARY KEY, ts DOUBLE PRECISION NOT NULL, model_name TEXT, model_version TEXT,
        variant TEXT, n_sentences INTEGER NOT NULL, beam_size INTEGER);
    CREATE TABLE sentences (
        request_id TEXT NOT NULL, idx INTEGER NOT NULL, ts DOUBLE PRECISION NOT NULL, source TEXT NOT NULL,
        source_tokens INTEGER, output_tokens INTEGER, output_chars INTEGER,
        PRIMARY KEY (request_id, idx));
    CREATE INDEX sentences_ts ON sentences (ts);
"""
MODEL = {"name": "m", "version": "1", "variant": "ct2-int8"}


@pytest.fixture()
def database(tmp_path):
    from support.services import Postgres

    pg = Postgres(tmp_path / "pg")
    pg.start()
    try:
        pg.create_database("serving")
        yield f"postgresql://postgres@127.0.0.1:{pg.port}/serving"
    finally:
        pg.remove()


def _v1_log(url: str, n_requests: int) -> None:
    import psycopg2

    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute(V1_TABLES)
        for r in range(n_requests):
            cur.execute("INSERT INTO requests VALUES (%s, %s, 'm', '1', 'ct2-int8', 2, 4)", (f"old{r}", 1000.0 + r))
            for i in range(2):
                cur.execute("INSERT INTO sentences VALUES (%s, %s, %s, %s, 5, 6, 20)",
                            (f"old{r}", i, 1000.0 + r, f"src {r}.{i}"))
    conn.close()


def test_a_version_1_log_migrates_in_place_and_keeps_every_row(database):
    _v1_log(database, 3)
    old_rows = [f"src {r}.{i}" for r in range(3) for i in range(2)]
    with open_request_log(database, read_only=True) as old:  # a reader opens it as it is
        assert old.schema_version() == 1
        assert [s.source for s in old.latest(10)] == old_rows and old.latest(1)[0].output is None
    with PostgresRequestLog(database) as log:  # a writer migrates it
        assert log.schema_version() == SCHEMA_VERSION == 2
        assert log.counts() == {"requests": 3, "sentences": 6}
        assert log.request_ids() == {f"old{r}": 2 for r in range(3)}
        assert log.review_items() == []  # the review queue (an additive table) is there, empty
        log.write("new", ts=2000.0, model=MODEL, beam_size=4, sources=["A dog."], source_tokens=[3],
                  output_tokens=[3], outputs=["Ein Hund."], signals=[{"seq_logprob": -0.4, "copy_rate": 0.0}])
        rows = log.latest(10)
    assert len(rows) == 7 and [r.source for r in rows[:6]] == old_rows
    assert all(r.output is None and r.signals is None for r in rows[:6])
    assert (rows[6].output, rows[6].signals) == ("Ein Hund.", {"seq_logprob": -0.4, "copy_rate": 0.0})
    assert [(r.source, r.ts, r.model_version) for r in rows[:6]] == \
        [(f"src {r}.{i}", 1000.0 + r, "1") for r in range(3) for i in range(2)]  # every old value, as it was
    with PostgresRequestLog(database) as again:  # migrating twice changes nothing
        assert again.schema_version() == 2 and again.counts() == {"requests": 4, "sentences": 7}
        assert len(again.answers()) == 1  # the old rows kept no answer: the review queue skips them
