"""The CTC negative log-likelihood as custom ops and their kernels.

`ctc_nll` is what `ctc.ctc_loss` calls after checking its inputs. Under `torch.compile`
it is one custom op, one node for dynamo and AOTAutograd (fake implementations below),
whose backward is a second op:
- on XLA, `b2t::ctc_nll`: `scan_nll`, the alpha recursion as one XLA while-loop, which the
  openxla bridge traces into the model's HLO module; its backward (`b2t::ctc_nll_backward`)
  recomputes it (see `custom_ops`);
- on CPU and CUDA (inductor), `b2t::ctc_native`: torch's CTC kernel, which returns the
  alpha table it computed; the backward (`b2t::ctc_native_backward`) is torch's own CTC
  backward on that table, nothing recomputed (`F.ctc_loss` itself cuts dynamo's graph:
  its alpha table's size depends on the label lengths' values).
Outside a compile `scan_nll` and `native_nll` (torch's `ctc_loss`) run directly with
their own autograd.

Values: per-row NLL (B,), f32. Rows whose labels cannot fit their frames are not
zeroed here (`ctc.ctc_loss` masks them, identically for both kernels).
Shape legend: B rows, T frames, C classes, L label slots, S = 2L + 1 extended states.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from b2t.contract import LOSS_DTYPE
from b2t.model.custom_ops import detached_run, recompute_vjp, traced_with_grad
from b2t.private_api import ctc_alpha, ctc_alpha_backward

_NEG = -1.0e30
"""Finite stand-in for log(0): -inf would turn logsumexp gradients into NaN."""


def native_nll(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
               target_lengths: torch.Tensor, blank: int) -> torch.Tensor:
    """torch's CTC kernel on (B, T, C) batch-first log-probabilities; 0 for infeasible rows."""
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


def scan_nll(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
) -> torch.Tensor:
    """The XLA kernel: fixed-shape tensor ops around one scan over T; (B,) NLL, large for
    infeasible rows (the caller masks them). Differentiable: scan builds its backward."""
    from torch_xla.experimental.scan import scan  # only importable where torch_xla is

    B, T, _ = log_probs.shape
    L = targets.shape[1]
    S = 2 * L + 1
    device = log_probs.device

    # No writes through views here: inside a custom op's kernel XLA tensors are not
    # functionalized, and a slice assignment would update a copy (measured: all-1e30 NLLs).
    blanks = torch.full((B, L + 1), blank, dtype=torch.int64, device=device)
    pairs = torch.stack([blanks[:, :L], targets.long()], dim=2).reshape(B, 2 * L)
    ext = torch.cat([pairs, blanks[:, L:]], dim=1)  # (B, S): blank, l1, blank, l2, ..., lL, blank
    # each state's class row over all frames, B*S indices (an element-wise gather's (B, T, S)
    # indices, and its backward's scatter, cost the TPU compiler a minute of relayout at B=64,
    # T=197; tools/compile_parts.py); the same values, time-major as the scan walks them
    rows = torch.arange(B, dtype=torch.int64, device=device)[:, None]  # (B, 1)
    emit = log_probs.transpose(1, 2)[rows, ext].permute(2, 0, 1)  # (B, C, T) -> (B, S, T) -> (T, B, S)

    no_s_minus_2 = torch.zeros((B, 2), dtype=torch.bool, device=device)  # states 0 and 1
    new_label = (ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2])  # (B, S-2)
    skip_ok = torch.cat([no_s_minus_2, new_label], dim=1)  # (B, S)
    skip_bias = torch.where(skip_ok, 0.0, _NEG).to(LOSS_DTYPE)  # (B, S)

    frames = torch.arange(T, dtype=input_lengths.dtype, device=device)  # (T,)
    active = frames[:, None] < input_lengths[None, :]  # (T, B)

    # A virtual frame before t=0 sits in state 0, so step 0 enters states 0 and 1 the
    # same way every later step does, and a row of input length 0 stays there.
    states = torch.arange(S, device=device)
    alpha0 = torch.where(states == 0, 0.0, _NEG).to(LOSS_DTYPE).expand(B, S).contiguous()  # (B, S)
    xs = (traced_with_grad(emit), active)  # (T, B, S), (T, B)
    (alpha, _), _ = scan(_alpha_step, (alpha0, skip_bias), xs, is_fn_pure=True)

    end = 2 * target_lengths.long()  # (B,) the final blank state
    last_blank = alpha.gather(1, end[:, None])[:, 0]  # (B,)
    last_label = alpha.gather(1, (end - 1).clamp(min=0)[:, None])[:, 0]  # (B,)
    last_label = torch.where(target_lengths > 0, last_label, _NEG)
    return -torch.logsumexp(torch.stack([last_blank, last_label]), dim=0)  # (B,)


