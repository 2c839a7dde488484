"""sacreBLEU scoring: values against a hand-computed BLEU, signatures, refusals."""

import math
from collections import Counter

import pytest

from aiayn.data.readers import read_lines
from aiayn.evaluation.scoring import ScoringError, score


def _reference_bleu(hyps: list[str], refs: list[str]) -> float:
    """Papineni et al. 2002, eq. in Section 2.3: corpus BLEU-4, uniform weights, one reference.

    Only valid for whitespace-tokenized text without punctuation (13a leaves it
    unchanged) and non-zero n-gram matches (no smoothing then applies).
    """
    matches, totals = [0] * 4, [0] * 4
    hyp_len = ref_len = 0
    for h, r in zip(hyps, refs):
        h_tok, r_tok = h.split(), r.split()
        hyp_len, ref_len = hyp_len + len(h_tok), ref_len + len(r_tok)
        for n in range(1, 5):
            h_ngrams = Counter(tuple(h_tok[i:i + n]) for i in range(len(h_tok) - n + 1))
            r_ngrams = Counter(tuple(r_tok[i:i + n]) for i in range(len(r_tok) - n + 1))
            matches[n - 1] += sum(min(c, r_ngrams[g]) for g, c in h_ngrams.items())
            totals[n - 1] += max(len(h_tok) - n + 1, 0)
    log_p = sum(math.log(m / t) for m, t in zip(matches, totals)) / 4
    bp = 1.0 if hyp_len > ref_len else math.exp(1 - ref_len / hyp_len)
    return 100 * bp * math.exp(log_p)


def test_bleu_matches_hand_computation():
    refs = ["a dog runs across the green grass", "two men are playing chess in a park today"]
    hyps = ["a dog runs over the green grass", "two men are playing chess in the park"]
    got = score(hyps, refs)
    assert got["bleu"] == pytest.approx(_reference_bleu(hyps, refs), abs=1e-9)
    assert 0 < got["bleu"] < 100 and 0 < got["chrf"] < 100
    assert got["n_sentences"] == 2


def test_perfect_hypotheses_score_100_on_real_text(multi30k_mirror):
    refs = read_lines(multi30k_mirror / "val.de.gz")[:200]
    got = score(list(refs), refs)
    assert got["bleu"] == pytest.approx(100.0)
    assert got["chrf"] == pytest.approx(100.0)
    assert got["bleu_lc_tok"] == pytest.approx(100.0)
    assert got["n_sentences"] == 200


def test_signatures():
    got = score(["a cat"], ["a cat"])
    for key in ("bleu_signature", "chrf_signature", "bleu_lc_tok_signature"):
        assert "nrefs:1" in got[key] and "version:2.6.0" in got[key]
    assert "case:mixed" in got["bleu_signature"] and "tok:13a" in got["bleu_signature"]
    assert "case:mixed" in got["chrf_signature"] and "nc:6" in got["chrf_signature"]
    assert "case:lc" in got["bleu_lc_tok_signature"] and "tok:13a" in got["bleu_lc_tok_signature"]


def test_lowercased_bleu_ignores_case(multi30k_mirror):
    refs = read_lines(multi30k_mirror / "val.en.gz")[:100]
    hyps = [r.upper() if i % 2 else r for i, r in enumerate(refs)]
    got = score(hyps, refs)
    assert got["bleu"] < 90
    assert got["bleu_lc_tok"] >= got["bleu"]
    assert got["bleu_lc_tok"] == pytest.approx(100.0)


@pytest.mark.parametrize("bad, marker", [("ein \u2581Hund", "\u2581"), ("ein Hu@@ nd", "@@"), ("ein Hund@@", "@@")])
def test_refuses_subword_markers_naming_line(bad, marker):
    hyps = ["ein Hund", "eine Katze", bad, "noch \u2581 einer"]
    refs = ["ein Hund", "eine Katze", "ein Hund", "noch einer"]
    with pytest.raises(ScoringError, match=f"hypothesis line 3 contains subword marker '{marker}'"):
        score(hyps, refs)


def test_refuses_length_mismatch_and_empty():
    with pytest.raises(ScoringError, match="2 hypotheses but 1 references"):
        score(["a", "b"], ["a"])
    with pytest.raises(ScoringError, match="no hypotheses"):
        score([], [])


# --------------------------------------------------------------------------- the target language's tokenizer


def test_bleu_tokenizer_follows_the_target_language():
    from aiayn.evaluation.scoring import bleu_tokenizer

    assert bleu_tokenizer("de") == bleu_tokenizer("fr") == bleu_tokenizer("cs") == "13a"
    assert bleu_tokenizer("zh") == "zh"
    assert bleu_tokenizer("de", "intl") == "intl"
    with pytest.raises(ScoringError, match="unknown sacreBLEU tokenizer 'bogus'"):
        bleu_tokenizer("de", "bogus")


def test_chinese_bleu_is_scored_per_character_and_signed():
    refs, hyps = ["我们今天去公园散步"], ["我们今天去公园跑步"]
    zh, default = score(hyps, refs, tokenize="zh"), score(hyps, refs)
    assert "tok:zh" in zh["bleu_signature"] and "tok:zh" in zh["bleu_lc_tok_signature"]
    assert default["bleu"] == 0.0 < zh["bleu"]  # 13a sees one "word" per sentence: no 4-gram can match


def test_a_tokenizer_this_machine_lacks_is_refused_naming_the_need(monkeypatch):
    """MeCab (sacrebleu[ja]) is not in requirements.lock; whether or not a host has it, the test sees the
    host without it: sacreBLEU's tokenizer module keeps ``MeCab = None`` when its import failed."""
    from sacrebleu.tokenizers import tokenizer_ja_mecab

    from aiayn.evaluation.scoring import bleu_tokenizer

    monkeypatch.setattr(tokenizer_ja_mecab, "MeCab", None)

    with pytest.raises(ScoringError, match=r"target language 'ja' needs sacreBLEU's ja-mecab tokenizer.*sacrebleu\[ja\]") as e:
        bleu_tokenizer("ja")
    cause = " ".join(str(e.value.__cause__).split())
    assert cause in str(e.value) or "[...]" in str(e.value)  # sacreBLEU's own reason whole, or shortened at a word
