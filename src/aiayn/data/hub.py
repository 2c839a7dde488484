"""Corpora from outside the project: Hugging Face ``datasets`` and sacreBLEU's test sets.

Both libraries are imported inside the functions, only when a corpus asks for them (``import
datasets`` costs seconds). A dataset is exported split by split to JSONL in Hugging Face's
translation shape (``aiayn.data.readers.JsonlPairs`` reads it back), gzip with a zero mtime so the
same rows give the same bytes (and the same DVC hash).

Errors: ``aiayn.data.readers.CorpusError``, one line saying what is needed: the package, network access to
the hub (or its cache, or a local copy), a split or language the dataset does not have (naming the
ones it has), a sacreBLEU test set or pair that does not exist.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from aiayn.config.schema import CorpusConfig
from aiayn.data.readers import CorpusError

__all__ = ["load_hf", "hf_identity", "export_hf_split", "sacrebleu_files", "GZIP_LEVEL"]

#: Compression of the exported JSONL: level 1 is ~4x faster than 6 for ~15 % more bytes.
GZIP_LEVEL = 1
_BATCH_ROWS = 10_000


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def load_hf(corpus: CorpusConfig, root: Path) -> Any:
    """``datasets.DatasetDict`` of ``corpus``: the hub dataset ``corpus.name`` (``config``, ``revision``)
    or, without ``name``, the local ``corpus.path`` (a ``save_to_disk`` folder, or a folder of data files
    that ``load_dataset`` reads: JSON lines, Parquet, CSV). A single ``Dataset`` becomes ``{"train": it}``.

    Raises ``CorpusError``: ``datasets`` not installed, the dataset unreachable (offline, no cache)
    or missing, or the local folder not a dataset.
    """
    try:
        import datasets
    except ImportError as e:
        raise CorpusError("data.corpus kind hf needs the `datasets` package (pinned in requirements.lock: "
                          "`make install`)") from e
    if corpus.name:
        what = f"Hugging Face dataset {corpus.name!r} (config {corpus.config}, revision {corpus.revision or 'main'})"
        try:
            ds = datasets.load_dataset(corpus.name, corpus.config, revision=corpus.revision)
        except Exception as e:  # noqa: BLE001 - offline, unknown name, hub errors: one line
            raise CorpusError(
                f"could not load {what}: {_first_line(e)}; needs network access to the Hugging Face hub, or the "
                "dataset already in the datasets cache with HF_DATASETS_OFFLINE=1, or a local copy "
                "(data.corpus.path: a save_to_disk folder or its data files, without data.corpus.name)") from e
    else:
        path = (root / corpus.path) if not Path(corpus.path).is_absolute() else Path(corpus.path)
        if not path.exists():
            raise CorpusError(f"{path}: no such dataset folder (data.corpus.path)")
        try:
            if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
                ds = datasets.load_from_disk(str(path))
            else:
                ds = datasets.load_dataset(str(path), corpus.config)
        except Exception as e:  # noqa: BLE001
            raise CorpusError(f"{path}: not a dataset that `datasets` can load: {_first_line(e)}") from e
    if isinstance(ds, datasets.Dataset):
        ds = datasets.DatasetDict({"train": ds})
    return ds


def hf_identity(corpus: CorpusConfig, ds: Any) -> dict[str, Any]:
    """What names the dataset's version: name or path, config, the requested revision, the resolved hub
    commit (``None`` when the hub cannot be asked) and ``datasets``' fingerprint of each split."""
    resolved = None
    if corpus.name:
        try:
            from huggingface_hub import HfApi

            resolved = HfApi().dataset_info(corpus.name, revision=corpus.revision).sha
        except Exception:  # noqa: BLE001 - offline after a cached load: the fingerprints still name the data
            resolved = None
    import datasets

    return {"name": corpus.name, "path": None if corpus.name else corpus.path, "config": corpus.config,
            "revision": corpus.revision, "resolved_revision": resolved, "datasets_version": datasets.__version__,
            "fingerprints": {split: getattr(d, "_fingerprint", None) for split, d in ds.items()}}


def _columns(d: Any, src: str, tgt: str, display: str) -> tuple[str | None, list[str]]:
    """``("translation", langs)`` for the translation shape, ``(None, columns)`` for one column per language.

    Raises ``CorpusError`` naming the columns (or languages) there are when a language is missing.
    """
    names = list(d.column_names)
    if "translation" in names:
        feature = d.features["translation"]
        langs = list(getattr(feature, "languages", None) or [])
        if not langs and len(d):
            langs = sorted(d[0]["translation"])
        missing = [x for x in (src, tgt) if x not in langs]
        if missing:
            raise CorpusError(f"{display}: no language {' or '.join(map(repr, missing))} in its \"translation\" column; "
                              f"it has {langs}")
        return "translation", langs
    missing = [x for x in (src, tgt) if x not in names]
    if missing:
        raise CorpusError(f"{display}: no column {' or '.join(map(repr, missing))}; its columns are {names} "
                          "(expected a \"translation\" column or one column per language)")
    return None, names


def export_hf_split(d: Any, src: str, tgt: str, out: Path, display: str) -> int:
    """Write split ``d`` to ``out`` (gzip JSONL, ``{"translation": {src: .., tgt: ..}}`` per row, in row
    order); return the number of rows. Raises ``CorpusError`` when a language is missing (see ``_columns``)."""
    nested, _ = _columns(d, src, tgt, display)
    n = 0
    with open(out, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=GZIP_LEVEL,
                                               mtime=0) as f:
        for batch in d.iter(batch_size=_BATCH_ROWS):
            if nested:
                rows = [(t.get(src), t.get(tgt)) for t in batch["translation"]]
            else:
                rows = list(zip(batch[src], batch[tgt]))
            f.write("".join(json.dumps({"translation": {src: s, tgt: t}}, ensure_ascii=False) + "\n"
                            for s, t in rows).encode("utf-8"))
            n += len(rows)
    return n


def sacrebleu_files(test_set: str, src: str, tgt: str) -> tuple[Path, Path]:
    """The source and first reference file of sacreBLEU test set ``test_set`` for ``src-tgt`` (from sacreBLEU's
    cache, ``$SACREBLEU`` or ``~/.sacrebleu``, downloaded there first when missing).

    Raises ``CorpusError``: unknown test set, a pair it does not have (naming the ones it has), or the
    files neither cached nor downloadable (offline).
    """
    from sacrebleu.dataset import DATASETS
    from sacrebleu.utils import SACREBLEU_DIR

    if test_set not in DATASETS:
        raise CorpusError(f"sacreBLEU has no test set {test_set!r} (e.g. wmt14, wmt19; `sacrebleu --list`)")
    dataset, pair = DATASETS[test_set], f"{src}-{tgt}"
    if pair not in dataset.langpairs:
        raise CorpusError(f"sacreBLEU test set {test_set!r} has no pair {pair}; it has {sorted(dataset.langpairs)}")
    try:
        source, refs = dataset.get_source_file(pair), dataset.get_reference_files(pair)
    except Exception as e:  # noqa: BLE001 - download failures surface as many types
        raise CorpusError(f"sacreBLEU test set {test_set} {pair} is not in {SACREBLEU_DIR} and could not be "
                          f"downloaded ({_first_line(e)}): run once with network access, or copy a cached "
                          "~/.sacrebleu here and set SACREBLEU to it") from e
    return Path(source), Path(refs[0])
