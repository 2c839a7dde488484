"""``prepare`` stage: raw Multi30k -> validated, NFC-normalised, filtered plain text.

Reads ``layout.raw/{split}.{lang}.gz`` for the train, valid and test splits of
``params.data``; validates and normalises them (``aiayn.corpus.read_parallel``);
filters train only (``aiayn.corpus.filter_pairs``); keeps the first
``max_train_pairs`` / ``max_eval_pairs`` pairs when set. Writes, as one atomic
directory swap:

``layout.prepared/{split}.{src_lang}``, ``{split}.{tgt_lang}``
    UTF-8, one sentence per line, line N of one translates line N of the other.
``layout.prepared/report.json``
    ``{split: {"read": n, "kept": n, "dropped": {rule: n}}}`` where
    ``read == kept + sum(dropped.values())``; rules are the filter rules
    (train only) and ``max_pairs`` (pairs beyond the ``max_*_pairs`` cap).
"""

from __future__ import annotations

from pathlib import Path

from aiayn.config import Params
from aiayn.corpus import MIRROR_ENV, CorpusError, filter_pairs, read_parallel
from aiayn.io import atomic_dir, atomic_write_json, atomic_write_text
from aiayn.recording import NULL_RECORDER, Recorder
from aiayn.stages import Layout

__all__ = ["run", "raw_path"]


def raw_path(layout: Layout, split: str, lang: str) -> Path:
    """``layout.raw/{split}.{lang}.gz``."""
    return layout.raw / f"{split}.{lang}.gz"


def run(params: Params, layout: Layout, recorder: Recorder = NULL_RECORDER) -> dict:
    """Run the stage; return the report (also written to ``report.json``). ``recorder`` records
    nothing of this stage (no run of its own: the report is in ``artifacts/prepared``).

    Raises ``CorpusError``: a raw file is missing (telling the user to run
    ``aiayn fetch``) or malformed (file + line).
    """
    data = params.data
    langs = (data.src_lang, data.tgt_lang)
    splits = (data.train_split, data.valid_split, *data.test_splits)
    missing = [raw_path(layout, s, lang) for s in splits for lang in langs if not raw_path(layout, s, lang).is_file()]
    if missing:
        raise CorpusError(
            f"raw corpus file(s) missing: {', '.join(map(str, missing))}; run `aiayn fetch` first "
            f"(offline: set {MIRROR_ENV}=/path/to/multi30k mirror, or pass --mirror)"
        )

    report: dict[str, dict] = {}
    outputs: dict[str, list[tuple[str, str]]] = {}
    for split in splits:
        pairs = read_parallel(raw_path(layout, split, data.src_lang), raw_path(layout, split, data.tgt_lang))
        if split == data.train_split:
            kept, dropped = filter_pairs(pairs, data)
            cap = data.max_train_pairs
        else:
            kept, dropped = pairs, {}
            cap = data.max_eval_pairs
        over = max(0, len(kept) - cap) if cap is not None else 0
        kept = kept[: len(kept) - over]
        report[split] = {"read": len(pairs), "kept": len(kept), "dropped": {**dropped, "max_pairs": over}}
        outputs[split] = kept

    with atomic_dir(layout.prepared) as tmp:
        for split, kept in outputs.items():
            for side, lang in enumerate(langs):
                atomic_write_text(tmp / f"{split}.{lang}", "".join(pair[side] + "\n" for pair in kept))
        atomic_write_json(tmp / "report.json", report)
    return report
