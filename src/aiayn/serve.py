"""``aiayn serve``: an HTTP translation service with dynamic micro-batching and a durable input log.

Endpoints (JSON unless noted):

- ``POST /translate`` ``{"sentences": [str, ...], "beam_size"?: int}`` ->
  ``{"translations": [...], "model": {"name", "version", "variant"}, "request_id"}``
- ``GET /health`` (the process is alive), ``GET /ready`` (a model is loaded: 200, else 503),
  ``GET /metadata`` (the bundle's model card + the served version), ``GET /metrics`` (Prometheus
  text: requests, errors, latency and batch-size histograms, tokens in/out).

How a request is served:

1. The body is read with a byte limit (413 over ``max_body_bytes``), must be ``application/json``
   (415), valid JSON (400) shaped like the request above (400/422 naming the field), and hold at
   most ``max_request_tokens`` source tokens after tokenization (422): nothing invalid ever reaches
   the model, and no single request can hold the decoder for long.
2. ``Translator.prepare`` applies ``aiayn translate``'s input rules (blank line -> empty output,
   unknown characters dropped, long lines split at sentence/clause/word boundaries under
   ``long_policy="split"``) on that request alone.
3. Its decoder units join a **micro-batch** (``MicroBatcher``): the first waiting request opens a
   batch, which closes at ``max_batch_sentences`` units or after ``max_wait_ms`` (at once when no
   other request is queued or decoding: a lone client pays no batching delay); batches from
   different requests decode together (grouped by decoding options) in ``workers`` threads. If a
   merged batch fails, each request of it is decoded alone, so a failure stays with its request.
4. Every answered sentence is written to the **request log** (``RequestLog``: SQLite in WAL mode,
   one transaction per request, busy timeout for concurrent writers) *before* the response is
   sent; when the log cannot be written the request fails with 503 (nothing answered goes unlogged).
   Rows older than ``retention_days`` are deleted at start and on every poll.

Model: ``--bundle PATH`` (a serving bundle, ``aiayn.export``) or a registry URI
``models:/NAME@ALIAS`` (default ``models:/aiayn-en-de@champion``). With an alias the service polls
the registry every ``poll_s`` seconds; when the alias moves it loads the new version beside the old
one and swaps: requests in flight finish on the model they started with, none is dropped.

Shutdown (SIGTERM/SIGINT, uvicorn's graceful shutdown): stop accepting, finish requests in flight,
stop the batcher, close the log (WAL checkpoint).

Choice of batching: a small asyncio queue in front of the model rather than LitServe: the service
needs per-request input rules, the durable log before each response and model swaps, which sit
naturally in one FastAPI app; LitServe batches inside its own worker processes (see
docs/benchmarks.md, serving load, for the measured throughput vs. calling the model directly).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import Request  # runtime name: FastAPI reads the endpoint's annotation

from aiayn.decoders import DecodeOptions
from aiayn.translate import InputError, Translator

__all__ = ["ServeConfig", "RequestLog", "LogWriteError", "MicroBatcher", "ServedModel", "create_app", "serve"]

log = logging.getLogger("aiayn.serve")

DEFAULT_MODEL_URI = "models:/aiayn-en-de@champion"


@dataclass(frozen=True)
class ServeConfig:
    """Service settings (CLI flags of ``aiayn serve``). Units: seconds, milliseconds, bytes, days."""

    bundle: Path | None = None  # a serving bundle folder; else model_uri
    model_uri: str = DEFAULT_MODEL_URI  # models:/NAME@ALIAS (polled) or models:/NAME/VERSION
    tracking_uri: str | None = None  # registry; default MLFLOW_TRACKING_URI, else sqlite:///mlflow.db
    host: str = "127.0.0.1"
    port: int = 8080
    max_batch_sentences: int = 32  # units per micro-batch
    max_wait_ms: float = 5.0  # how long a batch waits for more requests once opened
    workers: int = 1  # batches decoding at once (CTranslate2 bundles: workers of one thread each)
    threads: int = 1  # CTranslate2 inter_threads per worker / torch threads for an eager bundle
    max_sentences: int = 64  # per request
    max_body_bytes: int = 256 * 1024
    max_request_tokens: int = 2048  # source tokens (with EOS) per request: bounds one request's decode time
    max_beam_size: int = 8
    long_policy: str = "split"
    poll_s: float = 30.0  # registry alias polling interval (0: never)
    log_path: Path = Path("serving") / "requests.db"
    retention_days: float = 30.0
    busy_timeout_ms: int = 10_000


# --------------------------------------------------------------------------- request log


class LogWriteError(RuntimeError):
    """The request log could not be written (the request must fail with 503)."""


class RequestLog:
    """Durable log of every answered request: SQLite in WAL mode, safe with concurrent writers.

    Tables: ``requests(request_id PK, ts, model_name, model_version, variant, n_sentences,
    beam_size)`` and ``sentences(request_id, idx, ts, source, source_tokens, output_tokens,
    output_chars)``; ``ts`` is Unix time (seconds). ``write`` commits one transaction per request
    (``synchronous=FULL``: on disk when it returns) and raises ``LogWriteError`` on any failure.
    The drift monitor reads ``sentences``.
    """

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = 10_000) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, timeout=busy_timeout_ms / 1000, check_same_thread=False,
                                   isolation_level=None)
        self._db.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise LogWriteError(f"{self.path}: SQLite refused WAL mode (got {mode!r})")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript("""
            CREATE TABLE IF NOT EXISTS requests (
                request_id TEXT PRIMARY KEY, ts REAL NOT NULL, model_name TEXT, model_version TEXT,
                variant TEXT, n_sentences INTEGER NOT NULL, beam_size INTEGER);
            CREATE TABLE IF NOT EXISTS sentences (
                request_id TEXT NOT NULL, idx INTEGER NOT NULL, ts REAL NOT NULL, source TEXT NOT NULL,
                source_tokens INTEGER, output_tokens INTEGER, output_chars INTEGER,
                PRIMARY KEY (request_id, idx));
            CREATE INDEX IF NOT EXISTS sentences_ts ON sentences (ts);
        """)

    def write(self, request_id: str, *, ts: float, model: dict[str, Any], beam_size: int, sources: list[str],
              source_tokens: list[int], output_tokens: list[int], outputs: list[str]) -> None:
        """One transaction: the request row and one row per sentence. Raises ``LogWriteError``."""
        rows = [(request_id, i, ts, s, st, ot, len(o))
                for i, (s, st, ot, o) in enumerate(zip(sources, source_tokens, output_tokens, outputs))]
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    self._db.execute("INSERT INTO requests VALUES (?, ?, ?, ?, ?, ?, ?)",
                                     (request_id, ts, model.get("name"), model.get("version"), model.get("variant"),
                                      len(sources), beam_size))
                    self._db.executemany("INSERT INTO sentences VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
                    self._db.execute("COMMIT")
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                    raise
        except sqlite3.Error as e:
            raise LogWriteError(f"request log {self.path}: {type(e).__name__}: {e}") from None

    def prune(self, retention_days: float, *, now: float | None = None) -> int:
        """Delete requests (and their sentences) older than ``retention_days``; returns requests deleted."""
        cutoff = (time.time() if now is None else now) - retention_days * 86400
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM sentences WHERE ts < ?", (cutoff,))
            n = self._db.execute("DELETE FROM requests WHERE ts < ?", (cutoff,)).rowcount
            self._db.execute("COMMIT")
        return n

    def close(self) -> None:
        with self._lock:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._db.close()


# --------------------------------------------------------------------------- model + batching


@dataclass
class ServedModel:
    """A loaded bundle and what the responses say about it."""

    translator: Translator
    options: DecodeOptions
    name: str
    version: str
    variant: str
    card: dict[str, Any] = field(default_factory=dict)
    download_dir: Path | None = None  # registry download (deleted once another version is served)

    @property
    def public(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "variant": self.variant}


def load_served_model(bundle: Path, *, version: str, threads: int) -> ServedModel:
    from aiayn.export import BundlePredictor

    p = BundlePredictor(bundle, threads=threads)
    card_path = Path(bundle) / "model_card.json"
    card = json.loads(card_path.read_text(encoding="utf-8")) if card_path.is_file() else {}
    return ServedModel(p.translator, p.options, card.get("name", "aiayn"), version, p.info["variant"], card)


@dataclass
class _Item:
    model: ServedModel
    options: DecodeOptions
    units: list[np.ndarray]
    future: asyncio.Future


class MicroBatcher:
    """Dynamic micro-batching across concurrent requests (see the module doc).

    ``submit(model, units, options)`` -> output ids per unit. ``observe(n)`` is called with each
    decoded batch's unit count (the batch-size histogram).
    """

    def __init__(self, *, max_batch: int, max_wait_s: float, workers: int,
                 observe: Callable[[int], None] = lambda n: None) -> None:
        if max_batch < 1 or max_wait_s < 0 or workers < 1:
            raise ValueError(f"max_batch >= 1, max_wait_s >= 0, workers >= 1 expected, got {max_batch}, {max_wait_s}, {workers}")
        self.max_batch, self.max_wait_s, self.workers = max_batch, max_wait_s, workers
        self.observe = observe
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="aiayn-decode")
        self._slots = asyncio.Semaphore(workers)
        self._task: asyncio.Task | None = None
        self._inflight: set[asyncio.Task] = set()
        self._outstanding = 0  # submitted requests not yet answered (queued or decoding)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Decode what is queued, wait for batches in flight, then stop."""
        while not self._queue.empty() or self._inflight:
            await asyncio.sleep(0.01)
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._executor.shutdown(wait=True)

    async def submit(self, model: ServedModel, units: list[np.ndarray], options: DecodeOptions) -> list[list[int]]:
        if not units:
            return []
        fut = asyncio.get_running_loop().create_future()
        self._outstanding += 1
        try:
            await self._queue.put(_Item(model, options, units, fut))
            return await fut
        finally:
            self._outstanding -= 1

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._slots.acquire()  # a worker is free: open the next batch
            item = await self._queue.get()
            batch, n = [item], len(item.units)
            deadline = loop.time() + self.max_wait_s
            while n < self.max_batch:
                if self._queue.empty():
                    if self._outstanding <= len(batch):
                        break  # no other request anywhere (queued or decoding): waiting only adds latency
                    left = deadline - loop.time()
                    if left <= 0:
                        break
                    try:
                        nxt = await asyncio.wait_for(self._queue.get(), left)
                    except TimeoutError:
                        break
                else:
                    nxt = self._queue.get_nowait()
                batch.append(nxt)
                n += len(nxt.units)
            task = loop.create_task(self._decode(batch))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _decode(self, batch: list[_Item]) -> None:
        loop = asyncio.get_running_loop()
        try:
            groups: dict[tuple[int, DecodeOptions], list[_Item]] = {}
            for it in batch:
                groups.setdefault((id(it.model), it.options), []).append(it)
            for items in groups.values():
                units = [u for it in items for u in it.units]
                self.observe(len(units))
                try:
                    ids = await loop.run_in_executor(self._executor, items[0].model.translator.decoder.translate_ids,
                                                     units, items[0].options)
                except Exception:  # noqa: BLE001 - isolate: each request of the failed batch alone
                    for it in items:
                        try:
                            one = await loop.run_in_executor(self._executor, it.model.translator.decoder.translate_ids,
                                                             it.units, it.options)
                        except Exception as e:  # noqa: BLE001
                            if not it.future.done():
                                it.future.set_exception(e)
                        else:
                            if not it.future.done():
                                it.future.set_result(one)
                    continue
                k = 0
                for it in items:
                    if not it.future.done():
                        it.future.set_result(ids[k : k + len(it.units)])
                    k += len(it.units)
        finally:
            self._slots.release()


