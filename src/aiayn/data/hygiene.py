"""Real-corpus hygiene: which train pairs ``prepare`` keeps, and what it checks in valid and test splits.

Train pairs, rules tried in ``TRAIN_RULES`` order (a dropped pair counts under the first it hits):

``empty``         a side is empty or whitespace only (WMT and OPUS corpora have them)
``control_char``  a side holds a control character (tab excepted) or U+2028/U+2029
``too_short``, ``too_long``, ``ratio``   the length rules (``length_rule``)
``duplicate``     the same (source, target) pair was kept before (``data.dedup``)
``contaminated``  the source sentence is also a source of a test split (``data.decontaminate``)
``langid_src``, ``langid_tgt``   py3langid does not identify the side as ``src_lang`` / ``tgt_lang``
                  (``data.langid``; its model ships inside the package, no download)

Valid and test splits are checked, never filtered (scores stay comparable with other systems): an
empty side or a control character stops ``prepare`` naming file and line (they would break
scoring); duplicates and language-ID misses are counted. A split whose every pair is also in
another split (valid vs test, one test vs another), or a test split whose every source sentence is
in train, is refused: such splits "overlap entirely" and a score on them means nothing.

Duplicate detection keeps an 8-byte BLAKE2b digest per pair (about 70 bytes each in a Python set:
~300 MB at 4.5M pairs), not the text.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from aiayn.config.schema import DataConfig
from aiayn.data.readers import BAD_CHAR, CorpusError, subword_marker

if TYPE_CHECKING:
    from aiayn.data.readers import PairReader

__all__ = ["FILTER_RULES", "length_rule", "TRAIN_RULES", "EVAL_CHECKS", "LanguageId", "TrainRules", "EvalChecks", "pair_digest", "check_overlaps"]

TRAIN_RULES = ("empty", "control_char", "too_short", "too_long", "ratio", "duplicate", "contaminated",
               "langid_src", "langid_tgt")
#: Counted (never dropped) in valid and test splits; ``duplicate`` also in train when ``dedup`` is off.
EVAL_CHECKS = ("duplicate", "langid_src", "langid_tgt")

#: The length rules in the order they are tried; a dropped pair counts under the first it hits.
FILTER_RULES = ("too_short", "too_long", "ratio")


def length_rule(src: str, tgt: str, cfg: DataConfig) -> str | None:
    """The first ``FILTER_RULES`` rule the pair breaks, or ``None``.

    Lengths are whitespace-separated words. Rules, tried in ``FILTER_RULES`` order
    (a dropped pair counts under the first it hits):

    ``too_short``  a side has fewer than ``cfg.min_words`` words
    ``too_long``   a side has more than ``cfg.max_words`` words
    ``ratio``      longer side / shorter side > ``cfg.max_ratio``
    """
    n_src, n_tgt = len(src.split()), len(tgt.split())
    shorter, longer = min(n_src, n_tgt), max(n_src, n_tgt)
    if shorter < cfg.min_words:
        return "too_short"
    if longer > cfg.max_words:
        return "too_long"
    if longer > cfg.max_ratio * shorter:
        return "ratio"
    return None


def pair_digest(src: str, tgt: str) -> int:
    """64-bit digest of a pair (BLAKE2b; a tab cannot occur inside a TSV field, so it separates the sides)."""
    return int.from_bytes(hashlib.blake2b(f"{src}\t{tgt}".encode("utf-8"), digest_size=8).digest(), "little")


class LanguageId:
    """py3langid's model (Lui & Baldwin 2012, "langid.py"), loaded once (~1 s): ``lid(text) -> code``.

    Raises ``CorpusError`` when a language of ``langs`` is not among the model's 97 labels.
    """

    def __init__(self, langs: Iterable[str]) -> None:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier

        self._model = LanguageIdentifier.from_model_file(MODEL_FILE)
        unknown = sorted(set(langs) - set(self._model.labels))
        if unknown:
            raise CorpusError(f"data.langid: py3langid does not know {unknown}; it knows {sorted(self._model.labels)}")

    def __call__(self, text: str) -> str:
        return self._model.classify(text)[0]

    @staticmethod
    def labels() -> list[str]:
        """The language codes py3langid identifies."""
        from py3langid.langid import MODEL_FILE, LanguageIdentifier

        return sorted(LanguageIdentifier.from_model_file(MODEL_FILE).labels)


class TrainRules:
    """Decides, pair by pair, whether a train pair is kept; counts each drop in ``dropped``.

    ``test_sources``: the source sentences of every test split (for ``contaminated``). ``dropped``
    has a key for each rule that runs (``TRAIN_RULES`` order); ``checks`` counts duplicates kept when
    ``dedup`` is off.
    """

    def __init__(self, data: DataConfig, test_sources: set[str], lid: LanguageId | None = None) -> None:
        self.data, self.test_sources, self.lid = data, test_sources, lid
        active = {"duplicate": data.dedup_on, "contaminated": data.decontaminate,
                  "langid_src": lid is not None, "langid_tgt": lid is not None}
        self.dropped = {rule: 0 for rule in TRAIN_RULES if active.get(rule, True)}
        self.checks = {} if data.dedup_on else {"duplicate": 0}
        self.test_hits: set[str] = set()
        self._seen: set[int] = set()

    def verdict(self, src: str, tgt: str) -> str | None:
        """The rule that drops ``(src, tgt)`` (and counts it), or ``None``: keep it."""
        rule = self._rule(src, tgt)
        if rule is not None:
            self.dropped[rule] += 1
        return rule

    def _rule(self, src: str, tgt: str) -> str | None:
        if not src or not tgt or src.isspace() or tgt.isspace():
            return "empty"
        if BAD_CHAR.search(src) or BAD_CHAR.search(tgt):
            return "control_char"
        if rule := length_rule(src, tgt, self.data):
            return rule
        digest = pair_digest(src, tgt)
        if digest in self._seen:
            if self.data.dedup_on:
                return "duplicate"
            self.checks["duplicate"] += 1
        else:
            self._seen.add(digest)
        if src in self.test_sources:
            self.test_hits.add(src)
            if self.data.decontaminate:
                return "contaminated"
        if self.lid is not None:
            if self.lid(src) != self.data.src_lang:
                return "langid_src"
            if self.lid(tgt) != self.data.tgt_lang:
                return "langid_tgt"
        return None


class EvalChecks:
    """Checks one valid or test split without dropping anything.

    ``check(lineno, src, tgt, reader)`` raises ``CorpusError`` for an empty side (``reader.empty``'s words:
    an empty line, column or JSON field) or a control character (``reader.where(side, lineno)`` names file
    and line, as ``aiayn.data.readers.read_lines`` does); ``counts`` has
    ``duplicate`` (and, with language ID, ``langid_src``/``langid_tgt``).
    """

    def __init__(self, data: DataConfig, lid: LanguageId | None = None) -> None:
        self.data, self.lid = data, lid
        self.counts = {"duplicate": 0} | ({"langid_src": 0, "langid_tgt": 0} if lid is not None else {})
        self.digests: set[int] = set()

    def check(self, lineno: int, src: str, tgt: str, reader: PairReader) -> None:
        where = reader.where
        for side, text in (("src", src), ("tgt", tgt)):
            if not text or text.isspace():
                raise CorpusError(f"{reader.empty(side, lineno)} (valid and test splits are never filtered: "
                                  "fix the file)")
            bad = BAD_CHAR.search(text)
            if bad:
                import unicodedata

                ch = bad.group()
                raise CorpusError(f"{where(side, lineno)}: control character U+{ord(ch):04X} "
                                  f"({unicodedata.name(ch, 'unnamed')}) at column {bad.start() + 1}")
        if (marker := subword_marker(tgt)) is not None:
            raise CorpusError(f"{where('tgt', lineno)}: the reference contains a subword marker {marker.strip()!r} "
                              f"({tgt[:60]!r}): the scorer refuses it; fix the file (valid and test splits are never "
                              "filtered)")
        digest = pair_digest(src, tgt)
        if digest in self.digests:
            self.counts["duplicate"] += 1
        self.digests.add(digest)
        if self.lid is not None:
            self.counts["langid_src"] += self.lid(src) != self.data.src_lang
            self.counts["langid_tgt"] += self.lid(tgt) != self.data.tgt_lang


def check_overlaps(eval_digests: dict[str, set[int]], test_sources: dict[str, set[str]],
                   train_hits: set[str]) -> None:
    """Refuse splits that overlap entirely (``CorpusError`` naming both).

    ``eval_digests``: each valid/test split's pair digests; ``test_sources``: each test split's source
    sentences; ``train_hits``: the test sources found in train.
    """
    names = list(eval_digests)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            da, db = eval_digests[a], eval_digests[b]
            if da and db and (da <= db or db <= da):
                inner, outer = (a, b) if da <= db else (b, a)
                raise CorpusError(f"splits {inner} and {outer} overlap entirely: every pair of {inner} is in {outer} "
                                  "(the same file twice?); a score on them would mean nothing")
    for split, sources in test_sources.items():
        if sources and sources <= train_hits:
            raise CorpusError(f"test split {split} overlaps train entirely: every source sentence of {split} is "
                              "also in train (the same file twice?)")
