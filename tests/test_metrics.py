"""Greedy CTC decoding, edit distance, error-rate aggregation and word normalisation."""

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from b2t.metrics import ErrorRate, edit_distance, greedy_decode
from b2t.text import words_of


def _levenshtein(a: list, b: list) -> int:
    """Textbook dynamic programme, one row at a time."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


@pytest.mark.parametrize("a, b, d", [
    ([1, 2, 3], [1, 2, 3], 0),
    ([], [4, 5], 2),
    ([4, 5], [], 2),
    ([1, 2, 3], [1, 3], 1),
    ([1, 2, 3, 4], [2, 3, 4, 5], 2),
    ([7, 7, 7], [8, 8, 8], 3),
    (list("kitten"), list("sitting"), 3),
    (["the", "cat", "sat"], ["the", "hat", "sat", "down"], 2),
])
def test_edit_distance_hand_examples(a, b, d):
    assert edit_distance(a, b) == d
    assert edit_distance(b, a) == d


@given(a=st.lists(st.integers(0, 5), max_size=12), b=st.lists(st.integers(0, 5), max_size=12))
def test_edit_distance_matches_the_textbook_programme(a, b):
    assert edit_distance(a, b) == _levenshtein(a, b)


def test_greedy_decode_merges_repeats_then_drops_blanks():
    ids = torch.tensor([[1, 1, 0, 1, 2, 2, 0, 0, 3],
                        [0, 0, 0, 0, 0, 0, 0, 0, 0],
                        [5, 5, 5, 6, 6, 0, 7, 7, 7],
                        [4, 4, 4, 4, 4, 4, 4, 4, 4]], dtype=torch.int32, device="cpu")
    lengths = torch.tensor([9, 9, 5, 0], dtype=torch.int32, device="cpu")
    assert greedy_decode(ids, lengths) == [[1, 1, 2, 3], [], [5, 6], []]
    assert greedy_decode(ids.numpy(), [9, 9, 5, 0]) == [[1, 1, 2, 3], [], [5, 6], []]


@given(rows=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=15), min_size=1, max_size=4))
def test_greedy_decode_agrees_with_a_frame_by_frame_rule(rows):
    P = max(map(len, rows))
    ids = np.zeros((len(rows), P), dtype=np.int64)
    for b, r in enumerate(rows):
        ids[b, :len(r)] = r
        ids[b, len(r):] = 3  # frames past the length must not be read
    expected = []
    for r in rows:
        out, last = [], None
        for f in r:
            if f != last and f != 0:
                out.append(f)
            last = f
        expected.append(out)
    assert greedy_decode(ids, [len(r) for r in rows]) == expected


def test_greedy_decode_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"\(B, P\)"):
        greedy_decode(np.zeros((2, 3), dtype=np.int64), [1, 2, 3])


def test_error_rate_is_total_edits_over_total_reference_length():
    er = ErrorRate()
    assert er.add("day1", [1, 2, 3], [1, 2, 3, 4]) == 1  # 1 edit / 4
    assert er.add("day1", [], [5, 6]) == 2  # 2 edits / 2
    assert er.add("day2", [9], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]) == 9  # 9 edits / 10
    assert er.rate("day1") == pytest.approx(3 / 6)
    assert er.rate("day2") == pytest.approx(9 / 10)
    assert er.rate() == pytest.approx(12 / 16)  # not the mean of the per-trial or per-day rates
    d = er.to_dict()
    assert d["all"] == {"rate": pytest.approx(0.75), "edits": 12, "ref_len": 16, "count": 3}
    assert d["groups"]["day1"] == {"rate": pytest.approx(0.5), "edits": 3, "ref_len": 6, "count": 2}
    json.dumps(d, allow_nan=False)
    table = er.table("PER").splitlines()
    assert table[0].split() == ["group", "PER", "edits", "ref_len", "count"]
    assert [line.split()[0] for line in table[1:]] == ["day1", "day2", "all"]
    assert table[-1].split() == ["all", "0.7500", "12", "16", "3"]


def test_error_rate_without_references():
    er = ErrorRate()
    assert math.isnan(er.rate())
    er.add("test", ["a"], [])
    assert math.isnan(er.rate("test"))
    assert er.to_dict()["all"]["rate"] is None
    assert "n/a" in er.table()
    with pytest.raises(KeyError, match="no results for group 'other'"):
        er.rate("other")


def test_word_error_rate_reuses_the_accumulator():
    er = ErrorRate()
    er.add("s", words_of("The cat sat."), words_of("the cat sat down"))
    assert er.rate() == pytest.approx(1 / 4)
