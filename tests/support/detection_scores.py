"""The output-detection study's logic (``benchmarks/studies/output_detection.py``): labels, suspicion scores,
AUROC, the unfitted combined detector, precision and recall, and the input noise of its shifted conditions.

- ``chrf_scores`` / ``label_bad``: an answer is BAD when its sentence chrF (sacreBLEU's defaults: chrF2,
  character 6-grams, no word n-grams) against the reference is below the cut.
- ``suspicion``: one signal's values oriented by its bad tail (``aiayn.quality.calibration.TAILS``): ``low`` ->
  ``-x``, ``high`` -> ``x``, ``both`` (``length_ratio``) -> ``|log(x / m)|`` with ``m`` the in-domain (val)
  median, so both a truncated and a run-on answer score high; a missing or non-finite value (and ``x <= 0``
  under ``both``) scores ``+inf``, the most suspicious.
- ``auroc``: sklearn's ``roc_auc_score`` (the Mann-Whitney statistic, ties counted one half) with ``+inf`` put
  just above the largest finite score; ``None`` when one class is absent.
- ``tail_probabilities`` / ``min_tail_probability``: each signal's value turned into its in-domain tail
  probability against the val answers' empirical distribution (``(k + 1) / (n + 1)``, ``k`` the val values at
  least as far into the bad tail; ``both``: twice the smaller tail, at most 1; missing: 0), and the minimum
  over signals: the most surprising signal wins. Nothing is fitted on the labelled set.
- ``logistic_cv_scores``: the fitted upper reference, out-of-fold probabilities of a logistic regression.
- ``precision_recall`` of a 0/1 rule against the labels.
- ``char_noise`` / ``shuffle_words``: the seeded input corruptions (upper-casing is ``drift_inputs.upper``);
  ``sample_indices``: the seeded sample of a condition's lines.
- ``early_checkpoint``: the oldest kept checkpoint when its step is at most half the final model's;
  ``corrupt_model``: one attention value or output projection scaled (a broken int8 scale), seeded.
"""

from __future__ import annotations

import json
import math
import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CORRUPTIBLE", "NOISE_LETTERS", "auroc", "char_noise", "chrf_scores",
           "corrupt_model", "early_checkpoint", "label_bad", "logistic_cv_scores", "min_tail_probability",
           "precision_recall", "sample_indices", "shuffle_words", "suspicion", "tail_probabilities",
           "val_distribution", "values_of"]

#: What a substituted character becomes (a fat finger or bad OCR: a letter or a digit).
NOISE_LETTERS = string.ascii_lowercase + string.digits
#: The tensors ``corrupt_model`` may scale: an attention layer's value or output projection (scaling a query or
#: key projection only sharpens the attention; these put the error straight into the residual stream).
CORRUPTIBLE = (".v_proj.weight", ".out_proj.weight")


def chrf_scores(hyps: Sequence[str], refs: Sequence[str]) -> list[float]:
    """Sentence chrF (0-100) of each hypothesis against its one reference (``sacrebleu.sentence_chrf``)."""
    import sacrebleu

    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    return [float(sacrebleu.sentence_chrf(h, [r]).score) for h, r in zip(hyps, refs)]


def label_bad(chrf: Sequence[float], cut: float) -> np.ndarray:
    """``True`` where the sentence chrF is below ``cut`` (a BAD answer)."""
    return np.asarray(chrf, dtype=np.float64) < cut


def values_of(rows: Sequence[Mapping[str, Any] | None], name: str) -> np.ndarray:
    """Signal ``name`` of each row as floats, NaN where the row or the value is missing."""
    out = []
    for r in rows:
        x = None if r is None else r.get(name)
        out.append(math.nan if x is None else float(x))
    return np.asarray(out, dtype=np.float64)


def val_distribution(val_rows: Sequence[Mapping[str, Any] | None], names: Sequence[str]) -> dict[str, np.ndarray]:
    """Per signal, the sorted finite values of the in-domain (val) answers; a signal without any is left out."""
    out = {}
    for name in names:
        v = values_of(val_rows, name)
        v = np.sort(v[np.isfinite(v)])
        if v.size:
            out[name] = v
    return out


