"""Input text for translation: only ``\\n`` ends a line, in-line breakers become spaces, and an over-long
line splits at sentences, then clauses, words and characters (``aiayn.inference.text``)."""

from __future__ import annotations

from aiayn.inference.text import clean_line, read_input, split_lines, split_long
from support.text_cases import BREAKERS


def test_only_newline_ends_a_line():
    data = "a\u2028b\u2029c\u0085d\ne\x0cf\x0bg\rh\r\nlast".encode()
    assert read_input(data) == ["a\u2028b\u2029c\u0085d", "e\x0cf\x0bg\rh", "last"]
    assert split_lines("x\n\n") == ["x", ""] and split_lines("") == [] and split_lines("\n") == [""]
    for ch in BREAKERS:
        assert clean_line(f"a{ch}b") == "a b"
    assert clean_line("a\udcffb") == "a\ufffdb"


def test_split_long_falls_back_to_clauses_words_and_characters():
    count = len  # one unit per character
    clauses = "one two, three four; five six: seven eight - nine ten"
    assert split_long(clauses, count, 22) == ["one two, three four;", "five six: seven eight", "- nine ten"]
    words = "aaaa bbbb cccc dddd eeee"
    assert split_long(words, count, 9) == ["aaaa bbbb", "cccc dddd", "eeee"]
    assert split_long("x" * 25, count, 10) == ["x" * 10, "x" * 10, "x" * 5]
    assert split_long("  short  text ", count, 50) == ["short text"]
    for limit in (1, 3, 7):
        pieces = split_long("A b. Cc dd, eee ffff ggggggggg.", count, limit)
        assert all(len(p) <= limit for p in pieces)
