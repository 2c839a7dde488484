"""The one line reader of the project: text files, plain or gzip, as lines and as parallel pairs.

Two ways to read, over one byte-level reader (``_raw_lines``: gzip detected by its magic bytes, a
missing file or a corrupt gzip a ``CorpusError`` naming the file):

- **Raw sources** (the ``corpus``/``prepare`` stages): ``iter_lines`` and the pair readers (``MosesPairs``
  for one file per language, ``TsvPairs``, ``JsonlPairs``) yield ``(lineno, src, tgt)``: the 1-based
  line number in the file (the same in both files of a Moses pair), each side decoded from UTF-8, a
  leading byte-order mark dropped, trailing whitespace stripped and NFC-normalised. Nothing is dropped
  here: an empty side stays ``""`` and control characters stay in, for ``aiayn.data.hygiene`` to count
  (train) or refuse (valid and test). Files are read line by line, so a 4.5M-pair corpus never sits
  in memory.
- **Prepared text** (every stage after ``prepare``): ``read_lines`` / ``iter_line_chunks`` are strict:
  an empty line, a control character other than tab (``BAD_CHAR``) or invalid UTF-8 is an error.

Errors (``CorpusError``, a ``ValueError``), each naming the file the user gave (``display``) and the line:
invalid UTF-8 (with the byte offset in the line), Moses files of different lengths (both files and
both line counts), a TSV row with the wrong number of columns, a language missing from the TSV
columns or the JSON ``translation`` object (naming the ones it has), a line that is not a JSON
object, and a file with no line at all.
"""

from __future__ import annotations

import gzip
import itertools
import json
import re
import unicodedata
from collections.abc import Iterator, Sequence
from pathlib import Path


__all__ = [
    "CorpusError", "BAD_CHAR", "iter_lines", "MosesPairs", "TsvPairs", "JsonlPairs", "PairReader", "clean",
    "read_lines", "iter_line_chunks", "decode_utf8_line",
]  # fmt: skip

_GZIP_MAGIC = b"\x1f\x8b"
_BOM = "\ufeff"
#: Refused inside a line of prepared text: Unicode control characters (category Cc = U+0000-001F and
#: U+007F-009F), tab excepted, and the line/paragraph separators U+2028/U+2029 (Zl, Zp),
#: which ``str.splitlines`` would split on. ``aiayn.data.hygiene`` drops train pairs that hold one.
BAD_CHAR = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
#: What decoded text never holds: sentencepiece's word marker and subword-nmt's joiner. The scorer refuses a
#: hypothesis or reference with one (``aiayn.evaluation.scoring``), so prepare refuses such a reference first.
SUBWORD_MARKERS = ("\u2581", "@@ ")


def subword_marker(line: str) -> str | None:
    """The first subword marker in ``line`` (a trailing ``@@`` counts), else None."""
    return next((m for m in SUBWORD_MARKERS if m in line or line.endswith(m.rstrip())), None)


class CorpusError(ValueError):
    """The corpus is missing, corrupt or malformed; the message names file (and line)."""


def clean(text: str) -> str:
    """Trailing whitespace stripped, NFC-normalised (ASCII text is already NFC)."""
    text = text.rstrip()
    return text if text.isascii() else unicodedata.normalize("NFC", text)


def _decode(raw: bytes, display: str, lineno: int) -> str:
    text = decode_utf8_line(raw, display, lineno)
    if lineno == 1 and text.startswith(_BOM):
        text = text[1:]
    return text


def _raw_lines(path: Path, display: str) -> Iterator[bytes]:
    """The file's lines as bytes (``\\n`` kept), gzip decompressed (detected by its magic bytes, not the
    name); ``CorpusError`` for a missing file or an unreadable gzip."""
    try:
        f = open(path, "rb")
    except FileNotFoundError as e:
        raise CorpusError(f"{display}: file not found") from e
    with f:
        stream = gzip.GzipFile(fileobj=f, mode="rb") if f.peek(2)[:2] == _GZIP_MAGIC else f
        try:
            yield from stream
        except (OSError, EOFError) as e:
            raise CorpusError(f"{display}: cannot read (corrupt gzip?): {e}") from e


