"""The edge of ``aiayn serve``: the listening socket, the request body and the ``POST /translate`` schema.

Nothing here loads a model (``aiayn serve`` binds its port with ``listen`` before it loads one), and
nothing a client sends reaches the model before passing through here:

- ``read_body``: the body within ``max_body_bytes`` (413) and within a deadline (408), cut at once
  with 503 when the service starts draining for shutdown;
- ``parse_request``: UTF-8 (400), JSON (400: malformed, numbers over Python's 4,300-digit limit,
  nesting deeper than the parser's recursion limit) shaped as ``TranslateRequest`` (pydantic, strict:
  400 for a non-object, 422 naming the field otherwise; 400 naming ``sentences[i]`` for a lone
  UTF-16 surrogate, which no UTF-8 text can hold).

Errors: ``RequestError(status, kind, message)``, answered as ``{"error": kind, "detail": message}``.
"""

from __future__ import annotations

import asyncio
import errno
import json
import re
import socket
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator
from pydantic_core import PydanticCustomError

__all__ = ["RequestError", "TranslateRequest", "request_model", "parse_request", "read_body", "listen"]

_SURROGATE = re.compile(r"[\ud800-\udfff]")


class RequestError(Exception):
    """A request refused before decoding: HTTP ``status``, error ``kind`` and a one-line ``message``."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


class TranslateRequest(BaseModel):
    """``POST /translate``'s body. ``sentences``: source sentences, one per item; ``beam_size``: the
    bundle's when absent (1 = greedy); ``n_best``: answer the N best hypotheses of each sentence with
    their scores (at most ``beam_size``). Limits come from ``request_model``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    sentences: list[str] = Field(min_length=1)
    beam_size: int | None = Field(None, ge=1)
    n_best: int | None = Field(None, ge=1)

    @field_validator("sentences")
    @classmethod
    def _no_lone_surrogates(cls, sentences: list[str]) -> list[str]:
        for i, s in enumerate(sentences):
            if m := _SURROGATE.search(s):
                raise PydanticCustomError("lone_surrogate", f"sentences[{i}] holds a lone UTF-16 surrogate "
                                          f"(\\u{ord(m.group()):04x} at character {m.start()}): not a Unicode "
                                          "character, send valid text")
        return sentences


def request_model(*, max_sentences: int, max_beam_size: int) -> type[TranslateRequest]:
    """``TranslateRequest`` with the service's limits: at most ``max_sentences`` sentences and
    ``beam_size``/``n_best`` at most ``max_beam_size``."""
    return create_model("TranslateRequest", __base__=TranslateRequest, __module__=__name__,
                        sentences=(list[str], Field(min_length=1, max_length=max_sentences)),
                        beam_size=(int | None, Field(None, ge=1, le=max_beam_size)),
                        n_best=(int | None, Field(None, ge=1, le=max_beam_size)))


def parse_request(body: bytes, model: type[TranslateRequest]) -> TranslateRequest:
    """Decode, parse and validate a request body. Raises ``RequestError`` (400/422, see the module doc)."""
    try:
        payload = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise RequestError(400, "invalid_json", f"request body is not UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise RequestError(400, "invalid_json",
                           f"request body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except ValueError as e:  # an integer literal over Python's int_max_str_digits
        raise RequestError(400, "invalid_json", f"request body is not usable JSON: {e}".split(";")[0]) from None
    except RecursionError:
        raise RequestError(400, "invalid_json", "request body is not usable JSON: arrays or objects nested "
                                                "too deeply") from None
    try:
        return model.model_validate(payload)
    except ValidationError as e:
        raise _explain(e.errors(), payload, model) from None


def _explain(errors: list[dict[str, Any]], payload: Any, model: type[TranslateRequest]) -> RequestError:
    """The one error a client sees for a malformed body, most basic first (the old hand-written order)."""
    fields = list(model.model_fields)
    if not isinstance(payload, dict):
        return RequestError(400, "invalid_body",
                            f"expected a JSON object {{\"sentences\": [...]}}, got {type(payload).__name__}")
    extra = sorted(str(err["loc"][0]) for err in errors if err["type"] == "extra_forbidden")
    if extra:
        return RequestError(422, "invalid_field", f"unknown field(s) {extra}; expected 'sentences' and optional "
                            + ", ".join(repr(f) for f in fields[1:]))
    for err in errors:
        loc, kind = err["loc"], err["type"]
        if loc[0] != "sentences":
            continue
        if kind == "missing":
            return RequestError(422, "invalid_field", "missing field 'sentences' (a list of source sentences)")
        if kind == "lone_surrogate":
            return RequestError(400, "invalid_text", err["msg"])
        if len(loc) > 1:
            return RequestError(422, "invalid_field",
                                f"sentences[{loc[1]}] must be a string, got {type(err['input']).__name__}")
        if kind == "too_short":
            return RequestError(422, "invalid_field", "'sentences' is empty: send at least one sentence")
        if kind == "too_long":
            return RequestError(422, "invalid_field", f"'sentences' has {len(err['input'])} items, over the limit "
                                f"of {err['ctx']['max_length']} per request")
        return RequestError(422, "invalid_field",
                            f"'sentences' must be a list of strings, got {type(err['input']).__name__}")
    err = errors[0]
    name, most = err["loc"][0], model.model_fields[str(err["loc"][0])].metadata
    high = next((m.le for m in most if getattr(m, "le", None) is not None), None)
    return RequestError(422, "invalid_field",
                        f"'{name}' must be an integer from 1 to {high}, got {err['input']!r:.40}")


async def read_body(receive_stream, *, declared: str | None, limit: int, timeout_s: float,
                    readers: set | None = None) -> bytes:
    """The request body from ``receive_stream`` (Starlette's ``request.stream()``).

    ``declared``: the Content-Length header (413 at once when over ``limit``). The whole body must
    arrive within ``timeout_s`` seconds (else 408; a client that hangs up meanwhile: 499); the deadline (an ``asyncio.Timeout``) sits in
    ``readers`` while reading, so a draining service can expire every pending read at once
    (``RequestError`` 503 then: the caller checks its draining flag). Raises ``RequestError``.
    """
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, "too_large", f"request body of {declared} bytes is over the limit of {limit}")
    from starlette.requests import ClientDisconnect

    body = bytearray()
    try:
        async with asyncio.timeout(timeout_s) as deadline:
            if readers is not None:
                readers.add(deadline)
            try:
                async for chunk in receive_stream:
                    body += chunk
                    if len(body) > limit:
                        raise RequestError(413, "too_large", f"request body is over the limit of {limit} bytes")
            finally:
                if readers is not None:
                    readers.discard(deadline)
    except TimeoutError:
        raise RequestError(408, "body_timeout", f"the request body did not arrive within {timeout_s:g} s") from None
    except ClientDisconnect:
        raise RequestError(499, "client_gone", "the client hung up while sending the request body") from None
    return bytes(body)


def listen(host: str, port: int, *, backlog: int = 2048) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``SO_REUSEADDR``, as uvicorn binds), made before any
    model loads. Raises ``OSError`` with a one-line message naming the port when it is taken or
    cannot be bound."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise OSError(f"cannot listen on {host}:{port}: unknown host ({e.strerror})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(backlog)
    except OSError as e:
        sock.close()
        why = "the port is already in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
        raise OSError(f"cannot listen on {host}:{port}: {why}") from None
    sock.set_inheritable(True)
    return sock
