"""Multi30k task 1: fetch with checksum verification.

Multi30k task 1 (Elliott et al. 2016, "Multi30K: Multilingual English-German
Image Descriptions") is parallel caption text: line N of ``{split}.{lang}.gz``
translates line N of every other language of that split. The embedded
``MULTI30K_SHA256`` below is the source of truth: every fetched file is verified
against it before it lands in the output directory (``fetch_corpus``: copy from a
local mirror, ``AIAYN_DATA_MIRROR``, or download from upstream; verify; move into
place atomically).

Errors: ``aiayn.data.readers.CorpusError`` (a ``ValueError``) naming the file and the bad value.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from aiayn.config.settings import MIRROR_ENV, Settings
from aiayn.data.readers import CorpusError
from aiayn.io import atomic_write_text, sha256_file
from aiayn.retry import is_transient

__all__ = ["CorpusError", "MULTI30K_UPSTREAM", "MULTI30K_SHA256", "MIRROR_ENV", "fetch_corpus"]

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

_DOWNLOAD_TIMEOUT_S = 60.0
_DOWNLOAD_ATTEMPTS = 3


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
