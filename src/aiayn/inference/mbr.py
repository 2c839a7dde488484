"""Minimum Bayes risk (MBR) selection over an n-best list: the consensus hypothesis instead of the beam's top one.

For candidates ``h`` and pseudo-references ``r`` (the same K hypotheses), the choice is

    argmax_h  sum_r  w(r) * utility(h, r)      (Kumar & Byrne 2004, Eq. 3)

with ``w`` uniform (``temp`` 0) or the softmax of the beam's length-normalised scores divided by ``temp``, and
``utility(h, h) = 100``. Utilities (``UTILITIES``): sentence BLEU with effective order, chrF, and their mean
(sacreBLEU). ``benchmarks/studies/mbr_study.py`` measures it on the test sets (docs/studies/decoding.md).
"""

from __future__ import annotations

import math

__all__ = ["UTILITIES", "choose", "mbr_choice", "utilities"]

UTILITIES = ("bleu", "chrf", "mean")


def utilities(texts: list[str]) -> dict[str, list[list[float]]]:
    """Per utility (``UTILITIES``), the matrix ``u[i][j] = utility(texts[i], texts[j])`` (``texts[j]`` the
    pseudo-reference; 100 where the two are the same text). Each sentence score is computed once."""
    from sacrebleu.metrics import BLEU, CHRF

    bleu, chrf = BLEU(effective_order=True), CHRF()
    same = [[h == r for r in texts] for h in texts]
    b = [[100.0 if same[i][j] else bleu.sentence_score(h, [r]).score for j, r in enumerate(texts)]
         for i, h in enumerate(texts)]
    c = [[100.0 if same[i][j] else chrf.sentence_score(h, [r]).score for j, r in enumerate(texts)]
         for i, h in enumerate(texts)]
    return {"bleu": b, "chrf": c, "mean": [[(x + y) / 2 for x, y in zip(rb, rc)] for rb, rc in zip(b, c)]}


def choose(scores: list[float], u: list[list[float]], temp: float) -> int:
    """Index of the hypothesis with the highest expected utility ``sum_r w(r) u[h][r]`` over the first
    ``len(scores)`` hypotheses, ``w`` uniform (``temp`` 0) or the softmax of ``scores / temp``."""
    top = max(scores)
    weights = [math.exp((s - top) / temp) if temp else 1.0 for s in scores]
    k = len(scores)
    expected = [sum(w * u[h][r] for r, w in enumerate(weights)) for h in range(k)]
    return max(range(k), key=expected.__getitem__)


def mbr_choice(cands: list[tuple[str, float]], utility: str, temp: float) -> str:
    """The hypothesis of ``cands`` (``(text, score)``, best first) with the highest expected ``utility`` against
    the others (module docstring)."""
    texts = [t for t, _ in cands]
    return texts[choose([s for _, s in cands], utilities(texts)[utility], temp)]