@torch.library.custom_op("b2t::ctc_nll", mutates_args=(), device_types="xla")
def _ctc_nll_op(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
                target_lengths: torch.Tensor, blank: int) -> torch.Tensor:
    return detached_run(lambda *t: scan_nll(*t, blank), log_probs, targets, input_lengths, target_lengths)


@_ctc_nll_op.register_fake
def _(log_probs, targets, input_lengths, target_lengths, blank):
    return log_probs.new_empty((log_probs.shape[0],), dtype=LOSS_DTYPE)


@torch.library.custom_op("b2t::ctc_nll_backward", mutates_args=(), device_types="xla")
def _ctc_nll_backward_op(grad: torch.Tensor, log_probs: torch.Tensor, targets: torch.Tensor,
                         input_lengths: torch.Tensor, target_lengths: torch.Tensor, blank: int) -> torch.Tensor:
    (d_log_probs, *_) = recompute_vjp(lambda *t: scan_nll(*t, blank), grad,
                                      [log_probs, targets, input_lengths, target_lengths], [True, False, False, False])
    return d_log_probs.contiguous()


@_ctc_nll_backward_op.register_fake
def _(grad, log_probs, targets, input_lengths, target_lengths, blank):
    return torch.empty_like(log_probs, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output) -> None:
    *tensors, ctx.blank = inputs
    ctx.save_for_backward(*tensors)


def _backward(ctx, grad):
    d_log_probs = torch.ops.b2t.ctc_nll_backward(grad.contiguous(), *ctx.saved_tensors, ctx.blank)
    return d_log_probs, None, None, None, None


_ctc_nll_op.register_autograd(_backward, setup_context=_setup_context)


def _long(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.long() for t in tensors]


@torch.library.custom_op("b2t::ctc_native", mutates_args=(), device_types=("cpu", "cuda"))
def _ctc_native_op(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
                   target_lengths: torch.Tensor, blank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's CTC kernel: NLL (B,) (inf where infeasible) and the alpha table (B, T, S) it
    saves for the backward, padded with log(0) from 2 * max(target_lengths) + 1 states to S
    (the kernel sizes it by the longest label; a fake shape cannot depend on values)."""
    nll, alpha = ctc_alpha(log_probs.transpose(0, 1), *_long(targets, input_lengths, target_lengths), blank)
    return nll, F.pad(alpha, (0, 2 * targets.shape[1] + 1 - alpha.shape[2]), value=-math.inf)


@_ctc_native_op.register_fake
def _(log_probs, targets, input_lengths, target_lengths, blank):
    B, T, _ = log_probs.shape
    return log_probs.new_empty((B,)), log_probs.new_empty((B, T, 2 * targets.shape[1] + 1))


@torch.library.custom_op("b2t::ctc_native_backward", mutates_args=(), device_types=("cpu", "cuda"))
def _ctc_native_backward_op(grad: torch.Tensor, log_probs: torch.Tensor, targets: torch.Tensor,
                            input_lengths: torch.Tensor, target_lengths: torch.Tensor, nll: torch.Tensor,
                            alpha: torch.Tensor, blank: int) -> torch.Tensor:
    d = ctc_alpha_backward(grad, log_probs.transpose(0, 1), *_long(targets, input_lengths, target_lengths), nll, alpha,
                           blank)
    return d.transpose(0, 1).contiguous()  # (B, T, C)


@_ctc_native_backward_op.register_fake
def _(grad, log_probs, targets, input_lengths, target_lengths, nll, alpha, blank):
    return torch.empty_like(log_probs, memory_format=torch.contiguous_format)


def _setup_native_context(ctx, inputs, output) -> None:
    *tensors, ctx.blank = inputs
    ctx.save_for_backward(*tensors, *output)


def _native_backward(ctx, grad, _grad_alpha):
    d_log_probs = torch.ops.b2t.ctc_native_backward(grad.contiguous(), *ctx.saved_tensors, ctx.blank)
    return d_log_probs, None, None, None, None


_ctc_native_op.register_autograd(_native_backward, setup_context=_setup_native_context)


def ctc_nll(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
            target_lengths: torch.Tensor, blank: int) -> torch.Tensor:
    """Per-row CTC NLL (B,) of (B, T, C) f32 log-probabilities, 0 for infeasible rows on CPU/CUDA:
    the device's op when compiling, else its kernel."""
    xla = log_probs.device.type == "xla"
    if not torch.compiler.is_compiling():
        return (scan_nll if xla else native_nll)(log_probs, targets, input_lengths, target_lengths, blank)
    if xla:
        return torch.ops.b2t.ctc_nll(log_probs, targets, input_lengths, target_lengths, blank)
    nll, _ = torch.ops.b2t.ctc_native(log_probs, targets, input_lengths, target_lengths, blank)
    return torch.where(nll.isinf(), 0.0, nll)  # what native_nll's zero_infinity does
