"""Multi30k corpus: fetch with checksum verification, strict reading, train-side filtering.

Multi30k task 1 (Elliott et al. 2016, "Multi30K: Multilingual English-German
Image Descriptions") is parallel caption text: line N of ``{split}.{lang}.gz``
translates line N of every other language of that split. The embedded
``SHA256SUMS`` below is the source of truth: every fetched file is verified
against it before it lands in the output directory.

Three steps, one function each:

``fetch_corpus``   copy from a local mirror (``AIAYN_DATA_MIRROR``) or download
                   from upstream; verify; move into place atomically.
``read_parallel``  read a ``(src, tgt)`` file pair; validate UTF-8, alignment,
                   empty lines and control characters; NFC-normalise.
``filter_pairs``   drop train pairs that are too short, too long or too
                   unbalanced (whitespace word counts).

Errors: ``CorpusError`` (a ``ValueError``) naming the file, line and bad value.
"""

from __future__ import annotations

import gzip
import itertools
import os
import re
import shutil
import tempfile
import time
import unicodedata
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path

from aiayn.config import DataConfig
from aiayn.io import atomic_write_text, sha256_file
from aiayn.retry import is_transient
from aiayn.settings import MIRROR_ENV, Settings

__all__ = [
    "CorpusError",
    "MULTI30K_UPSTREAM",
    "MULTI30K_SHA256",
    "MIRROR_ENV",
    "FILTER_RULES",
    "fetch_corpus",
    "read_lines",
    "decode_utf8_line",
    "iter_lines",
    "iter_line_chunks",
    "read_parallel",
    "filter_pairs",
    "length_rule",
    "BAD_CHAR",
]

#: Upstream folder; ``{MULTI30K_UPSTREAM}/{name}`` is one file.
MULTI30K_UPSTREAM = "https://github.com/multi30k/dataset/raw/master/data/task1/raw"

#: SHA-256 of every file of Multi30k task 1 raw (copied from the mirror's SHA256SUMS).
MULTI30K_SHA256: dict[str, str] = {
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
    "test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
    "test_2017_flickr.fr.gz": "3ba671ceb2299f3304ffafefea7a833d08632fbaf0ba18546f8a2ec2391af496",
    "test_2017_mscoco.de.gz": "799e4854c25d601cb6cb6be29eabe5667734c61ace2f495e03e429031a0bc338",
    "test_2017_mscoco.en.gz": "aab300bfb4427697987e02cd0aacd44bfe8aa50456231b6474c08038bbed2b58",
    "test_2017_mscoco.fr.gz": "754f3072ba9f124569ba5258b32730fc1d214bbf8e0c6dfb2b74401676220db0",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
}

#: Filter rules in the order they are tried; a dropped pair counts under the first it hits.
FILTER_RULES = ("too_short", "too_long", "ratio")

_DOWNLOAD_TIMEOUT_S = 60.0
_DOWNLOAD_ATTEMPTS = 3
_GZIP_MAGIC = b"\x1f\x8b"
#: Refused inside a line: Unicode control characters (category Cc = U+0000-001F and
#: U+007F-009F), tab excepted, and the line/paragraph separators U+2028/U+2029 (Zl, Zp),
#: which ``str.splitlines`` would split on.
_BAD_CHAR = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
#: The same pattern, public: ``aiayn.data.hygiene`` drops train pairs that hold one.
BAD_CHAR = _BAD_CHAR


class CorpusError(ValueError):
    """The corpus is missing, corrupt or malformed; the message names file (and line)."""


# --------------------------------------------------------------------------- fetch


