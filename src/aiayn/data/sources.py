"""Corpus sources: ``params.data.corpus`` -> a checksummed snapshot of the raw text -> pairs per split.

A snapshot (the ``corpus`` stage's ``artifacts/corpus``, a DVC output, so cached and pushed like any
other) holds the raw text of the language pair's splits exactly as the source gave it: local files
copied byte for byte (plain or gzip), a Hugging Face dataset exported to gzip JSONL, sacreBLEU test
sets copied from its cache. Beside them:

``SHA256SUMS``   ``"<sha256>  <file>"`` for every file, sorted by name
``SOURCE.json``  ``{"identity": {kind, pair, name or path, config, revision, ...},
                   "splits": {split: {"format": "moses"|"tsv"|"jsonl", "files": [...], "origin": [...]}}}``;
                 ``origin`` names what the user gave (their file, ``dataset [split]``), and error
                 messages of ``prepare`` name it too, at the same line numbers.

Multi30k is verified against the embedded checksums (``aiayn.data.multi30k.MULTI30K_SHA256``) before it is
copied. ``prepare`` reads a snapshot back through ``split_reader``; without a snapshot, a Multi30k
config reads ``data/multi30k`` directly (``multi30k_manifest``), as ``aiayn prepare`` always did.

Errors: ``aiayn.data.readers.CorpusError`` naming the split, the files tried and the splits there are.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from aiayn.config.schema import DataConfig, corpus_identity
from aiayn.data.multi30k import MIRROR_ENV, MULTI30K_SHA256
from aiayn.data.readers import CorpusError
from aiayn.data.readers import JsonlPairs, MosesPairs, PairReader, TsvPairs
from aiayn.io import atomic_write_json, atomic_write_text, sha256_file

__all__ = ["SOURCE_FILE", "SUMS_FILE", "multi30k_splits", "available_splits", "outside_splits", "split_problems",
           "moses_languages", "corpus_identity", "snapshot", "multi30k_manifest", "load_manifest", "split_reader",
           "manifest_matches"]

SOURCE_FILE = "SOURCE.json"
SUMS_FILE = "SHA256SUMS"
_SUFFIX = {"tsv": ".tsv", "jsonl": ".jsonl"}


def multi30k_splits(src: str, tgt: str) -> tuple[str, ...]:
    """Multi30k splits that exist in both ``src`` and ``tgt`` (sorted); empty for an unknown language."""
    have: dict[str, set[str]] = {}
    for name in MULTI30K_SHA256:
        split, lang, _ = name.rsplit(".", 2)
        have.setdefault(split, set()).add(lang)
    return tuple(sorted(s for s, langs in have.items() if {src, tgt} <= langs))


def _resolve(root: Path, path: str) -> Path:
    """``path`` from params, absolute; a relative one is taken from the project ``root``, ``..`` folded."""
    return Path(os.path.normpath(path if Path(path).is_absolute() else Path(root) / path))


def _as_given(path: Path, root: Path, given: str) -> str:
    """How SOURCE.json and the log name a local corpus file: relative to the project when params gave a
    relative path (``../corpus/train.en``, the same bytes from any clone folder and either entry point),
    else absolute; ``..`` folded in both."""
    if Path(given).is_absolute():
        return os.path.normpath(path)
    return Path(os.path.relpath(os.path.abspath(path), os.path.abspath(root))).as_posix()


def _portable(origin: str, root: Path) -> str:
    """``origin`` relative to the project ``root`` (POSIX) when it is a file inside it, else unchanged: the
    snapshot's bytes (a DVC output) must not depend on the folder the project was cloned into."""
    path = Path(origin)
    if not path.is_absolute():
        return origin
    try:
        return path.resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:  # outside the project (the user's own file, a cache): what they gave
        return origin


def _one(found: list[Path]) -> Path | None:
    if len(found) > 1:  # one may be an edited, unpacked copy of the other: which is read must not be a silent rule
        raise CorpusError(f"both {found[1]} and {found[0]} exist: remove the one that is not your corpus")
    return found[0] if found else None


