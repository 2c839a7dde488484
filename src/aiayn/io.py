"""Atomic file output: a crash never leaves a half-written file a later stage trusts.

Every write goes to a temporary sibling (same directory, so the final
``os.replace`` is an atomic rename on POSIX), is flushed and fsynced, then
renamed over the destination. Directories are built in a temporary sibling and
swapped in whole.

A temporary sibling's name carries its writer (``.<name>.<pid>-<host>.<random>.tmp``; a folder set
aside during a swap: ``.<name>.old.<pid>``). A process killed mid-write (``kill -9``, a power cut)
leaves it behind; the next write of the same destination removes every such sibling whose writer is
gone (no such process on this host), so crashes leave no litter. An ``OSError`` raised while writing
(a full disk, ``ENOSPC``) is re-raised naming the destination, never only the temporary name.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import socket
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aiayn.faults import fault_point

_UMASK = os.umask(0)
os.umask(_UMASK)

__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text", "atomic_write_json", "atomic_dir", "sha256_file"]


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success fsync and rename it onto ``path``.

    On any exception the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_orphans(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{_writer()}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file ordinary permissions
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException as e:
        tmp_path.unlink(missing_ok=True)
        named = _naming_destination(e, tmp_path, path)
        if named is None:
            raise
        raise named from e


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented, key-sorted JSON (deterministic bytes) atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary directory; on success it replaces ``path`` whole.

    The previous contents of ``path`` (if any) are removed only after the new
    directory is complete. On an exception the temporary directory is deleted.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_orphans(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.{_writer()}.", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_UMASK)
    try:
        yield tmp
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        named = _naming_destination(e, tmp, path)
        if named is None:
            raise
        raise named from e
    fault_point(f"atomic_dir:{path.name}")
    old = None
    if path.exists():
        old = path.with_name(f".{path.name}.old.{os.getpid()}")
        os.replace(path, old)
    os.replace(tmp, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


_HOST = f"{zlib.crc32(socket.gethostname().encode()):08x}"


def _writer() -> str:
    """This process as a temporary name's writer: ``<pid>-<host hash>`` (the pid is read per call: a fork)."""
    return f"{os.getpid()}-{_HOST}"


def _gone(pid: int) -> bool:
    """No process ``pid`` on this host (one that exists but is not ours still counts as there)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _remove_orphans(path: Path) -> None:
    """Remove the temporary siblings of ``path`` (``.<name>.<pid>-<host>.*.tmp``, ``.<name>.old.<pid>``) left
    by a writer of this host that no longer runs (killed mid-write). A live writer's are left alone."""
    ours = re.compile(rf"\.{re.escape(path.name)}\.(?:(\d+)-{_HOST}\.\w+\.tmp|old\.(\d+))")
    for sibling in path.parent.glob(f".{glob.escape(path.name)}.*"):
        m = ours.fullmatch(sibling.name)
        owner = int(m.group(1) or m.group(2)) if m else None
        if owner is None or owner == os.getpid() or not _gone(owner):
            continue
        if sibling.is_dir() and not sibling.is_symlink():
            shutil.rmtree(sibling, ignore_errors=True)
        else:
            sibling.unlink(missing_ok=True)


def _naming_destination(e: BaseException, tmp: Path, dest: Path) -> OSError | None:
    """``e`` re-made to name ``dest`` when it is an ``OSError`` naming nothing or the temporary ``tmp`` (or a file
    inside it: the same file under ``dest``), e.g. ``[Errno 28] No space left on device: '<dest>'``; None: keep ``e``."""
    if not isinstance(e, OSError) or e.errno is None:
        return None
    named = None if e.filename is None else Path(os.fsdecode(e.filename))
    if named is not None and named != tmp and tmp not in named.parents:
        return None
    target = dest if named is None or named == tmp else dest / named.relative_to(tmp)
    return OSError(e.errno, e.strerror or os.strerror(e.errno), str(target))


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()

