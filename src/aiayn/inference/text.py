"""Input text for translation: bytes -> lines, line clean-up, long-line splitting, safe output lines.

The one place that decides what a "line" of translation input is, shared by ``aiayn translate``,
the ``evaluate`` stage (through ``aiayn.inference.translator.Translator``) and the serving path. Pure Python
(no torch, no sentencepiece): ``aiayn.inference.translator`` applies the tokenizer-dependent rules (blank,
unknown and over-long input) on top of these.

Rules:

- Bytes are decoded as UTF-8 whatever the locale (a leading byte-order mark is dropped). Invalid
  UTF-8 raises ``InputError`` naming the line (1-based), the byte offset in that line (0-based) and
  in the file; ``errors="replace"`` turns each bad sequence into U+FFFD instead.
- Only ``\\n`` ends a line (a ``\\r`` before it is dropped, so ``\\r\\n`` files work); a final
  newline does not start another line. U+2028, U+2029, U+0085, form feed, vertical tab, a lone
  ``\\r`` and every other control character are *inside* a line: ``clean_line`` turns them into
  spaces (``str.splitlines`` would split on most of them).
- N lines in -> N lines out: ``output_line`` makes sure no translation contains a line break.

Errors: ``InputError`` (a ``ValueError``) whose message names the source and the place.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

__all__ = [
    "InputError",
    "LONG_POLICIES",
    "UNK_PLACEHOLDER",
    "decode_input",
    "split_lines",
    "read_input",
    "clean_line",
    "output_line",
    "split_long",
]

log = logging.getLogger("aiayn")

#: What to do with a line longer than the model accepts: refuse (naming it), cut it, or translate it in pieces.
LONG_POLICIES = ("error", "truncate", "split")

#: sentencepiece's detokenized form of the unknown piece (U+2047 DOUBLE QUESTION MARK); never in our output.
UNK_PLACEHOLDER = "\u2047"


class InputError(ValueError):
    """Translation input is unusable (bad bytes, an over-long line under ``long="error"``); names the place."""


# --------------------------------------------------------------------------- bytes -> lines


def decode_input(data: bytes, *, errors: str = "strict", source: str = "<stdin>") -> str:
    """UTF-8 bytes -> text (a leading BOM dropped). ``errors``: ``"strict"`` or ``"replace"`` (U+FFFD).

    Raises ``InputError`` ("<source>: line L, byte B of the line (offset O): invalid UTF-8 ...") for
    invalid UTF-8 under ``"strict"``, and for an unknown ``errors`` value.
    """
    if errors not in ("strict", "replace"):
        raise InputError(f"encoding errors must be 'strict' or 'replace', got {errors!r}")
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        line_start = data.rfind(b"\n", 0, e.start) + 1
        bad = data[e.start : e.end]
        raise InputError(
            f"{source}: line {line}, byte {e.start - line_start} of the line (offset {e.start}): "
            f"invalid UTF-8 {bad!r} ({e.reason}); use --encoding-errors replace to translate anyway"
        ) from None


def split_lines(text: str) -> list[str]:
    """Split on ``\\n`` only (``\\r\\n`` too); a final newline ends the last line. ``""`` -> ``[]``.

    Other line-break characters stay inside their line (``clean_line`` turns them into spaces).
    """
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def read_input(data: bytes, *, errors: str = "strict", source: str = "<stdin>") -> list[str]:
    """``split_lines(decode_input(data, ...))``: the lines of a translation input file or stream.

    Under ``errors="replace"`` one warning (logger ``aiayn``) says how many invalid sequences were
    replaced and where the first was. Raises ``InputError`` as ``decode_input`` does.
    """
    text = decode_input(data, errors=errors, source=source)
    if errors == "replace":
        replaced = text.count("\ufffd") - data.count("\ufffd".encode())
        if replaced:
            try:
                decode_input(data, source=source)
            except InputError as e:
                first = str(e).split(": invalid UTF-8")[0]
                log.warning("%d invalid UTF-8 sequence(s) replaced by U+FFFD (the first at %s); the tokenizer "
                            "ignores U+FFFD", replaced, first)
    return split_lines(text)


# --------------------------------------------------------------------------- one line


_SPACE_LIKE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def clean_line(line: str) -> str:
    """Control characters (C0/C1: form feed, vertical tab, ``\\r``, U+0085, ...) and U+2028/U+2029 ->
    a space; lone surrogates (``surrogateescape`` input) -> U+FFFD. Tabs stay (the tokenizer maps
    them to a space). Same length as ``line``; nothing else changes."""
    line = _SPACE_LIKE.sub(" ", line)
    return _SURROGATE.sub("\ufffd", line) if _SURROGATE.search(line) else line


def output_line(text: str) -> str:
    """A translation made safe to write as one line: ``clean_line``, no U+2047, whitespace collapsed."""
    text = clean_line(text).replace(UNK_PLACEHOLDER, " ")
    return " ".join(text.split())


# --------------------------------------------------------------------------- long lines

# Boundaries, coarsest first: after a sentence end, after a clause mark or before a dash.
_SENTENCE = re.compile(r"(?<=[.!?\u2026\u3002\uff01\uff1f])[\"'\u201d\u2019)\]]*\s+")
_CLAUSE = re.compile(r"(?<=[,;:\u3001\uff0c\uff1b])\s+|\s+(?=[-\u2013\u2014]\s)")


def _cut(text: str, pattern: re.Pattern[str]) -> list[str]:
    """``text`` cut after each match of ``pattern`` (the separator stays with the left part, stripped)."""
    parts, start = [], 0
    for m in pattern.finditer(text):
        if m.end() < len(text) and m.start() > start:
            parts.append(text[start : m.end()].strip())
            start = m.end()
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def _chars(text: str, count: Callable[[str], int], limit: int) -> list[str]:
    """Last resort for one "word" longer than ``limit``: the longest prefixes that fit, one after another."""
    out, start = [], 0
    while start < len(text):
        lo, hi = start + 1, len(text)  # largest end in [lo, hi] with count(text[start:end]) <= limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if count(text[start:mid]) <= limit:
                lo = mid
            else:
                hi = mid - 1
        out.append(text[start:lo])
        start = lo
    return out


def split_long(text: str, count: Callable[[str], int], limit: int) -> list[str]:
    """Cut ``text`` into pieces of at most ``limit`` units each, as ``count`` measures them (tokens).

    Cuts at sentence boundaries first, then at clause boundaries (``, ; :`` and dashes), then between
    words, and only inside a word as the last resort; neighbouring parts are packed greedily into a
    piece while it fits. Joining the pieces with single spaces gives ``text`` with its whitespace
    collapsed. Raises ``ValueError`` for ``limit < 1``.
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    text = " ".join(text.split())
    if count(text) <= limit:
        return [text] if text else []
    levels: list[Callable[[str], list[str]]] = [
        lambda t: _cut(t, _SENTENCE),
        lambda t: _cut(t, _CLAUSE),
        lambda t: t.split(),
        lambda t: _chars(t, count, limit),
    ]

    def pieces(t: str, level: int) -> list[str]:
        parts = levels[level](t)
        if len(parts) == 1 and level + 1 < len(levels):
            return pieces(t, level + 1)
        out: list[str] = []
        current = ""
        for part in parts:
            joined = f"{current} {part}" if current else part
            if count(joined) <= limit:
                current = joined
                continue
            if current:
                out.append(current)
            if count(part) <= limit or level + 1 == len(levels):
                current = part
            else:
                sub = pieces(part, level + 1)
                out.extend(sub[:-1])
                current = sub[-1] if sub else ""
        if current:
            out.append(current)
        return out

    return pieces(text, 0)
