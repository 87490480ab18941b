"""Per-row checks of a decoded batch against the contract, cheap enough to run on every batch read.

`check_batch` (b2t.contract) checks shapes and dtypes; a shard can still hold values that
fit those and break training: a label id outside the phonemes (an out-of-range CTC
target), a length beyond the bucket (a CUDA/XLA index error or a torch traceback hours
into a run), labels CTC cannot align in the row's frames. The sha256 in the manifest
catches a flipped byte only with `--verify-data`; these checks catch every such value in
the reader, whatever the digest says. They read only the (B,) and (B, L) integer fields
(through numpy views, no copies), never the (B, T, F) features, so they cost a few
microseconds per batch (tools/bench_data.py); `b2t-preprocess verify` adds the feature checks.

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


def _rows_ok(valid: np.ndarray, n: np.ndarray, n_labels: np.ndarray, ids: np.ndarray, days: np.ndarray,
             shape: BucketShape, n_sessions: int, patching: tuple[int, int] | None) -> bool:
    """The fast path: True when every row is fine, in about 20 numpy calls (the unsigned view
    turns "0 <= x <= hi" into one max per field). A False goes on to `row_problems`' detailed look."""
    scalars = np.stack((n, n_labels, days)).view(np.uint32)  # (3, B)
    if (scalars.max(axis=1) > _limits(shape.T, shape.L, n_sessions)).any():
        return False
    if ((n > 0) != valid).any() or ((n_labels > 0) > valid).any():  # valid rows have bins, padding rows nothing
        return False
    nonzero = ids != 0  # (B, L)
    if ids.view(np.uint32).max() > SILENCE_ID or (nonzero != (_positions(shape.L) < n_labels[:, None])).any():
        return False
    if patching is None:
        return True
    size, stride = patching  # CTC: labels + repeats <= (n - size) // stride + 1 frames, for labelled rows
    needed = n_labels + ((ids[:, 1:] == ids[:, :-1]) & nonzero[:, 1:]).sum(axis=1)  # (B,)
    return not (((needed - 1) * stride > n - size) & (n_labels > 0)).any()


@functools.cache
def _limits(T: int, L: int, n_sessions: int) -> np.ndarray:
    return np.array([T, L, n_sessions - 1], dtype=np.int64)  # the largest n_time_steps, phone_seq_lens, day index


@functools.cache
def _positions(width: int) -> np.ndarray:
    return np.arange(width, dtype=np.int32)[None, :]  # (1, L)


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
    if _rows_ok(valid, n, n_labels, ids, days, shape, n_sessions, patching):
        return []
    problems = []
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
