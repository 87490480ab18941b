"""Per-row checks of a decoded batch against the contract, cheap enough to run on every batch read.

`check_batch` (b2t.contract) checks shapes and dtypes; a shard can still hold values that
fit those and break training: a label id outside the phonemes (an out-of-range CTC
target), a length beyond the bucket (a CUDA/XLA index error or a torch traceback hours
into a run), labels CTC cannot align in the row's frames. The sha256 in the manifest
catches a flipped byte only with `--verify-data`; these checks catch every such value in
the reader, whatever the digest says. They read only the (B,) and (B, L) integer fields
(through numpy views, no copies), never the (B, T, F) features: about 25 us per batch of
32 rows (docs/robustness.md); `b2t-preprocess verify` adds the feature checks.

Shape legend: B batch rows, T time bins (the bucket length), L label slots.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np
import torch

from b2t.contract import BucketShape
from b2t.phonemes import SILENCE_ID


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


class _Bounds:
    """One bucket's contract as lookup tables, so that the check of a good batch is about a
    dozen numpy calls over whole (B,) and (B, L) arrays. Built once per (bucket, sessions, patching)."""

    def __init__(self, shape: BucketShape, n_sessions: int, patching: tuple[int, int] | None):
        T, L = shape.T, shape.L
        # (3, 256) by the valid flag's byte: the first n_time_steps - valid, phone_seq_lens and day
        # index past the range of a padding (0) and a valid (1) row; compared unsigned, so a
        # negative value is out of range too. A flag byte 2..255 (not a bool) has an empty range.
        self.beyond = np.zeros((3, 256), dtype=np.uint32)
        self.beyond[:, :2] = [[1, T], [1, L + 1], [n_sessions] * 2]
        k = np.arange(L + 1)
        self.label_slots = np.arange(L)[None, :] < k[:, None]  # (L+1, L): slots a row of k labels fills
        # equal neighbours in a good row of k labels = its repeats + its max(0, L-1-k) zero pairs
        self.labels_less_zero_pairs = (k - np.maximum(0, L - 1 - k)).astype(np.int64)  # (L+1,)
        self.frames = None  # (T+1,): CTC frames (patches) a row of n bins makes
        if patching is not None:
            size, stride = patching
            n = np.arange(T + 1)
            self.frames = np.where(n >= size, (n - size) // stride + 1, 0)

    def ok(self, valid: np.ndarray, n: np.ndarray, n_labels: np.ndarray, ids: np.ndarray,
           days: np.ndarray) -> bool:
        """True when every row is fine; a False goes on to `row_problems`' detailed look."""
        scalars = np.concatenate((n - valid, n_labels, days)).reshape(3, -1).view(np.uint32)  # (3, B)
        if (scalars >= self.beyond[:, valid.view(np.uint8)]).any():
            return False
        if ids.view(np.uint32).max(initial=0) > SILENCE_ID or (ids.astype(bool) != self.label_slots[n_labels]).any():
            return False  # ids are 1..40 up to each row's length, 0 after it
        if self.frames is None:
            return True
        equal = (ids[:, 1:] == ids[:, :-1]).sum(axis=1, dtype=np.int64)  # (B,)
        return not (equal + self.labels_less_zero_pairs[n_labels] > self.frames[n]).any()  # labels + repeats


@functools.cache
def _bounds(shape: BucketShape, n_sessions: int, patching: tuple[int, int] | None) -> _Bounds:
    return _Bounds(shape, n_sessions, patching)


def row_problems(tensors: Mapping[str, torch.Tensor], shape: BucketShape, n_sessions: int,
                 patching: tuple[int, int] | None) -> list[str]:
    """What is wrong with a batch's rows (lengths, labels, day indices, CTC feasibility), naming
    the first bad row of each kind; [] for a batch the step can train on. The batch has already
    passed `check_batch`. patching: (patch_size, patch_stride) of the model the buckets fit
    (None: no CTC check)."""
    valid = tensors["valid"].numpy()  # (B,) bool
    n = tensors["n_time_steps"].numpy()  # (B,)
    n_labels = tensors["phone_seq_lens"].numpy()  # (B,)
    ids = tensors["seq_class_ids"].numpy()  # (B, L)
    days = tensors["day_indices"].numpy()  # (B,)
    if _bounds(shape, n_sessions, patching).ok(valid, n, n_labels, ids, days):
        return []
    return _described(valid, n, n_labels, ids, days, shape, n_sessions, patching)


def _described(valid: np.ndarray, n: np.ndarray, n_labels: np.ndarray, ids: np.ndarray, days: np.ndarray,
               shape: BucketShape, n_sessions: int, patching: tuple[int, int] | None) -> list[str]:
    """`row_problems`' detailed look, for a batch the fast check refused."""
    problems = []
    if (bad := valid.view(np.uint8) > 1).any():
        r = _first(bad)
        problems.append(f"row {r}: valid flag byte {valid.view(np.uint8)[r]} is not a bool (0 or 1)")
    if (bad := np.where(valid, (n < 1) | (n > shape.T), n != 0)).any():
        r = _first(bad)
        problems.append(f"row {r}: n_time_steps {n[r]} outside {'1..' if valid[r] else '0..'}"
                        f"{shape.T if valid[r] else 0} (T={shape.T}, {'valid' if valid[r] else 'padding'} row)")
    if (bad := np.where(valid, (n_labels < 0) | (n_labels > shape.L), n_labels != 0)).any():
        r = _first(bad)
        problems.append(f"row {r}: phone_seq_lens {n_labels[r]} outside 0..{shape.L if valid[r] else 0} "
                        f"(L={shape.L}, {'valid' if valid[r] else 'padding'} row)")
    if (bad := (days < 0) | (days >= n_sessions)).any():
        r = _first(bad)
        problems.append(f"row {r}: day index {days[r]} outside 0..{n_sessions - 1} (the manifest's sessions)")
    in_label = np.arange(shape.L)[None, :] < n_labels[:, None]  # (B, L)
    bad_ids = np.where(in_label, (ids < 1) | (ids > SILENCE_ID), ids != 0)  # (B, L)
    if bad_ids.any():
        r, i = (int(x) for x in np.argwhere(bad_ids)[0])
        want = f"a phoneme id 1..{SILENCE_ID}" if in_label[r, i] else "0 beyond the row's phone_seq_lens"
        problems.append(f"row {r}: seq_class_ids[{i}] is {ids[r, i]}, expected {want}")
    if patching is not None and not problems:  # lengths and ids are sane: can CTC align each row's labels?
        size, stride = patching
        frames = np.where(n >= size, (n - size) // stride + 1, 0)  # (B,) patches of real data
        repeats = ((ids[:, 1:] == ids[:, :-1]) & (ids[:, 1:] != 0)).sum(axis=1)  # (B,)
        if (bad := n_labels + repeats > frames).any():
            r = _first(bad)
            problems.append(f"row {r}: {n_labels[r]} labels ({repeats[r]} repeats) need {n_labels[r] + repeats[r]} "
                            f"CTC frames, its {n[r]} bins make {frames[r]} (patches {size}/{stride})")
    return problems
