"""Corpus-level translation metrics with sacreBLEU (Post 2018, "A Call for Clarity in Reporting BLEU Scores").

Pure functions over detokenized text: hypotheses must be plain text as a user
would read it (sentencepiece output already decoded), references the prepared
test text. Each score comes with its sacreBLEU signature so it can be compared
and reproduced.

Errors: ``ScoringError`` (a ``ValueError``) naming the offending line.
"""

from __future__ import annotations

from sacrebleu.metrics import BLEU, CHRF

__all__ = ["ScoringError", "score", "SUBWORD_MARKERS"]

#: Markers of undecoded subword output: sentencepiece word start (U+2581) and subword-nmt BPE joiner.
SUBWORD_MARKERS = ("\u2581", "@@ ")


class ScoringError(ValueError):
    """Inputs cannot be scored (length mismatch, empty, undecoded subword output)."""


def score(hypotheses: list[str], references: list[str]) -> dict:
    """Score detokenized ``hypotheses`` against one reference each.

    Returns::

        bleu                   sacreBLEU default BLEU (cased, 13a tokenization, exp smoothing), 0-100
        bleu_signature         e.g. "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
        chrf                   sacreBLEU default chrF2 (character 6-grams, beta 2), 0-100
        chrf_signature         e.g. "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0"
        bleu_lc_tok            BLEU lowercased and 13a-tokenized: the convention most Multi30k
                               papers report ("lowercased, tokenized BLEU"; the text is the same
                               detokenized input, sacreBLEU tokenizes it). NOT comparable with
                               ``bleu``; use it only against such published numbers.
        bleu_lc_tok_signature  e.g. "nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:2.6.0"
        n_sentences            number of scored sentence pairs

    Raises ``ScoringError``: different numbers of hypotheses and references, no
    sentences, or a hypothesis/reference that still contains a subword marker
    (``'▁'`` U+2581 or ``'@@ '``), naming the first offending 1-based line.
    """
    if len(hypotheses) != len(references):
        raise ScoringError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        raise ScoringError("nothing to score: no hypotheses")
    for name, lines in (("hypothesis", hypotheses), ("reference", references)):
        for lineno, line in enumerate(lines, 1):
            if not isinstance(line, str):
                raise ScoringError(f"{name} line {lineno} is {type(line).__name__}, not str")
            marker = next((m for m in SUBWORD_MARKERS if m in line or line.endswith(m.rstrip())), None)
            if marker is not None:
                raise ScoringError(
                    f"{name} line {lineno} contains subword marker {marker.strip()!r}: {line[:80]!r}; "
                    "decode (detokenize) the output before scoring"
                )

    refs = [list(references)]
    bleu, chrf, bleu_lc = BLEU(), CHRF(), BLEU(lowercase=True, tokenize="13a")
    return {
        "bleu": bleu.corpus_score(hypotheses, refs).score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf": chrf.corpus_score(hypotheses, refs).score,
        "chrf_signature": str(chrf.get_signature()),
        "bleu_lc_tok": bleu_lc.corpus_score(hypotheses, refs).score,
        "bleu_lc_tok_signature": str(bleu_lc.get_signature()),
        "n_sentences": len(hypotheses),
    }
