"""Per-row checks of a decoded batch against the contract, cheap enough to run on every batch read.

`check_batch` (b2t.contract) checks shapes and dtypes; a shard can still hold values that
fit those and break training: a label id outside the phonemes (an out-of-range CTC
target), a length beyond the bucket (a CUDA/XLA index error or a torch traceback hours
into a run), labels CTC cannot align in the row's frames. The sha256 in the manifest
catches a flipped byte only with `--verify-data`; these checks catch every such value in
the reader, whatever the digest says. They read only the (B,) and (B, L) integer fields
(the reader's numpy views of the shard, no copies), never the (B, T, F) features, in one
numba-compiled pass: about 2 us per batch of 32 rows (docs/robustness.md);
`b2t-preprocess verify` adds the feature checks.

Shape legend: B batch rows, T time bins (the bucket length), L label slots.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import numpy as np
import torch

from b2t.contract import BucketShape
from b2t.phonemes import SILENCE_ID


def _array(x: np.ndarray | torch.Tensor) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else x


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _rows_fine(valid, n, n_labels, ids, days, T, L, n_sessions, size, stride, top_id):
    """True when every row is fine: one compiled pass that stops at the first bad value (about
    1 us for 32 rows; numpy's whole-array calls took 25 us). size 0: no CTC check. A False goes
    on to `_described`, which says what is wrong; tests/data/test_rows.py holds the two to one verdict."""
    for r in range(n.shape[0]):
        v, t, k, d = valid[r], n[r], n_labels[r], days[r]
        if v > 1 or d < 0 or d >= n_sessions:
            return False
        if v == 1:
            if t < 1 or t > T or k < 0 or k > L:
                return False
        elif t != 0 or k != 0:
            return False
        repeats, prev = 0, 0
        for i in range(L):
            x = ids[r, i]
            if i < k:
                if x < 1 or x > top_id:
                    return False
                repeats += x == prev
                prev = x
            elif x != 0:
                return False
        if size > 0 and k + repeats > ((t - size) // stride + 1 if t >= size else 0):
            return False  # CTC needs a frame per label plus one between each repeated pair
    return True


def row_problems(fields: Mapping[str, np.ndarray | torch.Tensor], shape: BucketShape, n_sessions: int,
                 patching: tuple[int, int] | None) -> list[str]:
    """What is wrong with a batch's rows (lengths, labels, day indices, CTC feasibility), naming
    the first bad row of each kind; [] for a batch the step can train on. The batch has already
    passed `check_batch`; its fields are tensors or numpy arrays (the reader's `field_views`,
    which spare the views). patching: (patch_size, patch_stride) of the model the buckets fit
    (None: no CTC check)."""
    valid = _array(fields["valid"])  # (B,) bool
    n = _array(fields["n_time_steps"])  # (B,)
    n_labels = _array(fields["phone_seq_lens"])  # (B,)
    ids = _array(fields["seq_class_ids"])  # (B, L)
    days = _array(fields["day_indices"])  # (B,)
    if _fine(valid, n, n_labels, ids, days, shape, n_sessions, patching):
        return []
    return _described(valid, n, n_labels, ids, days, shape, n_sessions, patching)


def _fine(valid: np.ndarray, n: np.ndarray, n_labels: np.ndarray, ids: np.ndarray, days: np.ndarray,
          shape: BucketShape, n_sessions: int, patching: tuple[int, int] | None) -> bool:
    """`_rows_fine` on a batch's fields: the verdict `_described` must agree with."""
    size, stride = patching or (0, 1)
    return compiled_checks()(valid.view(np.uint8), n, n_labels, ids, days, shape.T, shape.L, n_sessions, size,
                             stride, SILENCE_ID)


@functools.cache
def compiled_checks() -> Callable[..., bool]:
    """`_rows_fine` as machine code, made on first use: importing numba and loading the code from
    its on-disk cache take about 0.8 s, which only a process that reads batches should pay. The
    loader calls this before its workers fork, so they inherit the code instead of loading it.

    Where the cache cannot be used, the code is compiled in memory instead (about 1 s more per
    process): a read-only install tree without a writable HOME (numba: "cannot cache
    function"), or a damaged cache index (an UnpicklingError naming no file).
    """
    import numba  # here, not at the top: see above

    signature = "b1(u1[:], i4[:], i4[:], i4[:, :], i4[:], i8, i8, i8, i8, i8, i8)"
    try:
        return numba.njit(signature, cache=True, nogil=True)(_rows_fine)
    except Exception:  # noqa: BLE001 - numba's cache raises RuntimeError, pickle and OS errors alike
        return numba.njit(signature, cache=False, nogil=True)(_rows_fine)


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
