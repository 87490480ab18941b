"""The one text rule (b2t.text) that WER, lexicons, LM corpora and the submission CSV share."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from b2t.text import is_word, normalize_text, words_of


@pytest.mark.parametrize("text, words", [
    ("Hello, World!", ["hello", "world"]),
    ("I don't know.", ["i", "don't", "know"]),
    ("  Spaces\tand\nnewlines  ", ["spaces", "and", "newlines"]),
    ("A well-known fact -- surely", ["a", "well", "known", "fact", "surely"]),
    ("well\u2010known and well\u2014known", ["well", "known", "and", "well", "known"]),
    ("U.S. \"quotes\" (parens); semi: colon?", ["us", "quotes", "parens", "semi", "colon"]),
    ("rock ' n ' roll", ["rock", "n", "roll"]),
    ("The Cat's hat, said--the CAT!", ["the", "cat's", "hat", "said", "the", "cat"]),
    ("well-known  42 things.", ["well", "known", "things"]),
    ("", []),
])
def test_words_of_normalises_like_the_competition(text, words):
    assert words_of(text) == words
    assert normalize_text(text) == " ".join(words)


@given(st.text())
def test_normalized_text_is_a_fixed_point_made_of_words(text):
    norm = normalize_text(text)
    assert normalize_text(norm) == norm
    assert words_of(norm) == words_of(text) == norm.split()
    assert all(is_word(w) for w in norm.split())


@pytest.mark.parametrize("token, ok", [("don't", True), ("cat", True), ("'", False), ("Cat", False),
                                       ("well-known", False), ("", False)])
def test_is_word(token, ok):
    assert is_word(token) is ok