def iter_lines(path: str | Path, *, display: str | None = None) -> Iterator[str]:
    """Lines of one text file, decoded and cleaned (see the module docstring); empty lines kept as ``""``.

    Only ``\\n`` ends a line (``\\r\\n`` too: the ``\\r`` is trailing whitespace).
    Raises ``CorpusError``: missing file, corrupt gzip, invalid UTF-8 (``display:line``).
    """
    display = display or str(path)
    for lineno, raw in enumerate(_raw_lines(Path(path), display), 1):
        yield clean(_decode(raw, display, lineno))


class PairReader:
    """A split's pairs, one pass per iteration: ``for lineno, src, tgt in reader``.

    ``where(side, lineno)`` names the file and line of one side (``side``: ``"src"`` or ``"tgt"``);
    ``empty(side, lineno)`` says that side is empty, in the file format's own words.
    """

    def __iter__(self) -> Iterator[tuple[int, str, str]]:  # pragma: no cover - interface
        raise NotImplementedError

    def where(self, side: str, lineno: int) -> str:  # pragma: no cover - interface
        raise NotImplementedError

    def empty(self, side: str, lineno: int) -> str:
        return f"{self.where(side, lineno)}: empty line"


class MosesPairs(PairReader):
    """Two aligned files: line N of ``src_path`` translates line N of ``tgt_path``.

    Raises (while iterating) ``CorpusError`` when the files differ in length, naming both files and
    both line counts (and the lines, when the longer file's extra lines are all blank: a trailing blank line),
    or when they hold no line.
    """

    def __init__(self, src_path: Path, tgt_path: Path, *, display: tuple[str, str] | None = None) -> None:
        self.paths = (Path(src_path), Path(tgt_path))
        self.display = display or (str(src_path), str(tgt_path))

    def where(self, side: str, lineno: int) -> str:
        return f"{self.display[0 if side == 'src' else 1]}:{lineno}"

    def __iter__(self) -> Iterator[tuple[int, str, str]]:
        src_disp, tgt_disp = self.display
        src_it = _raw_lines(self.paths[0], src_disp)
        tgt_it = _raw_lines(self.paths[1], tgt_disp)
        lineno = 0
        while True:
            s, t = next(src_it, None), next(tgt_it, None)
            if s is None or t is None:
                break
            lineno += 1
            yield lineno, clean(_decode(s, src_disp, lineno)), clean(_decode(t, tgt_disp, lineno))
        if s is not None or t is not None:
            longer, rest, disp = (s, src_it, src_disp) if s is not None else (t, tgt_it, tgt_disp)
            extra = blank = 0
            for raw in itertools.chain([longer], rest):
                extra, blank = extra + 1, blank + (not raw.strip())
            n_src, n_tgt = (lineno + extra, lineno) if s is not None else (lineno, lineno + extra)
            span = f"{disp}:{lineno + 1}" + (f"-{lineno + extra} are" if extra > 1 else " is")
            hint = f"; {span} blank: delete the trailing blank line{'s' * (extra > 1)}" if blank == extra else ""
            raise CorpusError(f"misaligned corpus: {src_disp} has {n_src} lines but {tgt_disp} has {n_tgt}{hint}")
        if lineno == 0:
            raise CorpusError(f"{src_disp}: file is empty")


