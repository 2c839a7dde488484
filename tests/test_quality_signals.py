"""The per-sentence output signals (aiayn.quality.signals): each formula on hand-computed cases, and
the broken answers each one exists to catch."""

from __future__ import annotations

import math

import pytest

from aiayn.config.schema import EOS_ID, UNK_ID
from aiayn.quality.signals import (
    SIGNALS,
    LanguageScorer,
    copy_rate,
    length_ratio,
    output_signals,
    repeat_ngram,
    seq_logprob,
    source_unknown_share,
    top_piece_share,
)


@pytest.fixture(scope="module")
def language() -> LanguageScorer:
    return LanguageScorer()


def test_seq_logprob_is_the_mean_per_token_with_eos():
    assert seq_logprob(-6.0, 2) == -2.0  # two pieces + EOS
    assert seq_logprob(None, 5) is None


def test_length_ratio_ignores_eos():
    assert length_ratio([10, 11, 12, 13, EOS_ID], [20, 21, EOS_ID]) == 0.5
    assert length_ratio([], [20]) == 0.0


@pytest.mark.parametrize("output, expected", [
    ([], 0),
    ([5, 6, 7, 8], 0),  # no piece twice
    ([5, 6, 5], 1),  # one piece twice
    ([5, 6, 7, 5, 6, 7], 3),  # a 3-gram twice
    ([9] + [5, 6] * 10, 18),  # a loop "5 6 5 6 ..." (21 pieces): the 18-gram at 1 repeats at 3 (overlapping)
])
def test_repeat_ngram_is_the_longest_repeated_ngram(output, expected):
    assert repeat_ngram(output) == expected


def test_top_piece_share():
    assert top_piece_share([5, 5, 5, 6]) == 0.75
    assert top_piece_share([EOS_ID]) == 0.0


def test_copy_rate_counts_output_bigrams_found_in_the_source():
    src = [10, 11, 12, 13]
    assert copy_rate(src, src) == 1.0
    assert copy_rate(src, [10, 11, 20, 21]) == pytest.approx(1 / 3)  # (10,11) of (10,11) (11,20) (20,21)
    assert copy_rate(src, [11]) == 1.0 and copy_rate(src, [99]) == 0.0 and copy_rate(src, []) == 0.0


def test_source_unknown_share():
    assert source_unknown_share([UNK_ID, 10, UNK_ID, 11, EOS_ID]) == 0.5


def test_the_language_signal_tells_german_from_english(language):
    assert language.prob("Ein Mann fährt mit dem Fahrrad die Straße entlang.", "de") > 0.9
    assert language.prob("A man rides his bike along the street.", "de") < 0.1
    assert language.prob("   ", "de") == 0.0
    assert language.prob("anything", "xx") is None


def test_a_repetition_loop_a_copy_and_an_english_answer_each_stand_out(language):
    """The three broken answers the signals exist for, against an ordinary answer of the same source."""
    src = [30, 31, 32, 33, 34, 35, EOS_ID]
    ordinary = output_signals(src, [40, 41, 42, 43, 44, 45, EOS_ID], logprob=-3.5,
                              text="Ein Hund rennt über eine Wiese.", target_lang="de", language=language)
    loop = output_signals(src, [40] + [41, 42] * 15 + [EOS_ID], logprob=-9.0,
                          text="Ein Hund Hund Hund Hund Hund", target_lang="de", language=language)
    copy = output_signals(src, src, logprob=-2.0, text="A dog runs across a meadow.", target_lang="de",
                          language=language)
    assert loop.repeat_ngram >= 10 > ordinary.repeat_ngram and loop.top_piece_share > 0.4 > ordinary.top_piece_share
    assert copy.copy_rate == 1.0 > ordinary.copy_rate
    assert copy.target_language_prob < 0.1 < 0.9 < ordinary.target_language_prob
    assert list(ordinary.as_dict()) == list(SIGNALS)


def test_a_broken_answer_is_recorded_never_raised(language):
    empty = output_signals([30, 31, EOS_ID], [EOS_ID], logprob=float("nan"), text="", target_lang="de",
                           language=language)
    assert empty.length_ratio == 0.0 and empty.target_language_prob == 0.0 and math.isnan(empty.seq_logprob)
    assert empty.as_dict()["seq_logprob"] is None  # JSON has no NaN