def suspicion(values: Sequence[float], tail: str, val_median: float | None = None) -> np.ndarray:
    """Higher = more suspicious (module docstring); ``val_median`` is needed for ``tail="both"``."""
    x = np.asarray(values, dtype=np.float64)
    if tail == "low":
        s = -x
    elif tail == "high":
        s = x.copy()
    elif tail == "both":
        if val_median is None or not val_median > 0:
            raise ValueError(f"tail 'both' needs a positive in-domain median, got {val_median}")
        with np.errstate(divide="ignore", invalid="ignore"):
            s = np.abs(np.log(x / val_median))
        s[x <= 0] = np.inf
    else:
        raise ValueError(f"tail must be low, high or both, got {tail!r}")
    s[~np.isfinite(s)] = np.inf
    return s


def auroc(bad: Sequence[bool], score: Sequence[float]) -> float | None:
    """Area under the ROC curve of ``score`` for ``bad`` (1 = perfect, 0.5 = chance, 0 = reversed; ties half);
    ``+inf`` ranks above every finite score (tied with other ``+inf``); ``None`` when only one class is present."""
    from sklearn.metrics import roc_auc_score

    y = np.asarray(bad, dtype=bool)
    s = np.asarray(score, dtype=np.float64).copy()
    if y.size != s.size:
        raise ValueError(f"{y.size} labels but {s.size} scores")
    if np.isnan(s).any() or np.isneginf(s).any():
        raise ValueError("scores must be finite or +inf (orient them with suspicion first)")
    if y.all() or not y.any():
        return None
    finite = s[np.isfinite(s)]
    s[np.isposinf(s)] = (finite.max() + 1.0) if finite.size else 0.0
    return float(roc_auc_score(y, s))


def tail_probabilities(values: Sequence[float], tail: str, val_sorted: np.ndarray) -> np.ndarray:
    """Each value's in-domain tail probability against ``val_sorted`` (module docstring); NaN -> 0."""
    x = np.asarray(values, dtype=np.float64)
    v = np.asarray(val_sorted, dtype=np.float64)
    n = v.size
    if n == 0:
        raise ValueError("no in-domain values to compare with")
    at_most = np.searchsorted(v, x, side="right")  # val values <= x
    at_least = n - np.searchsorted(v, x, side="left")  # val values >= x
    low, high = (at_most + 1) / (n + 1), (at_least + 1) / (n + 1)
    if tail == "low":
        p = low
    elif tail == "high":
        p = high
    elif tail == "both":
        p = np.minimum(1.0, 2 * np.minimum(low, high))
    else:
        raise ValueError(f"tail must be low, high or both, got {tail!r}")
    p = np.asarray(p, dtype=np.float64)
    p[~np.isfinite(x)] = 0.0
    return p


def min_tail_probability(rows: Sequence[Mapping[str, Any] | None], val: Mapping[str, np.ndarray],
                         tails: Mapping[str, str]) -> tuple[np.ndarray, list[str]]:
    """``(p, which)``: per row the smallest tail probability over the signals of ``val`` and the signal it came
    from (the first in ``val``'s order on a tie). The detector's score is ``-p``."""
    if not val:
        raise ValueError("no signal has in-domain values")
    names = list(val)
    table = np.stack([tail_probabilities(values_of(rows, n), tails[n], val[n]) for n in names], axis=1)
    k = table.argmin(axis=1)
    return table[np.arange(len(rows)), k], [names[i] for i in k]