class TsvPairs(PairReader):
    """One file, one pair per row, columns separated by a tab (no quoting).

    ``columns`` names the columns (the languages are picked by name); ``header`` takes the names from
    the first row; with neither, a row has exactly two columns, source then target. Raises (while
    iterating) ``CorpusError``: a row with another number of columns (``file:line``, the count found
    and expected), or ``src_lang``/``tgt_lang`` not among the column names (naming the ones there are).
    """

    def __init__(self, path: Path, src_lang: str, tgt_lang: str, *, columns: Sequence[str] | None = None,
                 header: bool = False, display: str | None = None) -> None:
        self.path, self.langs = Path(path), (src_lang, tgt_lang)
        self.columns, self.header = (tuple(columns) if columns is not None else None), header
        self.display = display or str(path)

    def where(self, side: str, lineno: int) -> str:
        return f"{self.display}:{lineno}"

    def empty(self, side: str, lineno: int) -> str:
        return f"{self.where(side, lineno)}: the {self.langs[side == 'tgt']!r} column is empty"

    def _pick(self, names: Sequence[str], lineno: int | None) -> tuple[int, int]:
        missing = [lang for lang in self.langs if lang not in names]
        if missing:
            at = f"{self.display}:{lineno}" if lineno else self.display
            raise CorpusError(f"{at}: no column named {' or '.join(map(repr, missing))}; the columns are {list(names)}")
        return names.index(self.langs[0]), names.index(self.langs[1])

    def __iter__(self) -> Iterator[tuple[int, str, str]]:
        width, pick, n = 2, (0, 1), 0
        if self.columns is not None:
            width, pick = len(self.columns), self._pick(self.columns, None)
        lineno = 0
        for lineno, raw in enumerate(_raw_lines(self.path, self.display), 1):
            fields = _decode(raw, self.display, lineno).rstrip("\r\n").split("\t")
            if lineno == 1 and self.header:
                names = [f.strip() for f in fields]
                if self.columns is not None and tuple(names) != self.columns:
                    raise CorpusError(f"{self.display}:1: header {names} differs from data.corpus.columns {list(self.columns)}")
                width, pick = len(names), self._pick(names, 1)
                continue
            if len(fields) != width:
                expected = f"{width} ({list(self.columns)})" if self.columns else f"{width}"
                raise CorpusError(f"{self.display}:{lineno}: {len(fields)} tab-separated columns, expected {expected}")
            n += 1
            yield lineno, clean(fields[pick[0]]), clean(fields[pick[1]])
        if n == 0:
            raise CorpusError(f"{self.display}: no pair in the file" if lineno else f"{self.display}: file is empty")


class JsonlPairs(PairReader):
    """One JSON object per line, Hugging Face's translation shape: ``{"translation": {"en": ..., "de": ...}}``.

    Blank lines are skipped; a ``null`` side reads as ``""``. Raises (while iterating) ``CorpusError``
    naming ``file:line``: not a JSON object, no ``translation`` object, or ``src_lang``/``tgt_lang``
    missing from it (naming the languages it has), or a side that is not a string.
    """

    def __init__(self, path: Path, src_lang: str, tgt_lang: str, *, display: str | None = None) -> None:
        self.path, self.langs = Path(path), (src_lang, tgt_lang)
        self.display = display or str(path)

    def where(self, side: str, lineno: int) -> str:
        return f"{self.display}:{lineno}"

    def empty(self, side: str, lineno: int) -> str:
        return f"{self.where(side, lineno)}: \"translation\".{self.langs[side == 'tgt']} is empty or null"

    def __iter__(self) -> Iterator[tuple[int, str, str]]:
        n = 0
        for lineno, raw in enumerate(_raw_lines(self.path, self.display), 1):
            text = _decode(raw, self.display, lineno)
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except ValueError as e:
                raise CorpusError(f"{self.display}:{lineno}: not valid JSON: {e}") from e
            pair = obj.get("translation") if isinstance(obj, dict) else None
            if not isinstance(pair, dict):
                keys = list(obj) if isinstance(obj, dict) else type(obj).__name__
                raise CorpusError(f"{self.display}:{lineno}: expected {{\"translation\": {{...}}}}, got keys {keys}")
            sides = []
            for lang in self.langs:
                if lang not in pair:
                    raise CorpusError(f"{self.display}:{lineno}: no {lang!r} in \"translation\"; it has {sorted(pair)}")
                value = pair[lang] if pair[lang] is not None else ""
                if not isinstance(value, str):
                    raise CorpusError(f"{self.display}:{lineno}: \"translation\".{lang} is {type(value).__name__}, not a string")
                sides.append(clean(value))
            n += 1
            yield lineno, sides[0], sides[1]
        if n == 0:
            raise CorpusError(f"{self.display}: no pair in the file")