def outside_splits(data: DataConfig, root: Path) -> list[str]:
    """One line per ``data.corpus.splits`` entry of a local corpus whose file (or moses prefix) lies outside
    ``data.corpus.path``. DVC's ``corpus`` stage depends on that folder alone (``dvc.yaml``) and the data version
    hashes it, so an edit to a file outside it would re-run nothing and be in no version."""
    c = data.corpus
    if c.kind in ("multi30k", "hf"):
        return []
    base, out = _resolve(root, c.path).resolve(), []
    for split, target in sorted(c.splits.items()):
        found = _resolve(root, target).resolve()
        if not found.is_relative_to(base):
            where = "" if Path(target).is_absolute() else f" (= {found}: a relative path is the project root's)"
            out.append(f"data.corpus.splits.{split} {target!r}{where} is outside data.corpus.path {c.path!r}: DVC "
                       "watches that folder only, so edits to the file would re-run nothing; move it into the folder")
    return out


def split_problems(data: DataConfig, root: Path, splits: Iterable[str] | None = None) -> list[str]:
    """Why a local corpus's ``splits`` (default: every split ``data`` reads) cannot be read, one line each (empty:
    each has its files): a split mapped outside ``data.corpus.path``, files missing (the names tried), a file both
    plain and gzipped. What the corpus stage would raise, found without reading a byte."""
    if data.corpus.kind in ("multi30k", "hf"):
        return []
    out = outside_splits(data, root)
    for split in data.splits if splits is None else splits:
        if split not in data.corpus.sacrebleu:
            try:
                _local_split(data, root, split)
            except CorpusError as e:
                out.append(str(e))
    return out


def available_splits(data: DataConfig, root: Path | None) -> tuple[str, ...] | None:
    """The splits the source has for the pair, when that is known without loading it: Multi30k's table,
    or (with ``root``) the files in a local folder; plus the ``splits`` and ``sacrebleu`` entries.
    ``None`` for a Hugging Face dataset (its splits are known once it is loaded)."""
    c = data.corpus
    if c.kind == "hf":
        return None
    if c.kind == "multi30k":
        return tuple(sorted(set(multi30k_splits(data.src_lang, data.tgt_lang)) | set(c.sacrebleu)))
    if root is None:
        return None
    extra = {s for s in c.splits if all(_split_files(data, root, s)[1])} | set(c.sacrebleu)
    folder = _resolve(root, c.path)
    found: set[str] = set()
    if folder.is_dir():
        for f in folder.iterdir():
            name = f.name.removesuffix(".gz")
            if c.kind == "moses" and name.endswith(f".{data.src_lang}"):
                split = name.removesuffix(f".{data.src_lang}")
                if any(_split_files(data, root, split)[1][1]):
                    found.add(split)
            elif c.kind != "moses" and name.endswith(_SUFFIX[c.kind]):
                found.add(name.removesuffix(_SUFFIX[c.kind]))
    return tuple(sorted(found | extra))


def moses_languages(data: DataConfig, root: Path) -> list[str]:
    """The language codes of a moses folder's files (``{split}.{lang}[.gz]``), sorted; empty for other kinds."""
    folder = _resolve(root, data.corpus.path)
    if data.corpus.kind != "moses" or not folder.is_dir():
        return []
    return sorted({f.name.removesuffix(".gz").rsplit(".", 1)[1] for f in folder.iterdir()
                   if f.is_file() and "." in f.name.removesuffix(".gz")})


# --------------------------------------------------------------------------- one split's files


