"""The adapted run: its data (the reviewed corpus) and the params it overrides.

The adapted pipeline is the normal one (``dvc repro``: corpus -> ... -> export) run with three overrides
(``adapted_overrides``):

- ``train.init_from``: the champion (``models:/NAME@champion``): continued training from it;
- ``data.corpus``: the reviewed corpus as a ``tsv`` source (``adapt.reviewed_corpus`` is its train split;
  its folder holds the other splits as ``<split>.tsv``, source<TAB>target);
- ``data.test_splits``: the new domain's test split and the parent's test sets (``adapt.gate``), so the
  evaluate stage and the gate read them like any test split.

``prepare_corpus`` checks the folder and fills it: the new domain's test split must be there (the user's);
the validation split and each old test split missing there is written from the project's prepared text
(``artifacts/prepared/<split>.<lang>``: the parent's own test sets), atomically, once. Every refusal is one
line (``AdaptError``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path, PurePosixPath
from typing import Any

from aiayn.config.schema import Params
from aiayn.io import atomic_write_text

__all__ = ["AdaptError", "champion_uri", "adapted_overrides", "prepare_corpus", "corpus_folder", "PARAMS_BACKUP",
           "restore_interrupted_adaptation"]

#: The project's own ``params.yaml`` while an adapted run has replaced it (``pipelines.adapt_flow``): written
#: before the adapted file, removed after the original is back. Left behind only by a killed adapt run.
PARAMS_BACKUP = ".aiayn/params.before-adapt.yaml"


class AdaptError(ValueError):
    """The adaptation cannot start (a missing split, an unset key); one line naming it."""


def champion_uri(name: str) -> str:
    """The ``train.init_from`` of an adaptation: the registered model's champion."""
    return f"models:/{name}@champion"


def corpus_folder(params: Params, root: Path) -> Path:
    """The reviewed corpus's folder (absolute): the adapted run's ``data.corpus.path``."""
    corpus = Path(params.adapt.reviewed_corpus)
    return (corpus if corpus.is_absolute() else Path(root) / corpus).parent


def _new_domain_split(params: Params) -> str:
    split = params.adapt.gate.new_domain_split
    if split is None:
        raise AdaptError("adapt.gate.new_domain_split is not set: name the new domain's test split (its pairs in "
                         f"{PurePosixPath(params.adapt.reviewed_corpus).parent}/<split>.tsv)")
    return split


def adapted_overrides(params: Params, *, init_from: str) -> dict[str, Any]:
    """``{dotted params key: value}`` of the adapted run (module doc); paths as ``adapt.reviewed_corpus``
    gives them (relative to the project root, or absolute). Raises ``AdaptError`` when
    ``adapt.gate.new_domain_split`` is unset."""
    gate, d = params.adapt.gate, params.data
    corpus = PurePosixPath(params.adapt.reviewed_corpus)
    return {
        "train.init_from": init_from,
        "data.corpus": {"kind": "tsv", "path": str(corpus.parent), "splits": {d.train_split: str(corpus)}},
        "data.test_splits": [_new_domain_split(params), *gate.old_splits],
    }


def _tsv_from_prepared(params: Params, prepared: Path, split: str, out: Path) -> None:
    src, tgt = (prepared / f"{split}.{lang}" for lang in (params.data.src_lang, params.data.tgt_lang))
    if not (src.is_file() and tgt.is_file()):
        raise AdaptError(f"{out} not found, and no prepared {split} split ({src}) to write it from: put the "
                         f"{split} pairs there (source<TAB>target) or run the pipeline once first")
    sources = src.read_text(encoding="utf-8").splitlines()
    targets = tgt.read_text(encoding="utf-8").splitlines()
    if len(sources) != len(targets):
        raise AdaptError(f"{src} has {len(sources)} lines but {tgt} has {len(targets)}: cannot pair them into {out}")
    for n, pair in enumerate(zip(sources, targets), 1):
        if any("\t" in side for side in pair):
            raise AdaptError(f"{src if chr(9) in pair[0] else tgt} line {n} holds a tab: it cannot go into {out}")
    atomic_write_text(out, "".join(f"{s}\t{t}\n" for s, t in zip(sources, targets)))


def prepare_corpus(params: Params, root: Path, prepared: Path) -> list[str]:
    """Check the reviewed corpus's folder and fill in what the adapted run needs (module doc). Returns the
    splits written. Raises ``AdaptError`` (nothing is written then, except splits written before the error,
    each whole): no reviewed pairs, no new-domain test split, a split neither there nor prepared."""
    new = _new_domain_split(params)
    folder = corpus_folder(params, root)
    corpus = folder / PurePosixPath(params.adapt.reviewed_corpus).name
    if not corpus.is_file() or not corpus.read_text(encoding="utf-8").strip():
        raise AdaptError(f"the reviewed corpus {corpus} holds no pairs: `aiayn review import` writes it")
    if not (folder / f"{new}.tsv").is_file():
        raise AdaptError(f"adapt.gate.new_domain_split {new!r}: {folder / f'{new}.tsv'} not found: put the new "
                         "domain's test pairs there (source<TAB>target, one pair a line)")
    written = []
    for split in dict.fromkeys((params.data.valid_split, *params.adapt.gate.old_splits)):
        out = folder / f"{split}.tsv"
        if not out.is_file():
            _tsv_from_prepared(params, Path(prepared), split, out)
            written.append(split)
    _check_not_all_test_sources(corpus, [folder / f"{s}.tsv" for s in dict.fromkeys((new, *params.adapt.gate.old_splits))])
    return written


def _check_not_all_test_sources(corpus: Path, tests: list[Path]) -> None:
    """``AdaptError`` when every reviewed pair's source is a source of the adapted run's test splits: the prepare
    stage drops a train pair whose source a test split holds (``data.decontaminate``), so none would be left. Names
    each split and how many reviewed sources it holds (reviewed answers to a split's own sentences: take that split
    out of ``adapt.gate.old_splits``, or review other traffic)."""
    def sources(path: Path) -> list[str]:
        return [line.split("\t", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    reviewed = set(sources(corpus))
    held = {t.stem: reviewed & set(sources(t)) for t in tests if t.is_file()}
    if reviewed and reviewed <= set().union(*held.values()):
        named = ", ".join(f"{split} holds {len(found)}" for split, found in held.items() if found)
        raise AdaptError(f"every one of the {len(reviewed)} reviewed sources in {corpus} is a test sentence of the "
                         f"adapted run ({named}): prepare would drop them all as test-contaminated; take that split "
                         "out of adapt.gate.old_splits (or adapt.gate.new_domain_split), or review other sentences")


def restore_interrupted_adaptation(root: Path, *, locked: bool = False) -> bool:
    """Put the project's ``params.yaml`` back when a killed adapt run left it adapted (``PARAMS_BACKUP``
    present and no adapt run holding the lock; ``locked``: the caller holds it); returns whether it did.
    Run first by the adapt flow and the pipeline flow, so a nightly retrain never starts from the champion
    by accident."""
    from aiayn.adaptation.trigger import adapt_lock

    root = Path(root)
    if not (root / PARAMS_BACKUP).is_file():
        return False
    with contextlib.nullcontext(True) if locked else adapt_lock(root) as held:
        if not held:  # an adaptation is running: its params are meant to be adapted
            return False
        atomic_write_text(root / "params.yaml", (root / PARAMS_BACKUP).read_text(encoding="utf-8"))
        (root / PARAMS_BACKUP).unlink()
    return True
