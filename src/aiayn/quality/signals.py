"""Per-sentence signals of what the model answered: cheap detectors of a bad translation.

BLEU on a test set says nothing about one answer. These signals look at a single (source, output)
pair with what the service already has in hand: the pieces, the hypothesis' log-probability and the
text. Each is a number whose in-domain distribution is learned once (the monitor's reference) and
whose tails are flagged. ``output_signals`` computes all of them for one answer; ``OutputSignals``
holds them, and ``as_dict`` is what the request log stores.

``seq_logprob``          ``log P(Y | X) / (|Y| + 1)``: the model's mean log-probability per output
                         token, EOS included (natural log, <= 0). Guerreiro, Voita & Martins 2023,
                         "Looking for a Needle in a Haystack" (EACL): the strongest of the simple
                         hallucination detectors ("Seq-Logprob"). ``None`` when the answer was not
                         scored (``aiayn serve --no-scores``).
``length_ratio``         ``|Y| / |X|`` in pieces, EOS excluded: truncated (low) and run-on (high)
                         answers; its in-domain band comes from the training data's own pairs.
``repeat_ngram``         the largest ``n`` such that some n-gram of output pieces occurs at least
                         twice (occurrences may overlap): a repetition loop scores its period times
                         the loop count; fluent text rarely repeats more than 2-3 pieces.
``top_piece_share``      the most frequent output piece's count / ``|Y|`` (Raunak et al. 2021, "The
                         Curious Case of Hallucinations in NMT": degenerate outputs repeat one token).
``copy_rate``            the share of output piece bigrams that also occur in the source: an answer
                         that copies its source (an untranslated pass-through) is near 1, a
                         translation near the share of names and numbers (a joint vocabulary).
``target_language_prob`` py3langid's normalised probability that the output is in the target
                         language (Lui & Baldwin 2012): an answer in the wrong language.
``source_unknown_share`` the source's unknown pieces / ``|X|``: input the model cannot read.

An empty output of a non-empty source has ``length_ratio`` 0 and ``target_language_prob`` 0; a
non-finite log-probability is kept as NaN. Neither raises: a broken answer must be recorded, and
flagged, never crash the caller.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from aiayn.config.schema import EOS_ID, UNK_ID

__all__ = [
    "SIGNALS", "OutputSignals", "LanguageScorer", "output_signals", "seq_logprob", "length_ratio",
    "repeat_ngram", "top_piece_share", "copy_rate", "source_unknown_share", "line_signals", "nbest_signals",
]  # fmt: skip

#: The signals, in the order the request log, the reference and the monitor list them.
SIGNALS = ("seq_logprob", "length_ratio", "repeat_ngram", "top_piece_share", "copy_rate",
           "target_language_prob", "source_unknown_share")


@dataclass(frozen=True)
class OutputSignals:
    """The signals of one answer (module docstring); ``None`` where a signal could not be computed."""

    seq_logprob: float | None
    length_ratio: float
    repeat_ngram: int
    top_piece_share: float
    copy_rate: float
    target_language_prob: float | None
    source_unknown_share: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: NaN and infinities become ``None`` (JSON has no NaN)."""
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


def _pieces(ids: Sequence[int]) -> list[int]:
    return [int(i) for i in ids if int(i) != EOS_ID]


def seq_logprob(logprob: float | None, n_tokens: int) -> float | None:
    """``logprob / (n_tokens + 1)``: the mean log-probability per output token, EOS counted."""
    if logprob is None:
        return None
    return float(logprob) / (n_tokens + 1)


def length_ratio(source: Sequence[int], output: Sequence[int]) -> float:
    """``|output| / |source|`` in pieces (EOS excluded); 0 for an empty source."""
    src, out = _pieces(source), _pieces(output)
    return len(out) / len(src) if src else 0.0