def multi30k_manifest(raw_dir: Path, data: DataConfig, *, verify: bool = False) -> dict[str, Any]:
    """The manifest of Multi30k files for ``data``'s pair and splits in ``raw_dir`` (read in place).

    Raises ``CorpusError``: a split Multi30k does not have for the pair (naming the ones it has), files
    missing (naming them and how to fetch them), or, with ``verify``, a file whose SHA-256 differs from
    the embedded checksum.
    """
    src, tgt = data.src_lang, data.tgt_lang
    wanted = [s for s in data.splits if s not in data.corpus.sacrebleu]
    have = multi30k_splits(src, tgt)
    unknown = [s for s in wanted if s not in have]
    if unknown:
        hint = f" (e.g. -S 'data.test_splits=[{', '.join(t for t in data.test_splits if t in have)}]')" \
            if any(t in have for t in data.test_splits) else ""
        raise CorpusError(f"multi30k has no split {', '.join(unknown)} for {data.pair}; it has {', '.join(have) or 'none'}"
                          f"{hint}")
    missing = [raw_dir / f"{s}.{lang}.gz" for s in wanted for lang in (src, tgt) if not (raw_dir / f"{s}.{lang}.gz").is_file()]
    if missing:
        raise CorpusError(
            f"raw corpus file(s) missing: {', '.join(map(str, missing))}; run `aiayn fetch` first "
            f"(offline: set {MIRROR_ENV}=/path/to/multi30k mirror, or pass --mirror)")
    splits = {}
    for s in wanted:
        files = [f"{s}.{lang}.gz" for lang in (src, tgt)]
        if verify:
            for name in files:
                actual = sha256_file(raw_dir / name)
                if actual != MULTI30K_SHA256[name]:
                    raise CorpusError(f"{raw_dir / name}: sha256 {actual}, expected {MULTI30K_SHA256[name]} "
                                      "(a changed file: `aiayn fetch` restores it)")
        splits[s] = {"format": "moses", "files": files, "origin": [str(raw_dir / f) for f in files]}
    return {"identity": corpus_identity(data), "splits": splits}


def _split_files(data: DataConfig, root: Path, split: str) -> tuple[list[str], list[list[Path]]]:
    """Where one split of a local corpus may live: the names tried, and per side (a moses split's two
    ``{prefix}.{lang}``, else its one file) the files that exist, ``{stem}.gz`` first (a ``splits`` file of a
    tsv/jsonl corpus: exactly as given)."""
    c = data.corpus
    base = _resolve(root, c.path)
    if c.kind != "moses" and split in c.splits:
        given = _resolve(root, c.splits[split])
        return [str(given)], [[given] if given.is_file() else []]
    if c.kind == "moses":
        prefix = _resolve(root, c.splits[split]) if split in c.splits else base / split
        stems = [prefix.with_name(f"{prefix.name}.{lang}") for lang in (data.src_lang, data.tgt_lang)]
    else:
        stems = [base / f"{split}{_SUFFIX[c.kind]}"]
    pairs = [(stem.with_name(stem.name + ".gz"), stem) for stem in stems]
    return [str(f) for pair in pairs for f in pair], [[f for f in pair if f.is_file()] for pair in pairs]


def _local_split(data: DataConfig, root: Path, split: str) -> tuple[str, list[Path]]:
    """``(format, files)`` of one split of a local corpus; ``CorpusError`` naming what was tried, or the two
    files when one is there both plain and gzipped."""
    c = data.corpus
    base = _resolve(root, c.path)
    tried, sides = _split_files(data, root, split)
    files = [_one(side) for side in sides]
    if all(files):
        return c.kind, files
    have = available_splits(data, root)
    raise CorpusError(f"{c.kind} corpus: no file for split {split!r} ({data.pair}): tried {', '.join(tried)}; "
                      f"{base} has splits {', '.join(have) if have else 'none'}")


def _copy(origin: Path, out_dir: Path, name: str) -> str:
    """Copy ``origin`` to ``out_dir/name`` (``.gz`` added when it is gzip); return the file name."""
    with open(origin, "rb") as f:
        if f.read(2) == b"\x1f\x8b" and not name.endswith(".gz"):
            name += ".gz"
    shutil.copyfile(origin, out_dir / name)
    return name


