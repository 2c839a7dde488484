"""What ``aiayn translate`` writes per input line besides the translation: scores and, with ``--signals``, the
answer's output signals (``aiayn.quality.signals``), computed as the service computes the ones it logs.

``--signals`` output line: ``[LINE<TAB>]score<TAB>`` + one field per signal in ``SIGNAL_FIELDS`` order, each
followed by a tab, + the translation (the translation stays the last field, as with ``--scores`` alone). A
float is written with 6 decimals, ``repeat_ngram`` as an integer; a field is empty when the signal was not
computed (a blank input line; a target language py3langid does not know). The target language is the
bundle's (its model card), else the ``data`` block of ``--params`` (``./params.yaml``, else the built-in
defaults).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from aiayn.quality.signals import SIGNALS

__all__ = ["SIGNAL_FIELDS", "Signed", "answers", "signal_fields", "target_lang"]

#: The ``--signals`` fields, in output order.
SIGNAL_FIELDS = SIGNALS


@dataclass(frozen=True)
class Signed:
    """One hypothesis of an input line (``aiayn.inference.translator.ScoredLine``'s text and score) with its
    output signals (``OutputSignals.as_dict``; ``None`` for a blank line)."""

    text: str
    score: float
    signals: dict[str, Any] | None


def signal_fields(answer: Any) -> str:
    """``answer``'s signals as ``SIGNAL_FIELDS`` fields, each followed by a tab (module docstring); empty fields
    for an answer without signals (a line that failed in an interactive session is a plain ``ScoredLine``)."""
    signals = getattr(answer, "signals", None) or {}

    def field(value: Any) -> str:
        if value is None:
            return ""
        return str(value) if isinstance(value, int) else f"{float(value):.6f}"

    return "".join(field(signals.get(name)) + "\t" for name in SIGNAL_FIELDS)


def target_lang(bundle: Optional[Path], params_target: Callable[[], str]) -> str:
    """The language the answers should be in: the bundle's model card ``params.data.tgt_lang``, else
    ``params_target()`` (the ``data.tgt_lang`` of the params ``aiayn translate`` decodes with)."""
    card = Path(bundle) / "model_card.json" if bundle is not None else None
    if card is not None and card.is_file():
        lang = ((json.loads(card.read_text(encoding="utf-8")).get("params") or {}).get("data") or {}).get("tgt_lang")
        if lang:
            return str(lang)
    return params_target()


def _signed(translator, options, prepared, n_best: int, chunk_tokens: Optional[int], language,
            lang: str) -> Iterator[list[list[Signed]]]:
    from aiayn.quality.signals import nbest_signals

    for first, spans, hyps in translator.decode_prepared(prepared, options, n_best=n_best, chunk_tokens=chunk_tokens):
        lines = translator.scored_lines(spans, hyps, len_penalty=options.len_penalty, first=first)
        signals = nbest_signals(spans, prepared.units[first:first + len(hyps)], hyps,
                                [[h.text for h in line] for line in lines], first=first, scored=True,
                                target_lang=lang, language=language)
        yield [[Signed(h.text, h.score, s) for h, s in zip(line, sig)] for line, sig in zip(lines, signals)]


def answers(translator, options, *, nbest: int, scores: bool, signals: Optional[tuple[Any, str]]):
    """``decode(prepared, chunk_tokens=None)``: the chunks of per-line answers ``aiayn translate`` writes. One
    answer without scores: ``translate_prepared`` (exactly the evaluate stage's outputs); with ``--nbest`` or
    ``--scores``: ``translate_prepared_nbest``'s ``ScoredLine`` lists; with ``signals`` (``(LanguageScorer,
    target language)``, ``--signals``): the same hypotheses as ``Signed`` answers."""

    def decode(prepared, chunk_tokens: Optional[int] = None):
        if signals is not None:
            return _signed(translator, options, prepared, nbest, chunk_tokens, *signals)
        if nbest == 1 and not scores:
            return translator.translate_prepared(prepared, options, chunk_tokens=chunk_tokens)
        return translator.translate_prepared_nbest(prepared, options, n_best=nbest, chunk_tokens=chunk_tokens)

    return decode
