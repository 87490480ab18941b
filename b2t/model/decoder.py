"""The reference GRU phoneme decoder, written so every batch shape compiles to one graph.

Same layers, shapes, init and parameter count as the Brain-to-Text '25 baseline
(`model_training/rnn_model.py`; about 44M parameters with 45 days), with three changes
that keep the step on the device and its shape fixed:

- the per-day input layers are one stacked parameter indexed by the batch's day ids on
  the device (the baseline loops over days in Python and reads each id back to the host);
- patching is built from reshapes and contiguous slices instead of `Tensor.unfold`, which
  XLA runs on the host; the element order is the baseline's, so its checkpoints give the
  same logits (`from_reference_state_dict` converts them);
- on XLA the GRU runs as one while-loop per layer (`recurrence.scan_stack`), so compile
  time does not grow with T; elsewhere torch's own GRU kernel runs the same parameters.
  Under `torch.compile` the stack is one custom op (`gru_op`): the whole forward is one
  graph, with no break;
- dropout masks are inputs (`input_keep`, `rnn_keep`) a caller may draw outside a compiled
  region: a random op inside a compiled graph can draw the same numbers every call.

Checkpoint keys are the baseline's (`gru.*`, `h0`, `out.*`) except the day layers, which
are `day_weights` (n_days, F, F) and `day_biases` (n_days, 1, F) instead of one key per day.

Dtypes: parameters are f32 master weights; the trainer sets bf16 autocast around the
forward, so the day layer, the GRU matmuls and the output layer compute in bf16 while the
GRU's hidden state stays f32. The model never sets a dtype policy itself.

Shape legend: B batch rows, T time bins, F = 512 features, P patches, H hidden units,
C = 41 classes.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from b2t.config import ModelConfig
from b2t.contract import FEATURE_DIM, N_CLASSES, PARAM_DTYPE
from b2t.model.gru_op import gru_stack
from b2t.model.recurrence import gru_weights, make_gru

_CPU = torch.device("cpu")


class GRUDecoder(nn.Module):
    """Day layer -> patching -> stacked GRU with a learnable initial state -> linear to C classes.

    `xla` says which device the model runs on (checked, so a misplaced batch fails clearly);
    the GRU's kernel follows the device (see `gru_op`); the parameters, and so the
    checkpoints, are the same either way. Parameters are made on the CPU in f32: one seed
    gives the same weights on every backend; move the model with `.to(device)`.
    """

    def __init__(self, n_days: int, cfg: ModelConfig, *, xla: bool) -> None:
        super().__init__()
        if n_days < 1:
            raise ValueError(f"n_days must be >= 1 (sessions in the manifest), got {n_days}")
        self.n_days = n_days
        self.cfg = cfg
        self.xla = xla
        # identity + zero bias: each day starts as the plain softsign of its features
        eye = torch.eye(FEATURE_DIM, dtype=PARAM_DTYPE, device=_CPU)
        self.day_weights = nn.Parameter(eye.expand(n_days, -1, -1).clone())  # (n_days, F, F)
        self.day_biases = nn.Parameter(torch.zeros(n_days, 1, FEATURE_DIM, dtype=PARAM_DTYPE, device=_CPU))
        self.input_dropout = nn.Dropout(cfg.input_dropout)
        self.gru = make_gru(cfg.patch_size * FEATURE_DIM, cfg)
        h0 = torch.empty(1, 1, cfg.n_units, dtype=PARAM_DTYPE, device=_CPU)
        self.h0 = nn.Parameter(nn.init.xavier_uniform_(h0))  # expanded to every layer and row
        self.out = nn.Linear(cfg.n_units, N_CLASSES, device=_CPU, dtype=PARAM_DTYPE)
        nn.init.xavier_uniform_(self.out.weight)

    def forward(self, features: torch.Tensor, day_indices: torch.Tensor,
                input_keep: torch.Tensor | None = None, rnn_keep: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, P, C) for features (B, T, F) of any float dtype and int32 day ids (B,).

        `input_keep` (B, T, F): a ready-made input-dropout mask (0 or 1/(1-p)) used instead of
        `input_dropout`. The trainer draws it outside the compiled region: under
        torch.compile(openxla) a dropout inside the graph drew the same mask every step
        (measured: val PER stuck near 1 while the lazy backend learned).

        P = (T - patch_size) // patch_stride + 1: the output covers the whole padded T;
        `output_lengths` says how many patches of each row hold real data.
        """
        if features.dim() != 3 or features.shape[2] != FEATURE_DIM:
            raise ValueError(f"features must be (B, T, {FEATURE_DIM}), got {tuple(features.shape)}")
        if (features.device.type == "xla") != self.xla:
            raise ValueError(
                f"this decoder was built with xla={self.xla} but got features on {features.device}; "
                "build it with xla=True for XLA devices and xla=False otherwise"
            )
        x = features.to(self.day_weights.dtype)
        w = self.day_weights.index_select(0, day_indices)  # (B, F, F)
        b = self.day_biases.index_select(0, day_indices)  # (B, 1, F)
        # baddbmm (unlike bmm + b) is on the autocast lists, so its output is the compute dtype
        x = F.softsign(torch.baddbmm(b, x, w))  # (B, T, F)
        x = self.input_dropout(x) if input_keep is None else x * input_keep
        x = patches(x, self.cfg.patch_size, self.cfg.patch_stride)  # (B, P, size*F)
        h0 = self.h0.expand(self.cfg.n_layers, x.shape[0], -1).contiguous()  # (n_layers, B, H)
        shape = self.rnn_keep_shape(x.shape[0], x.shape[1])
        if rnn_keep is None and shape is not None:
            p = self.gru.dropout
            rnn_keep = (torch.rand(shape, dtype=PARAM_DTYPE, device=x.device) >= p).to(PARAM_DTYPE) / (1.0 - p)
        y = gru_stack(x, h0, gru_weights(self.gru), rnn_keep)  # (B, P, H)
        return self.out(y)  # (B, P, C)

    def rnn_keep_shape(self, n_rows: int, n_patches: int) -> tuple[int, ...] | None:
        """Shape of the dropout masks between GRU layers, (n_layers-1, B, P, H); None in eval
        mode or without that dropout."""
        if not self.training or self.gru.dropout == 0 or self.cfg.n_layers < 2:
            return None
        return (self.cfg.n_layers - 1, n_rows, n_patches, self.cfg.n_units)

    def output_lengths(self, n_time_steps: torch.Tensor) -> torch.Tensor:
        """Patches holding real data per row (int32, 0 below one patch), from true lengths (B,).

        Tensor ops only, so it stays on the device inside a compiled step (no host sync).
        """
        return patch_counts(n_time_steps, self.cfg.patch_size, self.cfg.patch_stride)


