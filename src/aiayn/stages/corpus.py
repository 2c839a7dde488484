"""``corpus`` stage: the configured source's raw text for the pair -> ``layout.corpus`` (checksummed snapshot).

First stage of the DAG. Reads ``params.data.corpus`` (``aiayn.data.sources``): Multi30k from
``data/multi30k`` (verified against its embedded checksums), local Moses/TSV/JSONL files (copied
byte for byte), a Hugging Face dataset (exported to gzip JSONL) and sacreBLEU test sets. Writes, as
one atomic directory swap, the raw files of ``data.splits``, ``SHA256SUMS`` and ``SOURCE.json`` (what
the corpus is: kind, pair, name or path, config, requested and resolved revision). The folder is a
DVC output: the raw text is versioned, cached and pushed whatever the source; ``prepare`` reads it.
"""

from __future__ import annotations

import logging

from aiayn.config.schema import Params
from aiayn.data.sources import snapshot
from aiayn.faults import fault_point
from aiayn.io import atomic_dir
from aiayn.recording import NULL_RECORDER, Recorder
from aiayn.stages import Layout

__all__ = ["run"]

log = logging.getLogger("aiayn")


def run(params: Params, layout: Layout, recorder: Recorder = NULL_RECORDER) -> dict:
    """Snapshot the corpus; return ``{"dir", "identity", "splits": {split: [files]}}``. ``recorder``
    records nothing of this stage (no run of its own: the corpus identity goes into ``prepare``'s
    report, the model card and the train run's data version).

    Raises ``aiayn.data.readers.CorpusError`` (missing or corrupt files, a split or language the source lacks,
    an unreachable dataset): the previous snapshot stays as it was.
    """
    with atomic_dir(layout.corpus) as tmp:
        manifest = snapshot(params.data, layout.root, tmp)
        fault_point("corpus.snapshot_written")
    for split, entry in manifest["splits"].items():
        log.info("corpus: %s <- %s", split, ", ".join(entry["origin"]))
    return {"dir": str(layout.corpus), "identity": manifest["identity"],
            "splits": {s: e["files"] for s, e in manifest["splits"].items()}}