# --------------------------------------------------------------------------- prepared text (strict)


def read_lines(path: Path) -> list[str]:
    """Read one corpus file (gzip or plain UTF-8) into validated, NFC-normalised lines.

    Each line has trailing whitespace (and the newline) stripped. A leading
    UTF-8 byte-order mark is dropped.

    Raises ``CorpusError`` naming ``path`` and the 1-based line number for:
    invalid UTF-8, an empty (or whitespace-only) line, a control character other
    than tab or a U+2028/U+2029 line separator (the codepoint is shown as
    ``U+XXXX``); and for an empty file. Read ``LINE_CHUNK`` lines at a time (``iter_line_chunks``).
    """
    return [line for chunk in iter_line_chunks(path) for line in chunk]


#: Lines per chunk of ``iter_line_chunks``.
LINE_CHUNK = 20_000
#: ``_BAD_CHAR`` less the newline: searched over a chunk's lines joined by newlines.
_BAD_CHAR_JOINED = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def iter_line_chunks(path: Path, size: int = LINE_CHUNK) -> Iterator[list[str]]:
    """``read_lines`` ``size`` lines at a time: one decode, one search and one NFC pass per chunk (about
    10x less Python per line than line by line); a chunk with a problem is re-read line by line, so
    the error names the exact line as ``read_lines`` does."""
    path = Path(path)
    first = 1
    stream = _raw_lines(path, str(path))
    while raw := list(itertools.islice(stream, size)):
        if first == 1 and raw[0].startswith(b"\xef\xbb\xbf"):
            raw[0] = raw[0][3:]
        yield _checked_chunk(path, first, raw)
        first += len(raw)
    if first == 1:
        raise CorpusError(f"{path}: file is empty")


def _checked_chunk(path: Path, first: int, raw: list[bytes]) -> list[str]:
    try:
        lines = [line.rstrip() for line in b"".join(raw).decode("utf-8").split("\n")]
        if len(lines) > len(raw):  # the final newline of the chunk
            lines.pop()
        if len(lines) == len(raw) and all(lines):
            text = "\n".join(lines)
            if not _BAD_CHAR_JOINED.search(text):
                return lines if text.isascii() else unicodedata.normalize("NFC", text).split("\n")
    except UnicodeDecodeError:
        pass
    return [_checked_line(path, first + i, chunk) for i, chunk in enumerate(raw)]  # raises at the bad line


def decode_utf8_line(raw: bytes, display: str | Path, lineno: int) -> str:
    """One line's bytes as text; ``CorpusError`` naming ``display:lineno``, the byte offset and the bytes
    when they are not UTF-8 (the one message every corpus reader gives)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        chunk = raw.rstrip(b"\r\n")
        raise CorpusError(
            f"{display}:{lineno}: invalid UTF-8 at byte {e.start} of the line ({chunk[e.start:e.start + 4]!r})"
        ) from e


def _checked_line(path: Path, lineno: int, chunk: bytes) -> str:
    text = decode_utf8_line(chunk, path, lineno).rstrip()
    if not text:
        raise CorpusError(f"{path}:{lineno}: empty line")
    bad = BAD_CHAR.search(text)
    if bad:
        ch = bad.group()
        raise CorpusError(
            f"{path}:{lineno}: control character U+{ord(ch):04X} ({unicodedata.name(ch, 'unnamed')}) "
            f"at column {bad.start() + 1}"
        )
    return text if text.isascii() else unicodedata.normalize("NFC", text)
