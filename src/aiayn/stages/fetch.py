"""``fetch`` (before the DVC DAG): put the verified Multi30k corpus in ``layout.raw``.

Not a DVC stage: the fetched folder is versioned by ``data.dvc``. Offline
machines pass ``mirror`` or set ``AIAYN_DATA_MIRROR`` to a local copy.
"""

from __future__ import annotations

from pathlib import Path

from aiayn.data.multi30k import MULTI30K_SHA256, fetch_corpus
from aiayn.stages import Layout

__all__ = ["run"]


def run(layout: Layout, mirror: Path | None = None) -> dict:
    """Fetch every file of the embedded checksum list into ``layout.raw``.

    Returns ``{"dir": str, "files": [name, ...], "n_files": int}``.
    Raises ``aiayn.data.readers.CorpusError`` (download failure, checksum mismatch).
    """
    paths = fetch_corpus(layout.raw, mirror=mirror, files=sorted(MULTI30K_SHA256))
    return {"dir": str(layout.raw), "files": [p.name for p in paths], "n_files": len(paths)}
