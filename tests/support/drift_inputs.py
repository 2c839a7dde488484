"""Real shifts for validating the drift detector (``benchmarks/studies/drift_validation.py``, the slow test).

Windows are drawn from the Multi30k files (the raw corpus folder, ``*.{lang}.gz``):

- ``same_domain``: test_2016_flickr and test_2017_flickr English (Flickr captions, as in training);
- ``mscoco``: test_2017_mscoco English (COCO captions: a real but mild shift);
- ``german`` / ``french``: the German or French side of a Flickr test set sent to the En->De model;
- ``upper``: Flickr English, upper-cased; ``noise``: Flickr English with one random character
  inserted into 30 % of the words (seeded).

Thresholds are tuned on the ``val`` split only (``val`` English for "no drift", ``val`` German
and noised ``val`` for "drift"); the test sets are never looked at for tuning.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["read_split", "windows", "upper", "insert_noise", "NOISE_ALPHABET"]

#: Characters the noise inserts: letters, digits and punctuation (what a bad OCR or a fat finger adds).
NOISE_ALPHABET = string.ascii_letters + string.digits + string.punctuation


def read_split(corpus_dir: str | Path, split: str, lang: str) -> list[str]:
    """Sentences of ``<corpus_dir>/<split>.<lang>.gz`` (validated, NFC; ``aiayn.data.readers.read_lines``)."""
    from aiayn.data.readers import read_lines

    return read_lines(Path(corpus_dir) / f"{split}.{lang}.gz")


def windows(sentences: Sequence[str], size: int, count: int, seed: int) -> list[list[str]]:
    """``count`` windows of ``size`` sentences: disjoint consecutive blocks while they last, then
    seeded random samples (without replacement inside a window)."""
    if size > len(sentences):
        raise ValueError(f"a window of {size} from {len(sentences)} sentences")
    out = [list(sentences[i: i + size]) for i in range(0, len(sentences) - size + 1, size)][:count]
    rng = np.random.default_rng(seed)
    while len(out) < count:
        out.append([sentences[i] for i in np.sort(rng.choice(len(sentences), size=size, replace=False))])
    return out


def upper(sentences: Sequence[str]) -> list[str]:
    """Upper-cased sentences."""
    return [s.upper() for s in sentences]


def insert_noise(sentences: Sequence[str], share: float = 0.3, seed: int = 0) -> list[str]:
    """Insert one random character of ``NOISE_ALPHABET`` at a random place in ``share`` of the words."""
    rng = np.random.default_rng(seed)
    out = []
    for s in sentences:
        words = s.split()
        for i, w in enumerate(words):
            if rng.random() < share:
                at = int(rng.integers(0, len(w) + 1))
                words[i] = w[:at] + NOISE_ALPHABET[int(rng.integers(len(NOISE_ALPHABET)))] + w[at:]
        out.append(" ".join(words))
    return out
