"""Bucket ladder: which few time lengths T every batch is padded to, and how many rows.

Pure functions of the trial lengths and the config, so the writer, the reader and the
tests agree by calling the same code (and the tests can assert exact boundaries).

Patching rule: the model cuts windows of `size` bins every `stride` bins, so a length T
yields `(T - size) // stride + 1` patches; bucket lengths satisfy
`(T - size) % stride == 0` so no bin of a bucket is wasted by the patching.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from b2t.contract import BucketShape
from b2t.errors import DatasetError, UsageError


def patch_count(n_bins: int, size: int, stride: int) -> int:
    """Patches the model makes from `n_bins` valid bins (0 when shorter than one patch)."""
    return 0 if n_bins < size else (n_bins - size) // stride + 1


def align_length(n_bins: int, size: int, stride: int) -> int:
    """Smallest T >= max(n_bins, size) with (T - size) % stride == 0."""
    n = max(n_bins, size)
    return size + -(-(n - size) // stride) * stride


def ctc_min_patches(labels: Sequence[int]) -> int:
    """Fewest output frames CTC needs for `labels`: one per label plus a blank between repeats."""
    repeats = sum(1 for a, b in zip(labels, labels[1:]) if a == b)
    return len(labels) + repeats


def choose_bucket_lengths(lengths: Sequence[int], k: int, size: int, stride: int) -> tuple[int, ...]:
    """The <= k patch-aligned bucket lengths that minimise total padding of `lengths`.

    Each length n is served by the smallest bucket T >= n; padding is the sum of (T - n).
    Every bucket is the aligned length of some trial and the largest bucket is the aligned
    maximum, so every trial fits. Solved exactly by dynamic programming over the sorted
    distinct aligned lengths (an optimal 1-D partition into contiguous groups, each group
    padded to its largest member); ties go to the partition found first (shorter buckets).
    Returns strictly increasing lengths; fewer than k when there are fewer distinct ones.
    """
    if k < 1:
        raise UsageError(f"need at least one bucket, got k={k}")
    if len(lengths) == 0:
        raise UsageError("cannot choose buckets for an empty set of lengths")
    aligned = np.array([align_length(int(n), size, stride) for n in lengths], dtype=np.int64)
    values, counts = np.unique(aligned, return_counts=True)
    m = len(values)
    k = min(k, m)
    cum_n = np.concatenate([[0], np.cumsum(counts)])  # trials among values[:j]
    cum_s = np.concatenate([[0], np.cumsum(counts * values)])  # their total length

    # cost[i, j]: padding when values[i..j] share bucket values[j]  (i <= j)
    i_idx = np.arange(m)[:, None]
    j_idx = np.arange(m)[None, :]
    cost = values[None, :] * (cum_n[j_idx + 1] - cum_n[i_idx]) - (cum_s[j_idx + 1] - cum_s[i_idx])
    cost = np.where(i_idx <= j_idx, cost, np.iinfo(np.int64).max // 4)

    # best[t, j]: least padding covering values[:j+1] with t+1 buckets, the last ending at j
    best = np.empty((k, m), dtype=np.int64)
    choice = np.zeros((k, m), dtype=np.int64)
    best[0] = cost[0]
    for t in range(1, k):
        # previous group ends at i-1, this group spans values[i..j], for i in 1..j
        prev = np.concatenate([[np.iinfo(np.int64).max // 4], best[t - 1][:-1]])  # best[t-1, i-1]
        total = prev[:, None] + cost  # [i, j]
        choice[t] = np.argmin(total, axis=0)
        best[t] = total[choice[t], np.arange(m)]
    t = int(np.argmin(best[:, m - 1]))  # fewest buckets reaching the least padding
    ends, j = [], m - 1
    while True:
        ends.append(int(values[j]))
        if t == 0:
            break
        j = int(choice[t, j]) - 1
        t -= 1
    return tuple(sorted(ends))


def bucket_index(n_bins: int, bucket_lengths: Sequence[int]) -> int:
    """Index of the smallest bucket whose length holds `n_bins`; ValueError if none does."""
    for i, T in enumerate(bucket_lengths):
        if n_bins <= T:
            return i
    raise DatasetError(f"a trial of {n_bins} bins is longer than the largest bucket {bucket_lengths[-1]}")


def batch_rows(T: int, batch_size: int, token_budget: int | None, row_multiple: int) -> int:
    """Rows per batch of a bucket of length T.

    `batch_size` rows, or fewer when `token_budget` caps B x T (long buckets then take fewer
    rows so activation memory stays bounded); always a multiple of `row_multiple` (the
    number of devices a batch is split over).
    """
    rows = batch_size if token_budget is None else min(batch_size, token_budget // T)
    rows -= rows % row_multiple
    if rows < row_multiple:
        raise UsageError(
            f"token_budget={token_budget} holds {token_budget // T if token_budget else 0} rows "
            f"of a T={T} bucket, fewer than row_multiple={row_multiple}: raise the budget"
        )
    return rows


def label_width(max_label_len: int, multiple: int) -> int:
    """Label slots L of a bucket: its longest phoneme sequence rounded up to `multiple` (>= 1 slot)."""
    return max(multiple, -(-max_label_len // multiple) * multiple)


def padding_fraction(lengths: Sequence[int], bucket_lengths: Sequence[int]) -> float:
    """Share of the time bins of all padded rows that are padding (0.0 = none)."""
    total = sum(bucket_lengths[bucket_index(n, bucket_lengths)] for n in lengths)
    return 1.0 - sum(lengths) / total if total else 0.0


def bucket_table(
    lengths: Sequence[int],
    label_lens: Sequence[int],
    *,
    n_buckets: int,
    patch_size: int,
    patch_stride: int,
    batch_size: int,
    token_budget: int | None,
    row_multiple: int,
    label_multiple: int,
) -> list[BucketShape]:
    """The bucket shapes for trials of `lengths` bins carrying `label_lens` phonemes."""
    Ts = choose_bucket_lengths(lengths, n_buckets, patch_size, patch_stride)
    longest = [0] * len(Ts)
    for n, n_labels in zip(lengths, label_lens):
        b = bucket_index(n, Ts)
        longest[b] = max(longest[b], n_labels)
    return [
        BucketShape(
            T=T,
            B=batch_rows(T, batch_size, token_budget, row_multiple),
            L=label_width(longest[i], label_multiple),
        )
        for i, T in enumerate(Ts)
    ]