def fetch_corpus(out_dir: Path, *, mirror: Path | None = None, files: list[str] | None = None) -> list[Path]:
    """Fetch Multi30k files into ``out_dir``, verified against ``MULTI30K_SHA256``.

    Source: ``mirror`` if given, else the folder in ``$AIAYN_DATA_MIRROR`` if set,
    else ``MULTI30K_UPSTREAM`` over HTTPS (``_DOWNLOAD_ATTEMPTS`` tries, timeout
    ``_DOWNLOAD_TIMEOUT_S`` seconds each). ``files`` defaults to every file of
    the checksum list. Files already in ``out_dir`` with the right hash are
    skipped. All missing files are first staged in a temporary folder inside
    ``out_dir`` and verified; only when every one matches are they renamed into
    place (atomic per file), so a failure leaves ``out_dir`` as it was.
    Finally ``out_dir/SHA256SUMS`` lists every verified file present
    (``"<sha256>  <name>"``, sorted by name).

    Returns the paths of the requested files, in ``files`` order.
    Raises ``CorpusError``: unknown file name, file missing from the mirror,
    download failure, or checksum mismatch (naming file, expected and actual hash).
    """
    out_dir = Path(out_dir)
    names = sorted(MULTI30K_SHA256) if files is None else list(files)
    unknown = [n for n in names if n not in MULTI30K_SHA256]
    if unknown:
        raise CorpusError(f"unknown Multi30k file(s) {unknown}; known: {sorted(MULTI30K_SHA256)}")
    if mirror is None:
        mirror = Settings.from_env().data_mirror

    out_dir.mkdir(parents=True, exist_ok=True)
    todo = [n for n in names if not _verified(out_dir / n, n)]
    if todo:
        staging = Path(tempfile.mkdtemp(prefix=".fetch.", suffix=".tmp", dir=out_dir))
        try:
            for name in todo:
                staged = staging / name
                if mirror is not None:
                    _copy_from_mirror(Path(mirror), name, staged)
                else:
                    _download(f"{MULTI30K_UPSTREAM}/{name}", staged)
                actual = sha256_file(staged)
                if actual != MULTI30K_SHA256[name]:
                    source = Path(mirror) / name if mirror is not None else f"{MULTI30K_UPSTREAM}/{name}"
                    raise CorpusError(
                        f"checksum mismatch for {name} (from {source}): "
                        f"expected sha256 {MULTI30K_SHA256[name]}, got {actual}"
                    )
            for name in todo:
                with open(staging / name, "rb+") as f:
                    os.fsync(f.fileno())
                os.replace(staging / name, out_dir / name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    present = sorted(n for n in MULTI30K_SHA256 if (out_dir / n).exists())
    atomic_write_text(out_dir / "SHA256SUMS", "".join(f"{MULTI30K_SHA256[n]}  {n}\n" for n in present))
    return [out_dir / n for n in names]


def _verified(path: Path, name: str) -> bool:
    return path.is_file() and sha256_file(path) == MULTI30K_SHA256[name]


def _copy_from_mirror(mirror: Path, name: str, dest: Path) -> None:
    src = mirror / name
    if not src.is_file():
        raise CorpusError(f"{name} is not in the mirror {mirror} (from argument or ${MIRROR_ENV})")
    shutil.copyfile(src, dest)


def _download(url: str, dest: Path) -> None:
    last: Exception | None = None
    for attempt in range(1, _DOWNLOAD_ATTEMPTS + 1):
        try:
            with urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as resp, open(dest, "wb") as f:
                shutil.copyfileobj(resp, f)
            return
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            if not is_transient(e):  # a full disk, a permission error, HTTP 404: retrying cannot help
                raise CorpusError(f"could not download {url} to {dest}: {e}") from e
            last = e
            if attempt < _DOWNLOAD_ATTEMPTS:
                time.sleep(2.0 ** attempt)  # 2 s, 4 s backoff
    raise CorpusError(
        f"could not download {url} after {_DOWNLOAD_ATTEMPTS} attempts: {last}; "
        f"on a machine without internet set ${MIRROR_ENV} to a folder holding the files"
    )


# --------------------------------------------------------------------------- read


def read_lines(path: Path) -> list[str]:
    """Read one corpus file (gzip or plain UTF-8) into validated, NFC-normalised lines.

    Each line has trailing whitespace (and the newline) stripped. A leading
    UTF-8 byte-order mark is dropped.

    Raises ``CorpusError`` naming ``path`` and the 1-based line number for:
    invalid UTF-8, an empty (or whitespace-only) line, a control character other
    than tab or a U+2028/U+2029 line separator (the codepoint is shown as
    ``U+XXXX``); and for an empty file.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
        if raw[:2] == _GZIP_MAGIC:
            raw = gzip.decompress(raw)
    except FileNotFoundError as e:
        raise CorpusError(f"{path}: file not found") from e
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise CorpusError(f"{path}: cannot read (corrupt gzip?): {e}") from e
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    if not raw.strip():
        raise CorpusError(f"{path}: file is empty")

    chunks = raw.split(b"\n")
    if chunks[-1] == b"":  # final newline terminates the last line
        chunks.pop()
    return [_checked_line(path, lineno, chunk) for lineno, chunk in enumerate(chunks, 1)]


def iter_lines(path: Path) -> Iterator[str]:
    """``read_lines`` one line at a time (same validation and messages; a file of whitespace only
    fails at its first line), for files too large to hold: the prepared text at WMT scale."""
    for chunk in iter_line_chunks(path):
        yield from chunk


#: Lines per chunk of ``iter_line_chunks``.
LINE_CHUNK = 20_000
#: ``_BAD_CHAR`` less the newline: searched over a chunk's lines joined by newlines.
_BAD_CHAR_JOINED = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def iter_line_chunks(path: Path, size: int = LINE_CHUNK) -> Iterator[list[str]]:
    """``read_lines`` ``size`` lines at a time: one decode, one search and one NFC pass per chunk (about
    10x less Python per line than line by line); a chunk with a problem is re-read line by line, so
    the error names the exact line as ``read_lines`` does."""
    path = Path(path)
    try:
        f = open(path, "rb")
    except FileNotFoundError as e:
        raise CorpusError(f"{path}: file not found") from e
    first = 1
    with f:
        stream = gzip.GzipFile(fileobj=f) if f.peek(2)[:2] == _GZIP_MAGIC else f
        try:
            while raw := list(itertools.islice(stream, size)):
                if first == 1 and raw[0].startswith(b"\xef\xbb\xbf"):
                    raw[0] = raw[0][3:]
                yield _checked_chunk(path, first, raw)
                first += len(raw)
        except (OSError, EOFError) as e:
            raise CorpusError(f"{path}: cannot read (corrupt gzip?): {e}") from e
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
    bad = _BAD_CHAR.search(text)
    if bad:
        ch = bad.group()
        raise CorpusError(
            f"{path}:{lineno}: control character U+{ord(ch):04X} ({unicodedata.name(ch, 'unnamed')}) "
            f"at column {bad.start() + 1}"
        )
    return text if text.isascii() else unicodedata.normalize("NFC", text)


def read_parallel(src_path: Path, tgt_path: Path) -> list[tuple[str, str]]:
    """Read an aligned file pair into ``[(src, tgt), ...]`` (see ``read_lines`` for validation).

    Raises ``CorpusError`` for anything ``read_lines`` rejects, and when the two
    files have different line counts (naming both files and both counts).
    """
    src = read_lines(src_path)
    tgt = read_lines(tgt_path)
    if len(src) != len(tgt):
        raise CorpusError(
            f"misaligned corpus: {src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}"
        )
    return list(zip(src, tgt))


# --------------------------------------------------------------------------- filter


def filter_pairs(
    pairs: Iterable[tuple[str, str]], cfg: DataConfig
) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """Drop pairs that break a length rule; return ``(kept, dropped_counts)``.

    Lengths are whitespace-separated words. Rules, tried in ``FILTER_RULES`` order
    (a dropped pair counts under the first it hits):

    ``too_short``  a side has fewer than ``cfg.min_words`` words
    ``too_long``   a side has more than ``cfg.max_words`` words
    ``ratio``      longer side / shorter side > ``cfg.max_ratio``

    ``dropped_counts`` has every rule as a key (0 when none hit). Order is kept.
    """
    kept: list[tuple[str, str]] = []
    dropped = dict.fromkeys(FILTER_RULES, 0)
    for src, tgt in pairs:
        rule = length_rule(src, tgt, cfg)
        if rule is None:
            kept.append((src, tgt))
        else:
            dropped[rule] += 1
    return kept, dropped


def length_rule(src: str, tgt: str, cfg: DataConfig) -> str | None:
    """The first ``FILTER_RULES`` rule the pair breaks (see ``filter_pairs``), or ``None``."""
    n_src, n_tgt = len(src.split()), len(tgt.split())
    shorter, longer = min(n_src, n_tgt), max(n_src, n_tgt)
    if shorter < cfg.min_words:
        return "too_short"
    if longer > cfg.max_words:
        return "too_long"
    if longer > cfg.max_ratio * shorter:
        return "ratio"
    return None
