"""The serving request log: every answered sentence, durable before its answer leaves.

One interface (``RequestLog``), two backends, one schema, owned here: ``aiayn serve`` writes through
it and the drift monitor reads through it (``RequestLog.latest``), so no other module writes SQL
against the log.

- ``SqliteRequestLog`` (the embedded default, a file): WAL mode, ``synchronous=FULL`` (on disk when
  ``write`` returns), a busy timeout for concurrent writers, ``secure_delete`` (pruned rows are
  overwritten with zeros) and a WAL checkpoint-and-truncate after every prune that deleted rows, so
  deleted text is not left in the database or its write-ahead log.
- ``PostgresRequestLog`` (``postgresql://USER:PASSWORD@HOST:PORT/DB``, psycopg2): the log of
  several ``aiayn serve`` replicas. The tables are created under an advisory lock (replicas start
  at once); a write whose connection dropped is retried on another connection, and a primary-key
  conflict on a retry means an earlier attempt had committed, so a sentence is never logged twice.
  Deleted rows stay in PostgreSQL's files until (auto)vacuum reuses their space.

Schema version 2 (``ts``: Unix time, seconds)::

    requests(request_id PK, ts, model_name, model_version, variant, n_sentences, beam_size)
    sentences(request_id, idx, ts, source, source_tokens, output_tokens, output_chars, output, signals,
              PRIMARY KEY (request_id, idx)), index on sentences(ts)
    schema_info(key PK, value): ``schema_version`` -> "2"
    review(request_id, idx, reason, queued_at, verdict, correction, reviewer, reviewed_at,
           PRIMARY KEY (request_id, idx))

``review`` is the human review queue (``monitoring.review``): answers queued for a translator
(``reason``: the signals that flagged it, comma-separated, or ``sample``) and, once judged, the
``verdict`` (``correct``, ``wrong``, ``corrected``), ``correction``, ``reviewer`` and ``reviewed_at``.
It is additive (created by any writer that opens the log, the version stays 2; a log without it has
nothing queued), and its rows are pruned with their sentences.

``output`` is the answer as it was sent, ``signals`` its output signals as JSON
(``aiayn.quality.signals.OutputSignals.as_dict``); both go with their row under the same retention.
A version-1 log (no ``output``/``signals``, no ``schema_info``) is migrated in place when a writer
opens it: the two columns are added (old rows keep ``NULL`` there) and the version recorded, in one
transaction; a reader opens it as it is.

Errors: ``RequestLogError`` (cannot open or read the log; its message names the log, never a
password), ``LogWriteError`` (a write or prune failed and was rolled back: the log is usable).
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiayn.faults import fault_point

__all__ = [
    "RequestLog", "SqliteRequestLog", "PostgresRequestLog", "RequestLogError", "LogWriteError", "LoggedSentence",
    "open_request_log", "is_url", "redact", "SCHEMA_VERSION", "Answer", "ReviewItem", "VERDICTS",
]  # fmt: skip

_TABLES = """
    CREATE TABLE IF NOT EXISTS requests (
        request_id TEXT PRIMARY KEY, ts {real} NOT NULL, model_name TEXT, model_version TEXT,
        variant TEXT, n_sentences INTEGER NOT NULL, beam_size INTEGER);
    CREATE TABLE IF NOT EXISTS sentences (
        request_id TEXT NOT NULL, idx INTEGER NOT NULL, ts {real} NOT NULL, source TEXT NOT NULL,
        source_tokens INTEGER, output_tokens INTEGER, output_chars INTEGER, output TEXT, signals TEXT,
        PRIMARY KEY (request_id, idx));
    CREATE INDEX IF NOT EXISTS sentences_ts ON sentences (ts);
    CREATE TABLE IF NOT EXISTS schema_info (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS review (
        request_id TEXT NOT NULL, idx INTEGER NOT NULL, reason TEXT NOT NULL, queued_at {real} NOT NULL,
        verdict TEXT, correction TEXT, reviewer TEXT, reviewed_at {real}, PRIMARY KEY (request_id, idx));
"""
#: The schema this module writes (module docstring); version 1 had no ``output``, ``signals``, ``schema_info``.
SCHEMA_VERSION = 2
#: Columns version 2 added to ``sentences``, with their SQL type.
_ADDED_COLUMNS = (("output", "TEXT"), ("signals", "TEXT"))
_SENTENCE_COLUMNS = ("request_id, idx, ts, source, source_tokens, output_tokens, output_chars, output, signals")
#: A review's verdicts: the answer was right, wrong (no correction given), or wrong and corrected.
VERDICTS = ("correct", "wrong", "corrected")
_PRUNE_REVIEW = ("DELETE FROM review WHERE EXISTS (SELECT 1 FROM sentences s WHERE s.request_id = review.request_id "
                 "AND s.idx = review.idx AND s.ts < ?)")
_REVIEW_ITEMS = ("SELECT v.request_id, v.idx, s.source, s.output, v.reason, v.queued_at, v.verdict, v.correction, "
                 "v.reviewer, v.reviewed_at FROM review v JOIN sentences s ON s.request_id = v.request_id "
                 "AND s.idx = v.idx ORDER BY v.queued_at, v.request_id, v.idx")
_LATEST = ("SELECT s.source, s.ts, r.model_version, {outputs} FROM sentences s LEFT JOIN requests r "
           "ON r.request_id = s.request_id ORDER BY s.ts DESC, s.request_id DESC, s.idx DESC LIMIT {p}")


class RequestLogError(RuntimeError):
    """The request log cannot be opened or read (one line, naming the log without its password)."""


class LogWriteError(RequestLogError):
    """A write or prune failed; its transaction was rolled back (the request must fail with 503)."""


@dataclass(frozen=True)
class LoggedSentence:
    """One logged sentence: its source text, ``ts`` (Unix seconds), the model version that answered it,
    and (schema 2) the answer and its output signals (``None`` for rows logged before)."""

    source: str
    ts: float
    model_version: str | None
    output: str | None = None
    signals: dict[str, Any] | None = None


@dataclass(frozen=True)
class Answer:
    """One logged answer, addressed by ``(request_id, idx)``, with its output signals (``None``: none kept)."""

    request_id: str
    idx: int
    ts: float
    source: str
    output: str
    signals: dict[str, Any] | None


@dataclass(frozen=True)
class ReviewItem:
    """One answer in the review queue (module docstring); ``verdict`` ``None`` until it is reviewed."""

    request_id: str
    idx: int
    source: str
    output: str | None
    reason: str
    queued_at: float
    verdict: str | None = None
    correction: str | None = None
    reviewer: str | None = None
    reviewed_at: float | None = None


def _rows(request_id: str, ts: float, sources, source_tokens, output_tokens, outputs, signals) -> list[tuple]:
    signals = signals if signals is not None else [None] * len(sources)
    return [(request_id, i, ts, s, st, ot, len(o), o, None if sig is None else json.dumps(sig, allow_nan=False))
            for i, (s, st, ot, o, sig) in enumerate(zip(sources, source_tokens, output_tokens, outputs, signals))]


def _logged(row: tuple) -> LoggedSentence:
    source, ts, version, output, signals = row
    return LoggedSentence(source, ts, version, output, None if signals is None else json.loads(signals))


class RequestLog(ABC):
    """What the service and the drift monitor need from a request log (module docstring)."""

    #: Where the log is, for messages (a path, or a URL without its password).
    location: str

    @abstractmethod
    def write(self, request_id: str, *, ts: float, model: dict[str, Any], beam_size: int, sources: list[str],
              source_tokens: list[int], output_tokens: list[int], outputs: list[str],
              signals: list[dict[str, Any] | None] | None = None) -> None:
        """One transaction: the request row and one row per sentence (``model``: ``name``, ``version``,
        ``variant``; ``signals``: per sentence, its output signals or ``None``). Raises ``LogWriteError``
        (nothing written) on any failure."""

    @abstractmethod
    def schema_version(self) -> int:
        """The schema version of the log as stored (1: before outputs were kept). Raises ``RequestLogError``."""

    @abstractmethod
    def prune(self, retention_days: float, *, now: float | None = None) -> int:
        """Delete requests (and their sentences) older than ``retention_days``; returns requests deleted.
        Raises ``LogWriteError`` after rolling back (the log stays usable for writes)."""

    @abstractmethod
    def latest(self, n: int) -> list[LoggedSentence]:
        """The last ``n`` logged sentences, oldest first. Raises ``RequestLogError``."""

    @abstractmethod
    def counts(self) -> dict[str, int]:
        """``{"requests": ..., "sentences": ...}`` rows in the log. Raises ``RequestLogError``."""

    @abstractmethod
    def request_ids(self) -> dict[str, int]:
        """Every logged request id with its number of logged sentences (checks and audits: the soak
        benchmark, the replica test). Raises ``RequestLogError``."""

    @abstractmethod
    def close(self) -> None:
        """Release the connection(s); the SQLite backend checkpoints its WAL first."""

    @abstractmethod
    def _query(self, body, *, write: bool):
        """``body(q)`` with ``q(sql, args) -> rows`` (``?`` placeholders); ``write``: in one transaction
        (``LogWriteError`` after a rollback), else a read (``RequestLogError``)."""

    def answers(self) -> list[Answer]:
        """Every logged answer that kept its output (schema 2), oldest first. Raises ``RequestLogError``."""
        rows = self._query(lambda q: q("SELECT request_id, idx, ts, source, output, signals FROM sentences "
                                       "WHERE output IS NOT NULL ORDER BY ts, request_id, idx", ()), write=False)
        return [Answer(r, int(i), ts, src, out, None if sig is None else json.loads(sig))
                for r, i, ts, src, out, sig in rows]

    def queue(self, items: list[tuple[str, int, str]], *, queued_at: float) -> int:
        """Queue ``(request_id, idx, reason)`` answers for review in one transaction; an answer already
        queued is left as it is. Returns how many were queued. Raises ``LogWriteError``."""

        def insert(q) -> int:
            have = {(r, int(i)) for r, i in q("SELECT request_id, idx FROM review", ())}
            new = [(r, int(i), why) for r, i, why in dict.fromkeys(items) if (r, int(i)) not in have]
            for r, i, why in new:
                q("INSERT INTO review (request_id, idx, reason, queued_at) VALUES (?, ?, ?, ?)", (r, i, why, queued_at))
            return len(new)

        return self._query(insert, write=True)

    def review_items(self) -> list[ReviewItem]:
        """Every queued answer with its source, output and review so far, in queue order. Raises ``RequestLogError``."""
        rows = self._query(lambda q: q(_REVIEW_ITEMS, ()), write=False)
        return [ReviewItem(r[0], int(r[1]), *r[2:]) for r in rows]

    def record_reviews(self, reviews: list[tuple[str, int, str, str | None, str, float]]) -> None:
        """Record ``(request_id, idx, verdict, correction, reviewer, reviewed_at)`` of queued answers, all in
        one transaction (nothing written on any error: ``LogWriteError``)."""
        bad = [r for r in reviews if r[2] not in VERDICTS]
        if bad:
            raise LogWriteError(f"request log {self.location}: verdict {bad[0][2]!r} is not one of {VERDICTS}")

        def update(q) -> None:
            for rid, idx, verdict, correction, reviewer, at in reviews:
                q("UPDATE review SET verdict = ?, correction = ?, reviewer = ?, reviewed_at = ? "
                  "WHERE request_id = ? AND idx = ?", (verdict, correction, reviewer, at, rid, int(idx)))

        self._query(update, write=True)

    def __enter__(self) -> RequestLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------------- SQLite


class SqliteRequestLog(RequestLog):
    """The request log in one SQLite file (module docstring). ``read_only``: opened with ``mode=ro``
    (never blocks a writer, creates nothing). Raises ``RequestLogError`` when the file cannot be
    opened as a log, ``LogWriteError`` when SQLite refuses WAL mode."""

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = 10_000, read_only: bool = False) -> None:
        self.path = Path(path)
        self.location = str(self.path)
        self._busy_timeout_ms = int(busy_timeout_ms)
        self._lock = threading.Lock()
        try:
            if read_only:
                self._db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                                           timeout=busy_timeout_ms / 1000, check_same_thread=False)
                self._outputs = {c for c, _ in _ADDED_COLUMNS} <= self._columns()
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=busy_timeout_ms / 1000, check_same_thread=False,
                                       isolation_level=None)
            self._db.execute(f"PRAGMA busy_timeout={self._busy_timeout_ms}")
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise LogWriteError(f"{self.path}: SQLite refused WAL mode (got {mode!r})")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA secure_delete=ON")  # deleted text is overwritten, not left in free pages
            self._db.executescript(_TABLES.format(real="REAL"))
            self._transaction(self._migrate)
            self._outputs = True
        except (sqlite3.Error, LogWriteError) as e:
            raise RequestLogError(f"request log {self.path}: {type(e).__name__}: {e}") from None

    def _columns(self) -> set[str]:
        return {row[1] for row in self._db.execute("PRAGMA table_info(sentences)")}

    def _migrate(self, db: sqlite3.Connection) -> None:
        """Version 1 -> 2 in place (module docstring); a no-op on a version-2 log."""
        have = self._columns()
        for name, kind in _ADDED_COLUMNS:
            if name not in have:
                db.execute(f"ALTER TABLE sentences ADD COLUMN {name} {kind}")
        db.execute("INSERT OR REPLACE INTO schema_info VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))

    def schema_version(self) -> int:
        try:
            with self._lock:
                tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                if "schema_info" not in tables:
                    return 1
                row = self._db.execute("SELECT value FROM schema_info WHERE key = 'schema_version'").fetchone()
        except sqlite3.Error as e:
            raise RequestLogError(f"request log {self.path} is unreadable ({type(e).__name__}: {e})") from None
        return int(row[0]) if row else 1

    def write(self, request_id: str, *, ts: float, model: dict[str, Any], beam_size: int, sources: list[str],
              source_tokens: list[int], output_tokens: list[int], outputs: list[str],
              signals: list[dict[str, Any] | None] | None = None) -> None:
        rows = _rows(request_id, ts, sources, source_tokens, output_tokens, outputs, signals)
        head = (request_id, ts, model.get("name"), model.get("version"), model.get("variant"), len(sources), beam_size)
        insert = f"INSERT INTO sentences ({_SENTENCE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        with self._lock:
            self._transaction(lambda db: (db.execute("INSERT INTO requests VALUES (?, ?, ?, ?, ?, ?, ?)", head),
                                          db.executemany(insert, rows), fault_point("request_log.rows_inserted")))

    def prune(self, retention_days: float, *, now: float | None = None) -> int:
        cutoff = (time.time() if now is None else now) - retention_days * 86400

        def delete(db: sqlite3.Connection) -> int:
            db.execute(_PRUNE_REVIEW, (cutoff,))
            db.execute("DELETE FROM sentences WHERE ts < ?", (cutoff,))
            return db.execute("DELETE FROM requests WHERE ts < ?", (cutoff,)).rowcount

        with self._lock:
            n = self._transaction(delete)
            if n:
                self._truncate_wal()
        return n

    def _transaction(self, body):
        """``body(db)`` inside ``BEGIN IMMEDIATE`` ... ``COMMIT``; on any error ROLLBACK, then
        ``LogWriteError`` (the connection is never left inside a transaction)."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                out = body(self._db)
                self._db.execute("COMMIT")
                return out
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
                raise
        except (sqlite3.Error, ValueError, OSError) as e:  # ValueError: text SQLite cannot encode; OSError: a full disk
            raise LogWriteError(f"request log {self.path}: {type(e).__name__}: {e}") from None

    def _query(self, body, *, write: bool):
        def q(sql: str, args: tuple) -> list[tuple]:
            return self._db.execute(sql, args).fetchall()

        with self._lock:
            if write:
                return self._transaction(lambda db: body(q))
            try:
                return body(q)
            except sqlite3.Error as e:
                raise RequestLogError(f"request log {self.path} is unreadable ({type(e).__name__}: {e})") from None

    def _truncate_wal(self) -> None:
        """Checkpoint the WAL into the database and truncate it (the deleted rows' old frames go with
        it). Best effort with a short busy timeout: a reader holding an old snapshot postpones it to
        the next prune, and requests are never held up for long."""
        with contextlib.suppress(sqlite3.Error):
            self._db.execute("PRAGMA busy_timeout=200")
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            finally:
                self._db.execute(f"PRAGMA busy_timeout={self._busy_timeout_ms}")

    def latest(self, n: int) -> list[LoggedSentence]:
        try:
            with self._lock:
                outputs = "s.output, s.signals" if self._outputs else "NULL, NULL"
                rows = self._db.execute(_LATEST.format(outputs=outputs, p="?"), (int(n),)).fetchall()
        except sqlite3.Error as e:
            raise RequestLogError(f"request log {self.path} is unreadable ({type(e).__name__}: {e})") from None
        return [_logged(r) for r in reversed(rows)]

    def counts(self) -> dict[str, int]:
        try:
            with self._lock:
                return {"requests": self._db.execute("SELECT count(*) FROM requests").fetchone()[0],
                        "sentences": self._db.execute("SELECT count(*) FROM sentences").fetchone()[0]}
        except sqlite3.Error as e:
            raise RequestLogError(f"request log {self.path} is unreadable ({type(e).__name__}: {e})") from None

    def request_ids(self) -> dict[str, int]:
        try:
            with self._lock:
                rows = self._db.execute("SELECT request_id, count(*) FROM sentences GROUP BY request_id").fetchall()
        except sqlite3.Error as e:
            raise RequestLogError(f"request log {self.path} is unreadable ({type(e).__name__}: {e})") from None
        return dict(rows)

    def close(self) -> None:
        with self._lock:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._db.close()


# --------------------------------------------------------------------------- PostgreSQL


_URL = re.compile(r"^(postgres(?:ql)?)(\+psycopg2)?://", re.IGNORECASE)


def is_url(target: str | Path) -> bool:
    """True for a PostgreSQL URL (``postgresql://``, ``postgres://``, ``postgresql+psycopg2://``)."""
    return isinstance(target, str) and bool(_URL.match(target))


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages and logs)."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


