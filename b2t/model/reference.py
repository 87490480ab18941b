"""The public baseline's checkpoint keys <-> `GRUDecoder`'s: the one place that knows both.

The baseline (`model_training/rnn_model.py` of the Brain-to-Text '25 release) stores one
`day_weights.<d>` (F, F) and `day_biases.<d>` (1, F) per day, its initial state as `h0`,
and, because it trained the torch.compile'd module, every key behind the `_orig_mod.`
prefix. `GRUDecoder` stacks the day layers (`day.weight`, `day.bias`) and keeps `h0` with
its GRU (`gru.h0`); `gru.*` and `out.*` are the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from b2t.errors import InputFileError

COMPILE_PREFIX = "_orig_mod."
"""What torch.compile puts before every key of the module it wraps."""
DAY_KEYS = {"day_weights": "day.weight", "day_biases": "day.bias"}
"""Baseline per-day key stem -> the stacked b2t key."""
RENAMED = {"h0": "gru.h0"}
"""Baseline key -> b2t key, for keys that are neither per-day nor equal."""


def strip_compile_prefix(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` without torch.compile's `_orig_mod.` key prefix (keys without it are kept)."""
    return {k.removeprefix(COMPILE_PREFIX): v for k, v in state.items()}


def reference_shapes(model: nn.Module, n_days: int) -> dict[str, tuple[int, ...]]:
    """The baseline's key -> shape for a model of `model`'s sizes with `n_days` day layers."""
    ours_to_ref = {v: k for k, v in {**DAY_KEYS, **RENAMED}.items()}
    shapes = {}
    for key, value in model.state_dict().items():
        ref = ours_to_ref.get(key, key)
        if ref in DAY_KEYS:
            shapes.update({f"{ref}.{d}": tuple(value.shape[1:]) for d in range(n_days)})
        else:
            shapes[ref] = tuple(value.shape)
    return shapes


def from_reference_state_dict(state: Mapping[str, torch.Tensor],
                              days: Sequence[int] | None = None) -> dict[str, torch.Tensor]:
    """The baseline's `model_state_dict` in `GRUDecoder`'s keys, for `load_state_dict`.

    Drops the compile prefix and stacks the per-day keys in day order; `days` picks (and
    orders) the baseline days the model's day indices 0..n-1 stand for (default: all, in order).
    """
    plain = strip_compile_prefix(state)
    stems = tuple(f"{stem}." for stem in DAY_KEYS)
    out = {RENAMED.get(k, k): v for k, v in plain.items() if not k.startswith(stems)}
    for stem, ours in DAY_KEYS.items():
        found = sorted(int(k.rpartition(".")[2]) for k in plain if k.startswith(stem + "."))
        if not found or found != list(range(len(found))):
            raise InputFileError(f"reference state dict: {stem}.<d> keys must be numbered 0..n-1, found days {found}")
        order = found if days is None else list(days)
        out[ours] = torch.stack([plain[f"{stem}.{d}"] for d in order])  # (n_days, ...)
    return out