def logistic_cv_scores(features: np.ndarray, bad: Sequence[bool], *, seed: int, folds: int = 5) -> np.ndarray:
    """Out-of-fold P(bad) of a standardised logistic regression on ``features`` (rows = answers; +inf already
    replaced), stratified ``folds``-fold: FITTED on the labelled set, an upper reference only."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    y = np.asarray(bad, dtype=bool)
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
    cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    return cross_val_predict(model, np.asarray(features, dtype=np.float64), y, cv=cv, method="predict_proba")[:, 1]


def precision_recall(flagged: Sequence[bool], bad: Sequence[bool]) -> dict[str, Any]:
    """Precision (flagged answers that are bad; ``None`` when nothing is flagged) and recall (bad answers
    flagged; ``None`` when nothing is bad), with the counts."""
    f, y = np.asarray(flagged, dtype=bool), np.asarray(bad, dtype=bool)
    if f.size != y.size:
        raise ValueError(f"{f.size} flags but {y.size} labels")
    tp = int((f & y).sum())
    return {"flagged": int(f.sum()), "bad": int(y.sum()), "true_positives": tp,
            "precision": tp / int(f.sum()) if f.any() else None, "recall": tp / int(y.sum()) if y.any() else None}


def char_noise(sentences: Sequence[str], rate: float, seed: int) -> list[str]:
    """Each character, with probability ``rate``, dropped, swapped with the next one or substituted by one of
    ``NOISE_LETTERS`` (one of the three at equal odds); seeded: the same call gives the same text."""
    if not 0 <= rate <= 1:
        raise ValueError(f"rate must be in [0, 1], got {rate}")
    rng = np.random.default_rng(seed)
    out = []
    for s in sentences:
        chars, res, i = list(s), [], 0
        while i < len(chars):
            c = chars[i]
            if rng.random() >= rate:
                res.append(c)
            else:
                op = int(rng.integers(3))
                if op == 1 and i + 1 < len(chars):  # swap with the next character
                    res += [chars[i + 1], c]
                    i += 1
                elif op == 2 or op == 1:  # substitute (a swap at the end substitutes)
                    res.append(NOISE_LETTERS[int(rng.integers(len(NOISE_LETTERS)))])
                # op == 0: dropped
            i += 1
        out.append("".join(res))
    return out


def shuffle_words(sentences: Sequence[str], seed: int) -> list[str]:
    """The words of each sentence in a seeded random order (a sentence of two or more different words never
    comes back in its own order)."""
    rng = np.random.default_rng(seed)
    out = []
    for s in sentences:
        words = s.split()
        order = list(range(len(words)))
        if len(set(words)) > 1:
            while [words[i] for i in order] == words:
                order = [int(i) for i in rng.permutation(len(words))]
        out.append(" ".join(words[i] for i in order))
    return out


def sample_indices(n_total: int, n: int, seed: int) -> list[int]:
    """``n`` sorted line indices out of ``n_total`` (all of them when there are fewer), seeded."""
    if n >= n_total:
        return list(range(n_total))
    return sorted(int(i) for i in np.random.default_rng(seed).choice(n_total, size=n, replace=False))


def early_checkpoint(model_dir: str | Path, checkpoints: str | Path) -> tuple[Path | None, str]:
    """``(ckpt_*.json, note)``: the oldest checkpoint in ``checkpoints`` when its step is at most half the step of
    ``model_dir/model.json``; else ``None`` and why."""
    from aiayn.checkpoint import checkpoint_step, list_checkpoints

    final = json.loads((Path(model_dir) / "model.json").read_text(encoding="utf-8")).get("step")
    ckpts = list_checkpoints(checkpoints)
    if not ckpts:
        return None, f"no checkpoint in {checkpoints}: early-checkpoint condition skipped"
    oldest = checkpoint_step(ckpts[0])
    if final is None or oldest > 0.5 * int(final):
        return None, (f"oldest checkpoint is step {oldest}, final model step {final}: not well below the final "
                      "(more than half of it), early-checkpoint condition skipped")
    return ckpts[0], f"early checkpoint: step {oldest} of {final}"


def corrupt_model(model: Any, seed: int, factor: float = 8.0) -> str:
    """Multiply one attention value/output projection weight of ``model`` (a ``torch.nn.Module``; chosen among
    the ``CORRUPTIBLE`` ones with ``seed``) by ``factor`` in place; returns its name."""
    import torch

    params = dict(model.named_parameters())
    names = sorted(n for n in params if "attn" in n and n.endswith(CORRUPTIBLE))
    if not names:
        raise ValueError("the model has no attention value/output projection to corrupt")
    name = names[int(np.random.default_rng(seed).integers(len(names)))]
    with torch.no_grad():
        params[name].mul_(factor)
    return name