def patches(x: torch.Tensor, size: int, stride: int) -> torch.Tensor:
    """Windows of `size` bins every `stride` bins, flattened time-major: (B, T, F) -> (B, P, size*F).

    Row p is bins p*stride .. p*stride+size-1 in time order, the element order of the
    baseline's unfold/permute/reshape, with P = (T - size) // stride + 1.

    Built from contiguous blocks, not a gather: time is cut into blocks of `stride` bins,
    and window p is blocks p .. p+n-1 (n = ceil(size/stride)) cut to `size` bins. The
    backward is then pads and adds; a gather's backward is a scatter-add over overlapping
    windows (typically slow on accelerators), and `size` stride-step slices compiled about
    ten times slower on XLA:CPU (1.5 s against 0.15 s for day layer + patching, fwd+bwd).
    """
    n_batch, n_time, n_feat = x.shape
    if n_time < size:
        raise ValueError(f"need at least patch_size={size} time bins, got T={n_time}")
    n_patches = (n_time - size) // stride + 1
    n_blocks = -(-size // stride)  # blocks a window touches
    n_bins = stride * (n_patches + n_blocks - 1)  # bins the blocks cover
    if n_time >= n_bins:
        x = x[:, :n_bins]  # bins past the last window are never used
    else:
        x = F.pad(x, (0, 0, 0, n_bins - n_time))  # zeros only ever land past `size` in a window
    blocks = x.reshape(n_batch, n_bins // stride, stride, n_feat)  # (B, P+n-1, stride, F)
    windows = torch.cat([blocks[:, j : j + n_patches] for j in range(n_blocks)], dim=2)  # (B, P, n*stride, F)
    return windows[:, :, :size].reshape(n_batch, n_patches, size * n_feat)


def patch_counts(n_time_steps: torch.Tensor, size: int, stride: int) -> torch.Tensor:
    """`b2t.buckets.patch_count` as tensor ops: int32 patches per length, 0 below `size`."""
    # for n < size the floor division gives <= -1, so the clamp returns 0
    counts = torch.div(n_time_steps - size, stride, rounding_mode="floor") + 1
    return counts.clamp(min=0).to(torch.int32)


def from_reference_state_dict(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The baseline checkpoint's `model_state_dict` in this model's keys, for `load_state_dict`.

    Drops the `_orig_mod.` prefix torch.compile left and stacks the per-day keys
    `day_weights.<d>` (F, F) and `day_biases.<d>` (1, F) in day order.
    """
    plain = {k.removeprefix("_orig_mod."): v for k, v in state.items()}
    out = {k: v for k, v in plain.items() if not k.startswith(("day_weights.", "day_biases."))}
    for name in ("day_weights", "day_biases"):
        days = sorted(int(k.rpartition(".")[2]) for k in plain if k.startswith(name + "."))
        if not days or days != list(range(len(days))):
            raise ValueError(
                f"reference state dict: {name}.<d> keys must be numbered 0..n-1, found days {days}"
            )
        out[name] = torch.stack([plain[f"{name}.{d}"] for d in days])  # (n_days, ...)
    return out