def repeat_ngram(output: Sequence[int]) -> int:
    """The largest ``n`` with an n-gram of ``output`` occurring at least twice (0: no piece repeats).

    Binary search on ``n``: if an n-gram repeats, so does each of its (n-1)-grams."""
    out = _pieces(output)

    def repeats(n: int) -> bool:
        seen: set[tuple[int, ...]] = set()
        for i in range(len(out) - n + 1):
            gram = tuple(out[i:i + n])
            if gram in seen:
                return True
            seen.add(gram)
        return False

    lo, hi = 0, max(0, len(out) - 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if repeats(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def top_piece_share(output: Sequence[int]) -> float:
    """The most frequent piece's count / ``|output|``; 0 for an empty output."""
    out = _pieces(output)
    return Counter(out).most_common(1)[0][1] / len(out) if out else 0.0


def copy_rate(source: Sequence[int], output: Sequence[int]) -> float:
    """The share of the output's piece bigrams that occur in the source; for a one-piece output, whether
    that piece is in the source. 0 for an empty output."""
    src, out = _pieces(source), _pieces(output)
    if len(out) < 2:
        return float(bool(out) and out[0] in src)
    src_bigrams = set(zip(src, src[1:]))
    bigrams = list(zip(out, out[1:]))
    return sum(b in src_bigrams for b in bigrams) / len(bigrams)


def source_unknown_share(source: Sequence[int]) -> float:
    """The source's unknown pieces / ``|source|`` (EOS excluded); 0 for an empty source."""
    src = _pieces(source)
    return sum(i == UNK_ID for i in src) / len(src) if src else 0.0


class LanguageScorer:
    """py3langid's model with normalised probabilities, loaded once (~1 s; ~0.3 ms a sentence):
    ``prob(text, lang)`` is the probability that ``text`` is in ``lang`` among its 97 languages."""

    def __init__(self) -> None:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier

        self._model = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        self.labels = frozenset(self._model.labels)

    def prob(self, text: str, lang: str) -> float | None:
        """``P(lang | text)``; 0 for blank text; ``None`` when py3langid does not know ``lang``."""
        if lang not in self.labels:
            return None
        if not text.strip():
            return 0.0
        return float(dict(self._model.rank(text))[lang])


def output_signals(source: Sequence[int], output: Sequence[int], *, logprob: float | None, text: str,
                   target_lang: str, language: LanguageScorer | None) -> OutputSignals:
    """Every signal of one answer: ``source`` / ``output`` piece ids (EOS, if present, is ignored),
    ``logprob`` the hypothesis' summed log-probability (``None``: not scored), ``text`` the answer
    as the user got it, ``language`` a shared scorer (``None``: the language signal is not computed)."""
    n_out = len(_pieces(output))
    return OutputSignals(
        seq_logprob=seq_logprob(logprob, n_out),
        length_ratio=length_ratio(source, output),
        repeat_ngram=repeat_ngram(output),
        top_piece_share=top_piece_share(output),
        copy_rate=copy_rate(source, output),
        target_language_prob=language.prob(text, target_lang) if language is not None else None,
        source_unknown_share=source_unknown_share(source),
    )


def line_signals(spans: Sequence[tuple[int, int]], units: Sequence[Sequence[int]], hyps: Sequence[Sequence[Any]],
                 texts: Sequence[str], *, scored: bool, target_lang: str | None,
                 language: LanguageScorer | None) -> list[dict[str, Any] | None]:
    """Per input line, the ``as_dict`` of its answer's signals, for the translation path's own shapes:
    ``spans`` / ``units`` of ``aiayn.inference.translator.PreparedInput``, ``hyps`` per unit best first
    (``Decoder.translate_hyps``; ``.tokens``, ``.logprob``), ``texts`` the answered lines. A line split
    into several units is one answer: its pieces and log-probabilities joined. ``None`` for a blank
    line (nothing was translated); ``scored=False``: the hypotheses carry no log-probability."""
    out: list[dict[str, Any] | None] = []
    for (a, b), text in zip(spans, texts):
        if a == b or not all(hyps[a:b]):
            out.append(None)
            continue
        best = [hyps[k][0] for k in range(a, b)]
        source = [int(i) for k in range(a, b) for i in units[k]]
        output = [int(i) for h in best for i in h.tokens]
        logprob = sum(float(h.logprob) for h in best) if scored else None
        lang = language if target_lang is not None else None
        out.append(output_signals(source, output, logprob=logprob, text=text, target_lang=target_lang or "",
                                  language=lang).as_dict())
    return out


def nbest_signals(spans: Sequence[tuple[int, int]], units: Sequence[Sequence[int]], hyps: Sequence[Sequence[Any]],
                  texts: Sequence[Sequence[str]], *, first: int = 0, scored: bool, target_lang: str | None,
                  language: LanguageScorer | None) -> list[list[dict[str, Any] | None]]:
    """``line_signals`` of every rank: per input line, the signals of each of its ranked answers ``texts[i][r]``
    (``Translator.scored_lines``: rank ``r`` joins the r-th hypothesis of each of the line's units). ``units[k]``
    and ``hyps[k]`` belong to unit ``first + k`` (a chunk of ``Translator.decode_prepared``); ``spans`` are the
    lines' absolute unit ranges. Rank 0 is ``line_signals``'s answer."""
    local = [(a - first, b - first) for a, b in spans]
    out: list[list[dict[str, Any] | None]] = [[] for _ in spans]
    for r in range(max((len(t) for t in texts), default=0)):
        ranked = [[unit[r]] if len(unit) > r else [] for unit in hyps]
        rows = line_signals(local, units, ranked, [t[r] if len(t) > r else "" for t in texts], scored=scored,
                            target_lang=target_lang, language=language)
        for line, row, t in zip(out, rows, texts):
            if r < len(t):
                line.append(row)
    return out
