"""Bucket boundaries (b2t.buckets): exact on hand-made inputs, optimal against brute force."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from b2t.buckets import align_length, bucket_table, choose_bucket_lengths, padding_fraction
from b2t.contract import BucketShape


def _padding(lengths, buckets) -> int:
    return sum(min(T for T in buckets if T >= n) - n for n in lengths)


@pytest.mark.parametrize(("lengths", "k", "size", "stride", "want"), [
    # aligned lengths 14, 18, 30, 102: a second bucket at 30 pads 16+12+0+2 = 30 bins,
    # at 18 it pads 78, at 14 it pads 158
    ([14, 18, 30, 100], 2, 14, 4, (30, 102)),
    ([14, 18, 30, 100], 1, 14, 4, (102,)),
    ([14, 18, 30, 100], 4, 14, 4, (14, 18, 30, 102)),
    ([14, 18, 30, 100], 9, 14, 4, (14, 18, 30, 102)),
    # no patching constraint: {3, 12} pads 3+3 = 6, the best of all pairs ({2, 12} pads 13)
    ([1, 2, 3, 10, 11, 12], 2, 1, 1, (3, 12)),
    # shorter than one patch still needs a whole patch
    ([3, 5], 1, 14, 4, (14,)),
    # 15..18 all align to 18 (one patch of 14 plus a stride of 4)
    ([15, 16, 17, 18, 19], 2, 14, 4, (18, 22)),
    # a tie (each choice pads 2) goes to the shorter bucket
    ([1, 2, 3], 2, 1, 1, (1, 3)),
])
def test_choose_bucket_lengths_exact(lengths, k, size, stride, want):
    assert choose_bucket_lengths(lengths, k, size, stride) == want


def test_bucket_table_exact():
    # budget 1000: T=14 holds 71 rows -> 16; T=50 holds 20 -> 16; T=102 holds 9 -> 8 (multiple of 4)
    table = bucket_table([14, 50, 102], [3, 9, 20], n_buckets=3, patch_size=14, patch_stride=4,
                         batch_size=16, token_budget=1000, row_multiple=4, label_multiple=8)
    assert table == [BucketShape(T=14, B=16, L=8), BucketShape(T=50, B=16, L=16), BucketShape(T=102, B=8, L=24)]
    assert padding_fraction([10, 14, 50], [14, 50]) == pytest.approx(1 - 74 / 78)


@given(st.lists(st.integers(1, 40), min_size=1, max_size=10), st.integers(1, 4),
       st.integers(1, 8).flatmap(lambda s: st.tuples(st.just(s), st.integers(1, s))))
def test_choose_bucket_lengths_matches_brute_force(lengths, k, patching):
    size, stride = patching
    got = choose_bucket_lengths(lengths, k, size, stride)
    top = align_length(max(lengths), size, stride)
    candidates = range(size, top, stride)  # every aligned length below the top one
    best = min(
        _padding(lengths, combo + (top,))
        for r in range(k) for combo in itertools.combinations(candidates, r)
    )
    assert len(got) <= k and got[-1] == top and list(got) == sorted(set(got))
    assert all((T - size) % stride == 0 for T in got)
    assert _padding(lengths, got) == best
