"""CTC loss that compiles on XLA: a log-space alpha recursion run as an XLA while-loop.

Why not `torch.nn.functional.ctc_loss` everywhere: it has no XLA lowering, so on an XLA
tensor it silently runs on the host (the counters `aten::_ctc_loss*` appear), syncing the
device twice per step. Written as a Python loop over time it would unroll, and compile
time would grow with T. So on XLA tensors the recursion (`ctc_op.scan_nll`) runs through
`torch_xla.experimental.scan.scan`: one while-loop whatever T is. On CPU or CUDA tensors
the native kernel is fast, so `ctc_loss` dispatches to it; both compute the same quantity.
Under `torch.compile` the recursion is the custom op `b2t::ctc_nll` (see `ctc_op`), one
node in dynamo's graph, so the loss compiles with the model instead of cutting its graph.

Semantics (both paths): per-row negative log-likelihood, not reduced, with
`zero_infinity=True` behaviour: an infeasible row (its labels need more frames than
its input length) gives 0 with zero gradient, never NaN or Inf. Padding rows (input
length 0, target length 0) give 0. Target labels must not equal `blank`.

Shape legend: B batch rows, T frames, C classes, L label slots, S = 2L + 1 states of
the extended label sequence (blank, l1, blank, l2, ..., lL, blank).
"""

from __future__ import annotations

import torch

from b2t.contract import LOSS_DTYPE
from b2t.model.ctc_op import ctc_nll


def ctc_feasible(
    targets: torch.Tensor, input_lengths: torch.Tensor, target_lengths: torch.Tensor
) -> torch.Tensor:
    """(B,) bool: True where a row's labels fit its input (one frame per label plus a
    blank between each pair of equal neighbours), i.e. where the CTC loss is finite."""
    L = targets.shape[1]
    pair = torch.arange(1, L, dtype=target_lengths.dtype, device=targets.device)  # (L-1,)
    in_row = pair[None, :] < target_lengths[:, None]  # (B, L-1): both labels of the pair valid
    repeats = ((targets[:, 1:] == targets[:, :-1]) & in_row).sum(dim=1)  # (B,)
    return target_lengths + repeats <= input_lengths


def ctc_loss(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    *,
    blank: int = 0,
) -> torch.Tensor:
    """Per-row CTC negative log-likelihood, (B,) float32; 0 for infeasible rows.

    log_probs (B, T, C) float32 log-softmax outputs (batch-first); targets (B, L) label ids,
    zero beyond each row's length; input_lengths (B,) in 0..T; target_lengths (B,) in 0..L.
    """
    if log_probs.dim() != 3 or targets.dim() != 2:
        raise ValueError(
            f"expected log_probs (B, T, C) and targets (B, L), got {tuple(log_probs.shape)} "
            f"and {tuple(targets.shape)}"
        )
    B = log_probs.shape[0]
    if not (targets.shape[0] == input_lengths.shape[0] == target_lengths.shape[0] == B):
        raise ValueError(
            f"batch sizes differ: log_probs {B}, targets {targets.shape[0]}, "
            f"input_lengths {input_lengths.shape[0]}, target_lengths {target_lengths.shape[0]}"
        )
    if log_probs.dtype != LOSS_DTYPE:
        raise ValueError(f"CTC is computed in {LOSS_DTYPE}; cast log_probs (got {log_probs.dtype})")
    nll = ctc_nll(log_probs, targets, input_lengths, target_lengths, blank)  # (B,)
    # zero_infinity as a mask, the same on every path; its gradient is 0 for those rows
    return torch.where(ctc_feasible(targets, input_lengths, target_lengths), nll, 0.0)