# --------------------------------------------------------------------------- the app


def _registry_uri(cfg: ServeConfig) -> str:
    """The tracking module's rule: ``--tracking-uri``, else ``MLFLOW_TRACKING_URI``, else ./mlflow.db."""
    from aiayn.tracking import resolve_tracking_uri

    return resolve_tracking_uri(Path(".").resolve(), cfg.tracking_uri)


def _parse_model_uri(uri: str) -> tuple[str, str | None, str | None]:
    """``models:/NAME@ALIAS`` -> (name, alias, None); ``models:/NAME/VERSION`` -> (name, None, version)."""
    if not uri.startswith("models:/"):
        raise ValueError(f"model URI must look like models:/NAME@ALIAS or models:/NAME/VERSION, got {uri!r}")
    rest = uri[len("models:/"):]
    if "@" in rest:
        name, alias = rest.split("@", 1)
        return name, alias, None
    name, _, version = rest.partition("/")
    if not name or not version:
        raise ValueError(f"model URI must look like models:/NAME@ALIAS or models:/NAME/VERSION, got {uri!r}")
    return name, None, version


class _State:
    def __init__(self, cfg: ServeConfig) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.cfg = cfg
        self.model: ServedModel | None = None
        self.log: RequestLog | None = None
        self.batcher: MicroBatcher | None = None
        self.tmp = tempfile.TemporaryDirectory(prefix="aiayn-serve-")
        self.registry = CollectorRegistry()
        self.requests = Counter("aiayn_requests", "Translate requests answered, by HTTP status", ["status"],
                                registry=self.registry)
        self.errors = Counter("aiayn_errors", "Failed translate requests, by kind", ["kind"], registry=self.registry)
        self.latency = Histogram("aiayn_request_latency_seconds", "Translate request latency (seconds)",
                                 registry=self.registry,
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.batch_size = Histogram("aiayn_batch_sentences", "Units (sentences) per decoded micro-batch",
                                    registry=self.registry, buckets=(1, 2, 4, 8, 16, 32, 64, 128))
        self.tokens_in = Counter("aiayn_tokens_in", "Source tokens translated (with EOS)", registry=self.registry)
        self.tokens_out = Counter("aiayn_tokens_out", "Target tokens generated", registry=self.registry)


def _load(cfg: ServeConfig, state: _State) -> ServedModel:
    if cfg.bundle is not None:
        return load_served_model(cfg.bundle, version="local", threads=cfg.threads)
    from aiayn.tracking import download_registered_bundle

    name, alias, version = _parse_model_uri(cfg.model_uri)
    dst = Path(state.tmp.name) / uuid.uuid4().hex
    if alias is None:
        raise ValueError("models:/NAME/VERSION is not supported yet: use models:/NAME@ALIAS or --bundle")
    ver, bundle = download_registered_bundle(name, alias, tracking_uri=_registry_uri(cfg), dst=dst)
    m = load_served_model(bundle, version=ver, threads=cfg.threads)
    return replace(m, name=name, download_dir=dst)


async def _poll(cfg: ServeConfig, state: _State) -> None:
    """Every ``poll_s``: prune the log; when the alias moved, load the new version and swap."""
    from aiayn.tracking import registered_version

    name, alias, _ = _parse_model_uri(cfg.model_uri)
    while True:
        await asyncio.sleep(cfg.poll_s)
        try:
            if state.log is not None:
                await asyncio.to_thread(state.log.prune, cfg.retention_days)
            if cfg.bundle is not None or alias is None:
                continue
            ver = await asyncio.to_thread(registered_version, name, alias, tracking_uri=_registry_uri(cfg))
            if state.model is not None and ver != state.model.version:
                new = await asyncio.to_thread(_load, cfg, state)
                old, state.model = state.model, new  # requests in flight keep their own reference
                log.info("serving %s version %s (was %s)", name, new.version, old.version if old else None)
                if old is not None and old.download_dir is not None:  # its weights are in memory already
                    await asyncio.to_thread(shutil.rmtree, old.download_dir, True)
        except Exception as e:  # noqa: BLE001 - keep serving the loaded model
            log.warning("registry poll failed (still serving version %s): %s",
                        state.model.version if state.model else None, e)


def create_app(cfg: ServeConfig):
    """The FastAPI app: model loaded and log opened here (errors raise: ``BundleError``,
    ``aiayn.tracking.RegistryError``, ``LogWriteError``, ``sqlite3.Error``), batcher and registry
    polling started in its lifespan."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, Response
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    state = _State(cfg)
    # before the server starts, so a bad bundle, an unreachable registry or an unwritable log stops
    # `aiayn serve` with one message instead of a half-started service
    state.log = RequestLog(cfg.log_path, busy_timeout_ms=cfg.busy_timeout_ms)
    state.log.prune(cfg.retention_days)
    state.model = _load(cfg, state)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state.batcher = MicroBatcher(max_batch=cfg.max_batch_sentences, max_wait_s=cfg.max_wait_ms / 1000,
                                     workers=cfg.workers, observe=state.batch_size.observe)
        state.batcher.start()
        poller = asyncio.get_running_loop().create_task(_poll(cfg, state)) if cfg.poll_s > 0 else None
        log.info("serving %s version %s (%s) on http://%s:%d", state.model.name, state.model.version,
                 state.model.variant, cfg.host, cfg.port)
        try:
            yield
        finally:
            if poller:
                poller.cancel()
            await state.batcher.stop()
            state.log.close()
            state.tmp.cleanup()

    app = FastAPI(title="aiayn translation service", lifespan=lifespan)
    app.state.aiayn = state

    def error(status: int, kind: str, message: str) -> JSONResponse:
        state.errors.labels(kind).inc()
        state.requests.labels(str(status)).inc()
        return JSONResponse({"error": kind, "detail": message}, status_code=status)

    from starlette.exceptions import HTTPException

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        """Routing errors (404 unknown path, 405 wrong method) answered like every other error, and counted."""
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http")
        response = error(exc.status_code, kind, f"{request.method} {request.url.path}: {exc.detail}")
        response.headers.update(exc.headers or {})  # 405 keeps its Allow header
        return response

    @app.get("/health")
    async def health() -> dict:
        return {"status": "alive"}

    @app.get("/ready")
    async def ready():
        if state.model is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        return {"status": "ready", "model": state.model.public}

    @app.get("/metadata")
    async def metadata():
        if state.model is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        return {"model": state.model.public, "card": state.model.card}

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/translate")
    async def translate(request: Request):
        t0 = time.perf_counter()
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            return error(415, "content_type", f"Content-Type must be application/json, got {ctype or 'none'!r}")
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > cfg.max_body_bytes:
            return error(413, "too_large", f"request body of {declared} bytes is over the limit of {cfg.max_body_bytes}")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > cfg.max_body_bytes:
                return error(413, "too_large", f"request body is over the limit of {cfg.max_body_bytes} bytes")
        try:
            payload = json.loads(body.decode("utf-8"))
        except UnicodeDecodeError as e:
            return error(400, "invalid_json", f"request body is not UTF-8 ({e.reason} at byte {e.start})")
        except json.JSONDecodeError as e:
            return error(400, "invalid_json", f"request body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}")
        problem = _validate(payload, cfg)
        if problem:
            return error(422 if problem[0] == "invalid_field" else 400, *problem)
        model = state.model
        if model is None:
            return error(503, "not_ready", "the model is still loading")
        sentences: list[str] = payload["sentences"]
        options = replace(model.options, beam_size=payload.get("beam_size") or model.options.beam_size)
        try:
            prepared = model.translator.prepare(sentences, options, long=cfg.long_policy)
        except InputError as e:
            return error(400, "input", str(e))
        src_tokens = [sum(len(u) for u in prepared.units[a:b]) for a, b in prepared.spans]  # per input line
        n_tokens = sum(src_tokens)
        if n_tokens > cfg.max_request_tokens:  # one huge request would hold every other one behind it
            return error(422, "too_many_tokens", f"the request has {n_tokens} source tokens (with EOS), over the "
                         f"limit of {cfg.max_request_tokens} per request: send fewer or shorter sentences")
        try:
            ids = await state.batcher.submit(model, prepared.units, options)
        except Exception as e:  # noqa: BLE001 - a decoding failure answers 500 for this request only
            log.exception("decoding failed")
            return error(500, "decode", f"{type(e).__name__}: {e}")
        outputs = model.translator.output_lines(prepared.spans, ids)
        request_id = uuid.uuid4().hex
        out_tokens = [sum(len(h) for h in ids[a:b]) for a, b in prepared.spans]
        try:
            await asyncio.to_thread(state.log.write, request_id, ts=time.time(), model=model.public,
                                    beam_size=options.beam_size, sources=sentences, source_tokens=src_tokens,
                                    output_tokens=out_tokens, outputs=outputs)
        except LogWriteError as e:
            log.error("%s", e)
            return error(503, "log", f"the request log could not be written, so the answer is withheld: {e}")
        state.tokens_in.inc(sum(src_tokens))
        state.tokens_out.inc(sum(out_tokens))
        state.requests.labels("200").inc()
        state.latency.observe(time.perf_counter() - t0)
        return {"translations": outputs, "model": model.public, "request_id": request_id}

    return app


def _validate(payload: Any, cfg: ServeConfig) -> tuple[str, str] | None:
    """``(error kind, message)`` for a malformed request body, None when it is fine."""
    if not isinstance(payload, dict):
        return "invalid_body", f"expected a JSON object {{\"sentences\": [...]}}, got {type(payload).__name__}"
    unknown = set(payload) - {"sentences", "beam_size"}
    if unknown:
        return "invalid_field", f"unknown field(s) {sorted(unknown)}; expected 'sentences' and optional 'beam_size'"
    if "sentences" not in payload:
        return "invalid_field", "missing field 'sentences' (a list of source sentences)"
    s = payload["sentences"]
    if not isinstance(s, list):
        return "invalid_field", f"'sentences' must be a list of strings, got {type(s).__name__}"
    if not s:
        return "invalid_field", "'sentences' is empty: send at least one sentence"
    if len(s) > cfg.max_sentences:
        return "invalid_field", f"'sentences' has {len(s)} items, over the limit of {cfg.max_sentences} per request"
    for i, x in enumerate(s):
        if not isinstance(x, str):
            return "invalid_field", f"'sentences'[{i}] must be a string, got {type(x).__name__}"
    if "beam_size" in payload and payload["beam_size"] is not None:
        b = payload["beam_size"]
        if not isinstance(b, int) or isinstance(b, bool) or not 1 <= b <= cfg.max_beam_size:
            return "invalid_field", f"'beam_size' must be an integer from 1 to {cfg.max_beam_size}, got {b!r}"
    return None


def serve(cfg: ServeConfig) -> None:
    """Run the service until SIGTERM/SIGINT (uvicorn's graceful shutdown; see the module doc)."""
    import uvicorn

    uvicorn.run(create_app(cfg), host=cfg.host, port=cfg.port, log_level="info", timeout_graceful_shutdown=30)
