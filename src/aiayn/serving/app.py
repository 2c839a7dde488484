"""``aiayn serve``: an HTTP translation service with dynamic micro-batching and a durable request log.

Endpoints (JSON unless noted):

- ``POST /translate`` ``{"sentences": [str, ...], "beam_size"?: int, "n_best"?: int}`` ->
  ``{"translations": [...], "scores": [...], "model": {"name", "version", "variant"}, "request_id"}``
  plus, with ``n_best``, ``"nbest": [[{"translation", "score"}, ...], ...]`` (per sentence, best
  first). A score is the length-normalised log-probability (``aiayn.inference.translator.ScoredLine``).
  ``--no-scores`` (``ServeConfig.scores``) leaves ``"scores"`` out of answers without ``n_best``.
- ``GET /health`` (the process is alive; never waits on decoding), ``GET /ready`` (a model is
  loaded and the service is not draining: 200, else 503), ``GET /metadata`` (the bundle's model
  card + the served version), ``GET /metrics`` (Prometheus text: requests by status, errors by
  kind, latency and batch-size histograms, tokens in/out, failed prunes, answers flagged per output signal
  by the output reference's thresholds: ``aiayn.serving.output_flags``).

How a request is served:

1. ``aiayn.serving.schemas``: the body within ``max_body_bytes`` (413) and ``body_timeout_s`` (408), as
   ``application/json`` (415), valid JSON shaped like the request above (400/422 naming the field).
2. The token limit, checked first and cheaply (one tokenizer pass over the cleaned lines: pieces
   without the unknown ones, plus EOS per line; 422 over ``max_request_tokens``), then
   ``Translator.prepare`` (``aiayn translate``'s input rules; long lines split), both in a worker
   thread: the event loop, and with it ``/health``, never waits on a large request.
3. The units join a **micro-batch** (``aiayn.serving.microbatch.MicroBatcher``), decoded with
   ``Decoder.translate_hyps`` (the 1-best of ``translate_ids`` plus scores; a CTranslate2 bundle
   scores its outputs in a second, teacher-forced pass, ``aiayn.inference.runtimes``: ~1.2x the decode time at
   beam 4, docs/results.md#eager-beam-search-against-ctranslate2), or with ``--no-scores``
   ``translate_ids`` alone. While it waits and decodes, the connection is watched: a client that hangs
   up gets its request dropped (from the queue, or its result discarded), answered 499 in the metrics
   and never logged as served.
4. Every answered sentence is written to the **request log** (``aiayn.serving.request_log``: SQLite, or
   PostgreSQL shared by replicas) *before* the response is sent; when it cannot be written the
   request fails with 503 (nothing answered goes unlogged). Server logs hold counts and request
   ids, never request text: the text lives only in the request log.
5. Retention runs on its own timer (``prune_every_s``, default a tenth of ``retention_days``, 1 s to
   1 h), whatever ``poll_s`` is. A prune that fails is rolled back and logged once (then again only
   after it has worked in between); requests keep being answered and logged.

Model: ``--bundle PATH`` (a serving bundle, ``aiayn.export.bundle``) or a registry URI
``models:/NAME@ALIAS`` (default ``models:/aiayn-en-de@champion``). With an alias the service polls
the registry every ``poll_s`` seconds; when the alias moves it loads the new version beside the old
one and swaps: requests in flight finish on the model they started with, none is dropped.

Shutdown (SIGTERM/SIGINT): stop accepting, cut request bodies still arriving (503, so a slow or
stalled client cannot hold the drain), finish requests in flight (at most ``drain_s`` seconds:
uvicorn's graceful timeout), stop the batcher, close the log. ``serve`` takes the listening socket
from ``aiayn.serving.schemas.listen`` (bound before the model loads: a taken port is one line, exit 2).

Choice of batching: a small asyncio queue in front of the model rather than LitServe: the service
needs per-request input rules, the durable log before each response and model swaps, which sit
naturally in one FastAPI app; LitServe batches inside its own worker processes (see
docs/results.md#serving-load for the measured throughput vs. calling the model directly).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import shutil
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from fastapi import Request  # runtime name: FastAPI reads the endpoint's annotation

from aiayn.config.schema import UNK_ID
from aiayn.inference.search import Hypothesis
from aiayn.inference.runtimes import DecodeOptions
from aiayn.quality.signals import SIGNALS, LanguageScorer, line_signals
from aiayn.serving.config import ServeConfig
from aiayn.serving.microbatch import MicroBatcher
from aiayn.serving.model_source import ServedModel, load_model, parse_model_uri, registry_uri
from aiayn.serving.output_flags import count_flags, read_output_reference, thresholds_for
from aiayn.serving.request_log import LogWriteError, RequestLog, open_request_log
from aiayn.serving.schemas import RequestError, TranslateRequest, parse_request, read_body, request_model
from aiayn.inference.text import clean_line
from aiayn.inference.translator import InputError, PreparedInput, ScoredLine, Translator

__all__ = ["ServeConfig", "LogWriteError", "MicroBatcher", "ServedModel", "create_app", "serve"]

log = logging.getLogger("aiayn.serving.app")

# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class _Job:
    """What a micro-batch decodes: the options and how many hypotheses per unit (requests that share
    both share batches)."""

    options: DecodeOptions
    n_best: int
    scores: bool = True


def _decode_hyps(model: ServedModel, units: list[np.ndarray], job: _Job) -> list:
    """Per unit, its hypotheses: scored (``Decoder.translate_hyps``) unless ``job.scores`` is off, then
    the 1-best alone (``translate_ids``, no scoring pass) with a NaN score."""
    decoder = model.translator.decoder
    if not job.scores:
        return [[Hypothesis(tokens, math.nan, math.nan)] for tokens in decoder.translate_ids(units, job.options)]
    return decoder.translate_hyps(units, job.options, n_best=job.n_best)


# --------------------------------------------------------------------------- state, registry, retention


class _State:
    def __init__(self, cfg: ServeConfig) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.cfg = cfg
        self.model: ServedModel | None = None
        self.log: RequestLog | None = None
        self.batcher: MicroBatcher | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.draining = False
        self.readers: set = set()  # deadlines of request bodies being read (expired when draining starts)
        self.prune_failing = False
        self.tmp = tempfile.TemporaryDirectory(prefix="aiayn-serve-")
        self.request_model = request_model(max_sentences=cfg.max_sentences, max_beam_size=cfg.max_beam_size)
        self.registry = CollectorRegistry()
        self.requests = Counter("aiayn_requests", "Translate requests answered, by HTTP status (499: the "
                                "client hung up)", ["status"], registry=self.registry)
        self.errors = Counter("aiayn_errors", "Failed translate requests, by kind", ["kind"], registry=self.registry)
        self.latency = Histogram("aiayn_request_latency_seconds", "Translate request latency (seconds)",
                                 registry=self.registry,
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.batch_size = Histogram("aiayn_batch_sentences", "Units (sentences) per decoded micro-batch",
                                    registry=self.registry, buckets=(1, 2, 4, 8, 16, 32, 64, 128))
        self.tokens_in = Counter("aiayn_tokens_in", "Source tokens translated (with EOS)", registry=self.registry)
        self.tokens_out = Counter("aiayn_tokens_out", "Target tokens generated", registry=self.registry)
        self.decoding = Gauge("aiayn_requests_decoding", "Translate requests accepted and not yet decoded (waiting in "
                              "the micro-batch queue or decoding)", registry=self.registry)
        self.prune_failures = Counter("aiayn_log_prune_failures", "Request-log prunes that failed (rolled back)",
                                      registry=self.registry)
        self._output_metrics()
        self._language: LanguageScorer | None = None
        self._language_lock = threading.Lock()

    def _output_metrics(self) -> None:
        """The flagged-answer counters and their gauge (``aiayn.serving.output_flags``), every signal at 0."""
        from prometheus_client import Counter, Gauge

        self.reference: dict[str, Any] | None = None
        self.judged = Counter("aiayn_judged_answers", "Answered sentences judged by the output reference's "
                              "thresholds", registry=self.registry)
        self.flagged = Counter("aiayn_flagged_answers", "Judged answers flagged, by output signal",
                               ["signal"], registry=self.registry)
        for name in SIGNALS:
            self.flagged.labels(name)
        self.thresholds_missing = Gauge("aiayn_output_thresholds_missing", "1: no output thresholds for the served "
                                        "model (no output reference, or one calibrated on another model), so no "
                                        "answer is judged", registry=self.registry)
        self.thresholds_missing.set(1)

    def adopt(self, model: ServedModel) -> ServedModel:
        """``model`` with the output thresholds that judge its answers (``None`` when the reference was not
        calibrated on it); sets the gauge for it, the model about to be served."""
        thresholds = thresholds_for(self.reference, model.digests)
        self.thresholds_missing.set(0 if thresholds is not None else 1)
        return replace(model, output_thresholds=thresholds)

    def language(self) -> LanguageScorer:
        """py3langid's model for the output-language signal, loaded on first use (~1 s), once."""
        with self._language_lock:
            if self._language is None:
                self._language = LanguageScorer()
            return self._language

    def begin_drain(self) -> None:
        """Shutdown started (called from the signal handler's thread): refuse new bodies, and expire
        every body still arriving so its request is answered 503 at once."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        self.draining = True
        now = asyncio.get_running_loop().time()
        for deadline in list(self.readers):
            deadline.reschedule(now)

    def prune(self) -> None:
        """One retention pass (module doc, step 5): logs the first failure of a run of failures only."""
        try:
            n = self.log.prune(self.cfg.retention_days)
        except LogWriteError as e:
            self.prune_failures.inc()
            if not self.prune_failing:
                log.warning("request log: pruning rows older than %g days failed and was rolled back; requests "
                            "are still answered and logged, pruning is retried every %g s: %s",
                            self.cfg.retention_days, self.cfg.prune_interval_s, e)
            self.prune_failing = True
            return
        if self.prune_failing:
            log.info("request log: pruning works again")
        self.prune_failing = False
        if n:
            log.info("request log: pruned %d request(s) older than %g days", n, self.cfg.retention_days)


async def _poll(cfg: ServeConfig, state: _State) -> None:
    """Every ``poll_s``: when the alias moved, load the new version and swap."""
    from aiayn.tracking import registered_version

    name, alias, _ = parse_model_uri(cfg.model_uri)
    if cfg.bundle is not None or alias is None:
        return
    while True:
        await asyncio.sleep(cfg.poll_s)
        try:
            ver = await asyncio.to_thread(registered_version, name, alias, tracking_uri=registry_uri(cfg))
            if state.model is not None and ver != state.model.version:
                new = state.adopt(await asyncio.to_thread(load_model, cfg, state.tmp.name))
                old, state.model = state.model, new  # requests in flight keep their own reference
                log.info("serving %s version %s (was %s)", name, new.version, old.version if old else None)
                if old is not None and old.download_dir is not None:  # its weights are in memory already
                    await asyncio.to_thread(shutil.rmtree, old.download_dir, True)
        except Exception as e:  # noqa: BLE001 - keep serving the loaded model
            log.warning("registry poll failed (still serving version %s): %s",
                        state.model.version if state.model else None, e)


async def _retention(cfg: ServeConfig, state: _State) -> None:
    """Retention on its own timer (module doc, step 5)."""
    while True:
        await asyncio.sleep(cfg.prune_interval_s)
        await asyncio.to_thread(state.prune)


# --------------------------------------------------------------------------- one request


def _count_tokens(translator: Translator, sentences: list[str]) -> list[int]:
    """Per sentence, its source tokens as the limit counts them: the pieces of the cleaned line that
    are not unknown, plus EOS (0 for a blank line). One tokenizer pass: linear in the text."""
    encoded = translator.tokenizer.encode([" ".join(clean_line(s).split()) for s in sentences])
    return [sum(1 for i in ids if i != UNK_ID) + 1 if ids else 0 for ids in encoded]


def _prepare(model: ServedModel, sentences: list[str], options: DecodeOptions, cfg: ServeConfig) -> PreparedInput:
    """Token limit first, then ``Translator.prepare`` (run in a worker thread). Raises ``RequestError``."""
    n_tokens = sum(_count_tokens(model.translator, sentences))
    if n_tokens > cfg.max_request_tokens:  # one huge request would hold every other one behind it
        raise RequestError(422, "too_many_tokens", f"the request has {n_tokens} source tokens (with EOS), over the "
                           f"limit of {cfg.max_request_tokens} per request: send fewer or shorter sentences")
    try:
        return model.translator.prepare(sentences, options, long=cfg.long_policy, warn_unknown=False)
    except InputError as e:
        raise RequestError(400, "input", str(e)) from None


async def _client_gone(request: Request) -> None:
    """Returns when the client has disconnected (the body was read: the next ASGI message is the
    disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _decode_while_connected(state: _State, request: Request, model: ServedModel,
                                  prepared: PreparedInput, job: _Job) -> list | None:
    """The units' hypotheses, or None when the client hung up first (its work dropped: module doc)."""
    decode = asyncio.ensure_future(state.batcher.submit(model, prepared.units, job))
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait({decode, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not decode.done():
            decode.cancel()
    if gone.done():
        return None
    gone.cancel()
    return decode.result()


def _answer(model: ServedModel, req: TranslateRequest, job: _Job, prepared: PreparedInput,
            hyps: list, request_id: str) -> tuple[dict[str, Any], list[int]]:
    """The response body and each sentence's output tokens (1-best)."""
    tr = model.translator
    lines: list[list[ScoredLine]] = tr.scored_lines(prepared.spans, hyps, len_penalty=job.options.len_penalty)
    body: dict[str, Any] = {"translations": [ln[0].text for ln in lines]}
    if job.scores:
        body["scores"] = [_finite(ln[0].score) for ln in lines]
    body |= {"model": model.public, "request_id": request_id}
    if req.n_best is not None:
        body["nbest"] = [[{"translation": s.text, "score": _finite(s.score)} for s in ln] for ln in lines]
    out_tokens = [sum(len(hyps[k][0].tokens) for k in range(a, b) if hyps[k]) for a, b in prepared.spans]
    return body, out_tokens


def _log_answer(state: _State, model: ServedModel, request_id: str, req: TranslateRequest, prepared: PreparedInput,
                hyps: list, job: _Job, answer: dict[str, Any], src_tokens: list[int], out_tokens: list[int]) -> None:
    """The request's row and one per sentence, with the answer and its output signals
    (``aiayn.quality.signals``), then counts the flagged ones (``aiayn.serving.output_flags``); raises
    ``LogWriteError`` (nothing counted)."""
    signals = line_signals(prepared.spans, prepared.units, hyps, answer["translations"], scored=job.scores,
                           target_lang=model.target_lang, language=state.language()) \
        if state.cfg.output_signals else [None] * len(req.sentences)
    state.log.write(request_id, ts=time.time(), model=model.public, beam_size=job.options.beam_size,
                    sources=[clean_line(s) for s in req.sentences], source_tokens=src_tokens,
                    output_tokens=out_tokens, outputs=answer["translations"], signals=signals)
    count_flags(signals, model.output_thresholds, judged=state.judged, flagged=state.flagged)


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


# --------------------------------------------------------------------------- the app


def create_app(cfg: ServeConfig):
    """The FastAPI app: model loaded and log opened here (errors raise: ``BundleError``,
    ``aiayn.tracking.RegistryError``, ``aiayn.serving.request_log.RequestLogError``, ``ValueError`` for an
    unusable ``output_reference``), batcher, registry
    polling and retention started in its lifespan."""
    from fastapi import FastAPI

    state = _State(cfg)
    # before the server starts, so a bad bundle, an unreachable registry or an unwritable log stops
    # `aiayn serve` with one message instead of a half-started service
    state.log = open_request_log(cfg.log_target, busy_timeout_ms=cfg.busy_timeout_ms)
    state.prune()
    state.reference = read_output_reference(cfg.output_reference)
    state.model = state.adopt(load_model(cfg, state.tmp.name))
    state.language()  # the output-language signal's model, before the first request

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state.loop = asyncio.get_running_loop()
        state.batcher = MicroBatcher(max_batch=cfg.max_batch_sentences, max_wait_s=cfg.max_wait_ms / 1000,
                                     workers=cfg.workers, observe=state.batch_size.observe, decode=_decode_hyps)
        state.batcher.start()
        tasks = [state.loop.create_task(_retention(cfg, state))]
        if cfg.poll_s > 0:
            tasks.append(state.loop.create_task(_poll(cfg, state)))
        log.info("serving %s version %s (%s) on http://%s:%d; request log %s", state.model.name,
                 state.model.version, state.model.variant, cfg.host, cfg.port, state.log.location)
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            await state.batcher.stop()
            state.log.close()
            state.tmp.cleanup()

    app = FastAPI(title="aiayn translation service", lifespan=lifespan)
    app.state.aiayn = state
    _info_routes(app, state)
    _translate_route(app, state)
    return app


def _error(state: _State, status: int, kind: str, message: str, *, close: bool = False):
    from fastapi.responses import JSONResponse

    state.errors.labels(kind).inc()
    state.requests.labels(str(status)).inc()
    return JSONResponse({"error": kind, "detail": message}, status_code=status,
                        headers={"connection": "close"} if close else None)


def _info_routes(app, state: _State) -> None:
    from fastapi.responses import JSONResponse, Response
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.exceptions import HTTPException

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        """Routing errors (404 unknown path, 405 wrong method) answered like every other error, and counted."""
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http")
        response = _error(state, exc.status_code, kind, f"{request.method} {request.url.path}: {exc.detail}")
        response.headers.update(exc.headers or {})  # 405 keeps its Allow header
        return response

    @app.get("/health")
    async def health() -> dict:
        return {"status": "alive"}

    @app.get("/ready")
    async def ready():
        if state.model is None or state.draining:
            return JSONResponse({"status": "draining" if state.draining else "loading"}, status_code=503)
        return {"status": "ready", "model": state.model.public}

    @app.get("/metadata")
    async def metadata():
        if state.model is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        return {"model": state.model.public, "card": state.model.card}

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)


def _translate_route(app, state: _State) -> None:
    cfg = state.cfg

    @app.post("/translate")
    async def translate(request: Request):
        t0 = time.perf_counter()
        request_id = uuid.uuid4().hex
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            return _error(state, 415, "content_type", f"Content-Type must be application/json, got {ctype or 'none'!r}")
        model = state.model
        try:
            if state.draining:
                raise RequestError(503, "shutting_down", "the service is shutting down: retry (another replica)")
            body = await read_body(request.stream(), declared=request.headers.get("content-length"),
                                   limit=cfg.max_body_bytes, timeout_s=cfg.body_timeout_s, readers=state.readers)
            req = parse_request(body, state.request_model)
            if model is None:
                raise RequestError(503, "not_ready", "the model is still loading")
            options = replace(model.options, beam_size=req.beam_size or model.options.beam_size)
            job = _Job(options, req.n_best or 1, scores=cfg.scores or req.n_best is not None)
            if job.n_best > options.beam_size:
                raise RequestError(422, "invalid_field", f"'n_best' ({job.n_best}) must not exceed the beam size "
                                   f"({options.beam_size}): ask for a larger 'beam_size'")
            prepared = await asyncio.to_thread(_prepare, model, req.sentences, options, cfg)
        except RequestError as e:
            if e.status == 408 and state.draining:
                e = RequestError(503, "shutting_down", "the service is shutting down: retry (another replica)")
            return _error(state, e.status, e.kind, e.message, close=e.status in (408, 503))
        if prepared.report.unknown_lines:  # counts and the id only: the text stays in the request log
            log.warning("request %s: %d of %d line(s) held %d run(s) of characters the tokenizer does not know "
                        "(left out)", request_id, prepared.report.unknown_lines, prepared.report.lines,
                        sum(prepared.report.unknown_chars.values()))
        state.decoding.inc()
        try:
            hyps = await _decode_while_connected(state, request, model, prepared, job)
        except Exception as e:  # noqa: BLE001 - a decoding failure answers 500 for this request only
            log.exception("request %s: decoding failed", request_id)
            return _error(state, 500, "decode", f"{type(e).__name__}: {e}")
        finally:
            state.decoding.dec()
        if hyps is None:
            return _error(state, 499, "client_gone", "the client hung up before the answer was ready")
        answer, out_tokens = _answer(model, req, job, prepared, hyps, request_id)
        src_tokens = [sum(len(u) for u in prepared.units[a:b]) for a, b in prepared.spans]
        try:
            await asyncio.to_thread(_log_answer, state, model, request_id, req, prepared, hyps, job, answer,
                                    src_tokens, out_tokens)
        except LogWriteError as e:
            log.error("request %s: %s", request_id, e)
            return _error(state, 503, "log", f"the request log could not be written, so the answer is withheld: {e}")
        state.tokens_in.inc(sum(src_tokens))
        state.tokens_out.inc(sum(out_tokens))
        state.requests.labels("200").inc()
        state.latency.observe(time.perf_counter() - t0)
        return answer


def serve(cfg: ServeConfig, sock: socket.socket | None = None) -> None:
    """Run the service until SIGTERM/SIGINT (module doc: draining). ``sock``: an already listening
    socket (``aiayn.serving.schemas.listen``); None binds ``cfg.host:cfg.port`` here."""
    import uvicorn

    app = create_app(cfg)
    state: _State = app.state.aiayn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            state.begin_drain()

    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level="info",
                            timeout_graceful_shutdown=cfg.drain_s)
    Server(config).run(sockets=[sock] if sock is not None else None)