def snapshot(data: DataConfig, root: Path, out_dir: Path) -> dict[str, Any]:
    """Write the raw text of ``data``'s pair and splits into the empty folder ``out_dir``, with ``SHA256SUMS``
    and ``SOURCE.json``; return the manifest (``SOURCE.json``'s content).

    Raises ``CorpusError`` (see the module docstring; ``aiayn.data.hub`` for datasets and sacreBLEU).
    """
    c, root, out_dir = data.corpus, Path(root), Path(out_dir)
    src, tgt = data.src_lang, data.tgt_lang
    identity = corpus_identity(data)
    splits: dict[str, dict[str, Any]] = {}
    own = [s for s in data.splits if s not in c.sacrebleu]
    if c.kind == "multi30k":
        raw = _resolve(root, c.path)
        for split, entry in multi30k_manifest(raw, data, verify=True)["splits"].items():
            files = [_copy(raw / f, out_dir, f) for f in entry["files"]]
            splits[split] = entry | {"files": files}
    elif c.kind == "hf":
        from aiayn.data import hub

        ds = hub.load_hf(c, root)
        identity |= hub.hf_identity(c, ds)
        label = c.name or c.path
        for split in own:
            theirs = c.splits.get(split, split)
            if theirs not in ds:
                raise CorpusError(f"dataset {label} has no split {theirs!r} (for {split}); it has {sorted(ds)} "
                                  "(map ours to theirs with data.corpus.splits, e.g. {val: validation})")
            name = f"{split}.jsonl.gz"
            origin = f"{label} [{theirs}]"
            hub.export_hf_split(ds[theirs], src, tgt, out_dir / name, origin)
            splits[split] = {"format": "jsonl", "files": [name], "origin": [origin]}
    else:
        outside = outside_splits(data, root)
        if outside:
            raise CorpusError("; ".join(outside))
        for split in own:
            fmt, files = _local_split(data, root, split)
            if fmt == "moses":
                names = [_copy(f, out_dir, f"{split}.{lang}") for f, lang in zip(files, (src, tgt))]
            else:
                names = [_copy(files[0], out_dir, f"{split}{_SUFFIX[fmt]}")]
            given = c.splits.get(split, c.path)
            splits[split] = {"format": fmt, "files": names, "origin": [_as_given(f, root, given) for f in files]}
    for split, test_set in sorted(c.sacrebleu.items()):
        from aiayn.data import hub

        files = hub.sacrebleu_files(test_set, src, tgt)
        names = [_copy(f, out_dir, f"{split}.{lang}") for f, lang in zip(files, (src, tgt))]
        splits[split] = {"format": "moses", "files": names, "origin": [str(f) for f in files]}
    for entry in splits.values():
        entry["origin"] = [_portable(o, root) for o in entry["origin"]]
    manifest = {"identity": identity, "splits": {s: splits[s] for s in data.splits}}
    sums = sorted((name, sha256_file(out_dir / name)) for entry in splits.values() for name in entry["files"])
    atomic_write_text(out_dir / SUMS_FILE, "".join(f"{h}  {n}\n" for n, h in sums))
    atomic_write_json(out_dir / SOURCE_FILE, manifest)
    return manifest


def load_manifest(corpus_dir: Path) -> dict[str, Any] | None:
    """``SOURCE.json`` of a snapshot, or ``None`` when there is none."""
    path = Path(corpus_dir) / SOURCE_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise CorpusError(f"{path}: not valid JSON ({e}): run `aiayn corpus` again") from e


def manifest_matches(manifest: dict[str, Any], data: DataConfig) -> str | None:
    """``None`` when the snapshot holds ``data``'s corpus, pair and splits; else why not (one line)."""
    want, have = corpus_identity(data), manifest.get("identity", {})
    differs = [k for k, v in want.items() if have.get(k) != v]
    if differs:
        return f"it holds {', '.join(f'{k}={have.get(k)!r}' for k in differs)}, the params ask " \
               f"{', '.join(f'{k}={want[k]!r}' for k in differs)}"
    missing = [s for s in data.splits if s not in manifest.get("splits", {})]
    return f"it has no split {', '.join(missing)}" if missing else None


def split_reader(corpus_dir: Path, manifest: dict[str, Any], split: str, data: DataConfig) -> PairReader:
    """The pairs of ``split`` in a snapshot (or in place: ``multi30k_manifest``), naming the user's files in
    errors. Raises ``CorpusError`` for a split the manifest lacks."""
    entry = manifest["splits"].get(split)
    if entry is None:
        raise CorpusError(f"{Path(corpus_dir) / SOURCE_FILE} has no split {split!r}: run `aiayn corpus` again")
    files = [Path(corpus_dir) / f for f in entry["files"]]
    origin = entry.get("origin") or [str(f) for f in files]
    if entry["format"] == "moses":
        return MosesPairs(files[0], files[1], display=(origin[0], origin[1]))
    if entry["format"] == "tsv":
        return TsvPairs(files[0], data.src_lang, data.tgt_lang, columns=data.corpus.columns,
                        header=data.corpus.header, display=origin[0])
    return JsonlPairs(files[0], data.src_lang, data.tgt_lang, display=origin[0])

