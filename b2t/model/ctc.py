"""CTC loss that compiles on XLA: a log-space alpha recursion run as an XLA while-loop.

Why not `torch.nn.functional.ctc_loss` everywhere: it has no XLA lowering, so on an XLA
tensor it silently runs on the host (the counters `aten::_ctc_loss*` appear), syncing the
device twice per step. Written as a Python loop over time it would unroll, and compile
time would grow with T. So on XLA tensors the recursion below runs through
`torch_xla.experimental.scan.scan` (one while-loop whatever T is; its gradient is a second
scan built by AOTAutograd). That call is wrapped in `torch.compiler.disable` because scan
fails inside `torch.compile(backend="openxla")` in torch 2.9: dynamo compiles the dense
parts and the CTC runs lazily as an island. On CPU or CUDA tensors the native kernel is
fast and has no such problem, so `ctc_loss` dispatches to it; both paths compute the same quantity.

Semantics (both paths): per-row negative log-likelihood, not reduced, with
`zero_infinity=True` behaviour: an infeasible row (its labels need more frames than
its input length) gives 0 with zero gradient, never NaN or Inf. Padding rows (input
length 0, target length 0) give 0. Target labels must not equal `blank`.

Shape legend: B batch rows, T frames, C classes, L label slots, S = 2L + 1 states of
the extended label sequence (blank, l1, blank, l2, ..., lL, blank).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from b2t.contract import LOSS_DTYPE

_NEG = -1.0e30
"""Finite stand-in for log(0): -inf would turn logsumexp gradients into NaN."""


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
    if log_probs.device.type == "xla":
        return _ctc_loss_scan(log_probs, targets, input_lengths, target_lengths, blank)
    return F.ctc_loss(
        log_probs.transpose(0, 1),  # (T, B, C), the layout the native kernel takes
        targets.long(),
        input_lengths.long(),
        target_lengths.long(),
        blank=blank,
        reduction="none",
        zero_infinity=True,
    )


def _alpha_step(
    carry: tuple[torch.Tensor, torch.Tensor], x: tuple[torch.Tensor, torch.Tensor]
) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """One frame of the forward (alpha) recursion; rows past their input length keep alpha.

    The skip bias rides in the carry (unchanged) because a scan body may not close over
    tensors. Only the final alpha is read, but scan (torch_xla 2.9) fails unless each step
    emits a differentiable output, so it emits the cheapest one, state 0's alpha (B,).
    """
    alpha, skip_bias = carry  # (B, S), (B, S): 0 where s may jump from s-2, else _NEG
    emit, active = x  # (B, S) log-prob of each state's label at this frame, (B,) bool
    from_prev = F.pad(alpha[:, :-1], (1, 0), value=_NEG)  # (B, S): alpha[s-1]
    from_skip = F.pad(alpha[:, :-2], (2, 0), value=_NEG) + skip_bias  # (B, S): alpha[s-2]
    stepped = torch.logsumexp(torch.stack([alpha, from_prev, from_skip]), dim=0) + emit
    alpha = torch.where(active[:, None], stepped, alpha)
    return (alpha, skip_bias), alpha[:, 0].clone()  # a view here breaks scan's tracing


@torch.compiler.disable
def _ctc_loss_scan(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
) -> torch.Tensor:
    """The XLA path: fixed-shape tensor ops around one scan over T."""
    from torch_xla.experimental.scan import scan  # only importable where torch_xla is

    B, T, _ = log_probs.shape
    L = targets.shape[1]
    S = 2 * L + 1
    device = log_probs.device

    ext = torch.full((B, S), blank, dtype=torch.int64, device=device)
    ext[:, 1::2] = targets.long()  # (B, S): blank, l1, blank, l2, ..., lL, blank
    emit = log_probs.gather(2, ext[:, None, :].expand(B, T, S))  # (B, T, S)

    no_s_minus_2 = torch.zeros((B, 2), dtype=torch.bool, device=device)  # states 0 and 1
    new_label = (ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2])  # (B, S-2)
    skip_ok = torch.cat([no_s_minus_2, new_label], dim=1)  # (B, S)
    skip_bias = torch.where(skip_ok, 0.0, _NEG).to(LOSS_DTYPE)  # (B, S)

    frames = torch.arange(T, dtype=input_lengths.dtype, device=device)  # (T,)
    active = frames[:, None] < input_lengths[None, :]  # (T, B)

    # A virtual frame before t=0 sits in state 0, so step 0 enters states 0 and 1 the
    # same way every later step does, and a row of input length 0 stays there.
    alpha0 = torch.full((B, S), _NEG, dtype=LOSS_DTYPE, device=device)
    alpha0[:, 0] = 0.0
    xs = (emit.transpose(0, 1), active)  # (T, B, S), (T, B)
    (alpha, _), _ = scan(_alpha_step, (alpha0, skip_bias), xs, is_fn_pure=True)

    end = 2 * target_lengths.long()  # (B,) the final blank state
    last_blank = alpha.gather(1, end[:, None])[:, 0]  # (B,)
    last_label = alpha.gather(1, (end - 1).clamp(min=0)[:, None])[:, 0]  # (B,)
    last_label = torch.where(target_lengths > 0, last_label, _NEG)
    nll = -torch.logsumexp(torch.stack([last_blank, last_label]), dim=0)  # (B,)
    feasible = ctc_feasible(targets, input_lengths, target_lengths)
    return torch.where(feasible, nll, 0.0)
