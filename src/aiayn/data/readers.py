"""Streaming readers of raw parallel text: Moses (one file per language), TSV and JSONL, plain or gzip.

Every reader yields ``(lineno, src, tgt)``: the 1-based line number in the file (the same in both
files of a Moses pair), and each side decoded from UTF-8, a leading byte-order mark dropped,
trailing whitespace stripped and NFC-normalised. Nothing is dropped here: an empty side stays ``""``
and control characters stay in, for ``aiayn.data.hygiene`` to count (train) or refuse (valid and
test). Files are read line by line, so a 4.5M-pair corpus never sits in memory.

Errors (``aiayn.corpus.CorpusError``), each naming the file the user gave (``display``) and the line:
invalid UTF-8 (with the byte offset in the line), Moses files of different lengths (both files and
both line counts), a TSV row with the wrong number of columns, a language missing from the TSV
columns or the JSON ``translation`` object (naming the ones it has), a line that is not a JSON
object, and a file with no line at all.
"""

from __future__ import annotations

import gzip
import itertools
import json
import unicodedata
from collections.abc import Iterator, Sequence
from pathlib import Path

from aiayn.corpus import CorpusError, decode_utf8_line

__all__ = ["iter_lines", "MosesPairs", "TsvPairs", "JsonlPairs", "PairReader", "clean"]

_GZIP_MAGIC = b"\x1f\x8b"
_BOM = "\ufeff"


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