class PostgresRequestLog(RequestLog):
    """The request log in a PostgreSQL database, shared by several service replicas (module docstring).

    ``url``: ``postgresql://USER[:PASSWORD]@HOST[:PORT]/DB`` (``+psycopg2`` accepted). Connections
    come from a small thread-safe pool (``max_connections``; more callers at once wait for one). Raises ``RequestLogError`` when
    psycopg2 is missing or the database cannot be reached.
    """

    def __init__(self, url: str, *, max_connections: int = 4, connect_timeout_s: int = 10,
                 read_only: bool = False) -> None:
        try:
            import psycopg2
            import psycopg2.pool
        except ImportError:
            raise RequestLogError("a PostgreSQL request log needs psycopg2 (pip install psycopg2-binary)") from None
        self._pg = psycopg2
        self.location = redact(url)
        dsn = _URL.sub("postgresql://", url)
        self._max_connections = max(1, max_connections)
        self._slots = threading.BoundedSemaphore(self._max_connections)  # the pool raises when empty: wait instead
        try:
            self._pool = psycopg2.pool.ThreadedConnectionPool(1, max(1, max_connections), dsn,
                                                              connect_timeout=connect_timeout_s)
        except psycopg2.Error as e:
            raise RequestLogError(f"request log {self.location}: cannot connect: {_line(e)}") from None
        if not read_only:
            try:
                self._run(self._create, retry=True)
            except LogWriteError as e:
                raise RequestLogError(str(e)) from None

    @staticmethod
    def _create(cur) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext('aiayn.serving.request_log'))")  # replicas start together
        cur.execute(_TABLES.format(real="DOUBLE PRECISION"))
        for name, kind in _ADDED_COLUMNS:  # version 1 -> 2 in place (module docstring)
            cur.execute(f"ALTER TABLE sentences ADD COLUMN IF NOT EXISTS {name} {kind}")
        cur.execute("INSERT INTO schema_info VALUES ('schema_version', %s) ON CONFLICT (key) DO UPDATE "
                    "SET value = EXCLUDED.value", (str(SCHEMA_VERSION),))

    def _run(self, body, *, retry: bool, conflict_means_done: bool = False):
        """``body(cursor)`` in one transaction on a pooled connection. A dropped connection is closed
        and, with ``retry``, the transaction run again on the next one (at most once per pooled
        connection, plus one on a fresh connection); with ``conflict_means_done`` a unique violation on
        a retry means an earlier attempt committed. Other errors roll back and raise ``LogWriteError``."""
        with self._slots:
            return self._attempts(body, retry=retry, conflict_means_done=conflict_means_done)

    def _attempts(self, body, *, retry: bool, conflict_means_done: bool):
        pg = self._pg
        attempts = self._max_connections + 1 if retry else 1  # after a restart every pooled connection is dead
        for attempt in range(attempts):
            conn = None
            try:
                conn = self._pool.getconn()
                with conn, conn.cursor() as cur:  # commit, or rollback on an exception
                    out = body(cur)
                self._pool.putconn(conn)
                return out
            except (pg.OperationalError, pg.InterfaceError) as e:  # the connection is gone
                if conn is not None:
                    with contextlib.suppress(Exception):
                        self._pool.putconn(conn, close=True)
                if attempt == attempts - 1:
                    raise LogWriteError(f"request log {self.location}: {_line(e)}") from None
            except pg.errors.UniqueViolation as e:
                self._pool.putconn(conn)
                if attempt and conflict_means_done:
                    return None
                raise LogWriteError(f"request log {self.location}: UNIQUE constraint failed: {_line(e)}") from None
            except (pg.Error, ValueError) as e:  # ValueError: text PostgreSQL cannot store (NUL)
                if conn is not None:
                    self._pool.putconn(conn)
                raise LogWriteError(f"request log {self.location}: {type(e).__name__}: {_line(e)}") from None
        raise AssertionError("unreachable")

    def write(self, request_id: str, *, ts: float, model: dict[str, Any], beam_size: int, sources: list[str],
              source_tokens: list[int], output_tokens: list[int], outputs: list[str],
              signals: list[dict[str, Any] | None] | None = None) -> None:
        from psycopg2.extras import execute_values

        rows = _rows(request_id, ts, sources, source_tokens, output_tokens, outputs, signals)
        head = (request_id, ts, model.get("name"), model.get("version"), model.get("variant"), len(sources), beam_size)

        def insert(cur) -> None:
            cur.execute("INSERT INTO requests VALUES (%s, %s, %s, %s, %s, %s, %s)", head)
            execute_values(cur, f"INSERT INTO sentences ({_SENTENCE_COLUMNS}) VALUES %s", rows)

        self._run(insert, retry=True, conflict_means_done=True)

    def prune(self, retention_days: float, *, now: float | None = None) -> int:
        cutoff = (time.time() if now is None else now) - retention_days * 86400

        def delete(cur) -> int:
            cur.execute(_PRUNE_REVIEW.replace("?", "%s"), (cutoff,))
            cur.execute("DELETE FROM sentences WHERE ts < %s", (cutoff,))
            cur.execute("DELETE FROM requests WHERE ts < %s", (cutoff,))
            return cur.rowcount

        return self._run(delete, retry=True)

    def latest(self, n: int) -> list[LoggedSentence]:
        def select(cur):
            cur.execute("SELECT column_name FROM information_schema.columns WHERE table_name = 'sentences'")
            have = {r[0] for r in cur.fetchall()}
            outputs = "s.output, s.signals" if {c for c, _ in _ADDED_COLUMNS} <= have else "NULL, NULL"
            cur.execute(_LATEST.format(outputs=outputs, p="%s"), (int(n),))
            return cur.fetchall()

        try:
            rows = self._run(select, retry=True)
        except LogWriteError as e:
            raise RequestLogError(f"{e} (unreadable)") from None
        return [_logged(r) for r in reversed(rows)]

    def schema_version(self) -> int:
        def select(cur):
            cur.execute("SELECT to_regclass('schema_info') IS NOT NULL")
            if not cur.fetchone()[0]:
                return 1
            cur.execute("SELECT value FROM schema_info WHERE key = 'schema_version'")
            row = cur.fetchone()
            return int(row[0]) if row else 1

        try:
            return self._run(select, retry=True)
        except LogWriteError as e:
            raise RequestLogError(f"{e} (unreadable)") from None

    def counts(self) -> dict[str, int]:
        def count(cur):
            cur.execute("SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM sentences)")
            return cur.fetchone()

        try:
            r, s = self._run(count, retry=True)
        except LogWriteError as e:
            raise RequestLogError(f"{e} (unreadable)") from None
        return {"requests": int(r), "sentences": int(s)}

    def request_ids(self) -> dict[str, int]:
        def select(cur):
            cur.execute("SELECT request_id, count(*) FROM sentences GROUP BY request_id")
            return cur.fetchall()

        try:
            return {rid: int(n) for rid, n in self._run(select, retry=True)}
        except LogWriteError as e:
            raise RequestLogError(f"{e} (unreadable)") from None

    def _query(self, body, *, write: bool):
        def run(cur):
            def q(sql: str, args: tuple) -> list[tuple]:
                cur.execute(sql.replace("?", "%s"), args)
                return cur.fetchall() if cur.description else []

            return body(q)

        if write:
            return self._run(run, retry=True)
        try:
            return self._run(run, retry=True)
        except LogWriteError as e:
            raise RequestLogError(f"{e} (unreadable)") from None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._pool.closeall()


def _line(e: BaseException) -> str:
    return " ".join(str(e).split())


def open_request_log(target: str | Path, *, busy_timeout_ms: int = 10_000, read_only: bool = False) -> RequestLog:
    """The log at ``target``: a PostgreSQL URL (``is_url``), ``sqlite:///PATH``, or a file path (SQLite).

    Raises ``RequestLogError`` when it cannot be opened (for ``read_only`` SQLite also when the file
    is missing).
    """
    if is_url(target):
        return PostgresRequestLog(str(target), read_only=read_only)
    path = Path(str(target).removeprefix("sqlite:///")) if str(target).startswith("sqlite:///") else Path(target)
    if read_only and not path.is_file():
        raise RequestLogError(f"no request log at {path}")
    return SqliteRequestLog(path, busy_timeout_ms=busy_timeout_ms, read_only=read_only)
