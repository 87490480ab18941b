"""The shaped-batch contract: the one place that says what a batch is.

The shard writer (`preprocess/`), the shard reader (`b2t/data`), the trainer's warm-up
and the tests all import this module, so a batch that leaves the writer is, by
construction, one the compiled step has already seen. XLA compiles one graph per input
shape and dtype; everything here exists to keep that set small and fixed.

Besides the tensors, each batch carries JSON meta: its bucket, split, epoch and index, and
per row the identity of the trial it holds (`RowMeta`, None for padding rows).

Shape legend: B batch rows (fixed per bucket), T time bins (the bucket length),
F = 512 features, L label width (fixed per bucket).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

import torch

from b2t.errors import DatasetError

FEATURE_DIM = 512
"""256 electrodes x (threshold crossings, spike-band power), 20 ms bins."""

# --- dtype policy -------------------------------------------------------------------
# Storage: features travel as bf16 (half the bytes of f32, and what the step computes
# in); every integer field is int32 so no int64/int32 mix ever reaches a graph.
# Compute: f32 master weights and optimizer state, bf16 autocast around the forward,
# and the CTC loss in f32 (it is a long log-space recursion; bf16 loses it).
# `train.compute_dtype: f32` turns the autocast off; `auto` (the default) does so only on
# a CPU whose bf16 matmuls are emulated (AVX2 only: far slower than f32 there; docs/architecture.md).
FEATURE_DTYPE = torch.bfloat16
INDEX_DTYPE = torch.int32
PARAM_DTYPE = torch.float32
COMPUTE_DTYPE = torch.bfloat16
LOSS_DTYPE = torch.float32


def compute_dtype(name: str, bf16_is_native: bool) -> torch.dtype:
    """`train.compute_dtype` (`b2t.config.COMPUTE_DTYPES`) as a dtype, on a device that does
    (or, a CPU without bf16 matmuls, does not) compute bf16 natively."""
    if name == "auto":
        name = "bf16" if bf16_is_native else "f32"
    return {"bf16": COMPUTE_DTYPE, "f32": PARAM_DTYPE}[name]


@dataclass(frozen=True)
class Field:
    dtype: torch.dtype
    dims: tuple[str, ...]


FIELDS: dict[str, Field] = {
    "features": Field(FEATURE_DTYPE, ("B", "T", "F")),  # zero beyond n_time_steps
    "n_time_steps": Field(INDEX_DTYPE, ("B",)),  # true length of each row, <= T
    "seq_class_ids": Field(INDEX_DTYPE, ("B", "L")),  # phoneme ids, zero beyond length
    "phone_seq_lens": Field(INDEX_DTYPE, ("B",)),  # 0 for test trials and padding rows
    "day_indices": Field(INDEX_DTYPE, ("B",)),  # position in the manifest's session list
    "valid": Field(torch.bool, ("B",)),  # False for rows that only fill the batch
}
"""Every tensor of a batch, in every split (test batches carry zero-length labels)."""


MAX_DIM = 2**20
"""The largest T, B or L a bucket may have: far above any real one (T is at most a few
thousand bins), far below where a batch's element count overflows."""


@dataclass(frozen=True, order=True)
class BucketShape:
    """The shape of every batch of one bucket: T time bins, B rows, L label slots."""

    T: int
    B: int
    L: int

    def dims(self) -> dict[str, int]:
        return {"B": self.B, "T": self.T, "F": FEATURE_DIM, "L": self.L}

    def field_shape(self, name: str) -> tuple[int, ...]:
        dims = self.dims()
        return tuple(dims[d] for d in FIELDS[name].dims)

    def to_dict(self) -> dict[str, int]:
        return {"T": self.T, "B": self.B, "L": self.L}

    @classmethod
    def from_dict(cls, d: Mapping[str, int]) -> BucketShape:
        """The bucket `d` describes; DatasetError for a size that is not an integer in 1..MAX_DIM
        (int() read "206" and 206.5 as sizes, true as 1, and 10**30 overflowed in torch)."""
        dims = {k: d[k] for k in ("T", "B", "L")}
        bad = [f"{k}={v!r}" for k, v in dims.items() if type(v) is not int or not 1 <= v <= MAX_DIM]
        if bad:
            raise DatasetError(f"bucket {dict(d)}: {', '.join(bad)}: expected integers in 1..{MAX_DIM}")
        return cls(**dims)


def check_batch(batch: Mapping[str, torch.Tensor], shape: BucketShape) -> None:
    """Raise ValueError unless `batch` holds exactly FIELDS with `shape`'s sizes and dtypes."""
    missing = sorted(set(FIELDS) - set(batch))
    extra = sorted(set(batch) - set(FIELDS))
    if missing or extra:
        raise DatasetError(f"batch fields differ from the contract: missing {missing}, extra {extra}")
    for name, field in FIELDS.items():
        t = batch[name]
        want = shape.field_shape(name)
        if tuple(t.shape) != want or t.dtype != field.dtype:
            raise DatasetError(
                  f"batch field {name!r} is {t.dtype} {tuple(t.shape)}, "
                  f"the contract for bucket {shape} says {field.dtype} {want}"
              )


def empty_batch(shape: BucketShape, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """An all-padding batch of `shape` (every row invalid); used to fill and to warm up."""
    return {
        name: torch.zeros(shape.field_shape(name), dtype=field.dtype, device=device)
        for name, field in FIELDS.items()
    }


class RowMeta(TypedDict):
    """Where one valid row of a batch came from (padding rows have None instead)."""

    session: str  # e.g. t15.2023.08.13
    block: int
    trial: int
    group: str  # HDF5 group name, e.g. trial_0007
    file: str  # the source HDF5 file, relative to the preprocessed root
    sentence: str | None  # the sentence label; None for test trials


ROW_META_KEYS = frozenset(RowMeta.__annotations__)


def check_rows(rows: list[RowMeta | None], valid: torch.Tensor) -> None:
    """Raise DatasetError unless the meta rows match the batch's valid mask and carry `RowMeta`'s keys."""
    if [r is not None for r in rows] != valid.tolist():
        raise DatasetError("meta rows disagree with the valid mask")
    for i, r in enumerate(rows):
        if r is not None and set(r) != ROW_META_KEYS:
            raise DatasetError(f"meta row {i} has keys {sorted(r)}, the contract says {sorted(ROW_META_KEYS)}")


TRIAL_GROUP = re.compile(r"trial_(\d+)")
"""HDF5 trial group names: trial_0000, trial_0001, ... (zero-padded; wider past 9999)."""


def trial_number(group: str) -> int:
    """The trial's place in its file, from its group name: the one trial order (files and competition ids)."""
    m = TRIAL_GROUP.fullmatch(group)
    if m is None:
        raise DatasetError(f"{group!r} is not a trial group name (trial_NNNN)")
    return int(m.group(1))


@dataclass(frozen=True)
class Batch:
    """One decoded batch: contract tensors (on the host until moved), its bucket index and meta."""

    bucket: int
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]

    def to(self, device: torch.device) -> Batch:
        return Batch(self.bucket, {k: v.to(device) for k, v in self.tensors.items()}, self.meta)
