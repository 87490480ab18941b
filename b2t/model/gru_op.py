"""The GRU layer stack as one custom op (`b2t::gru_stack`), so dynamo never cuts the graph.

`gru_stack` is what the decoder calls. Under `torch.compile` (openxla or inductor) it is
the custom op: dynamo and AOTAutograd see one node with a fake (shape) implementation,
and its backward is a second op (`b2t::gru_stack_backward`). The kernels: on XLA the
scan GRU (`recurrence.scan_stack`), so the openxla bridge traces the while-loops into
the same HLO module as the layers around them; on CPU and CUDA torch's own GRU kernel
(`recurrence.native_stack`). Outside a compile it calls those functions directly, with
their own autograd: eager CPU/CUDA runs exactly torch's GRU, lazy XLA exactly the scan.

Shape legend: B rows, P patches (time steps), D input width, H hidden units, L layers.
"""

from __future__ import annotations

import torch

from b2t.model.custom_ops import detached_run, recompute_vjp
from b2t.model.recurrence import native_stack, scan_stack


def _forward_fn(x: torch.Tensor):
    return scan_stack if x.device.type == "xla" else native_stack


def _flat(x, h0, weights, keep):
    return [x, h0, *weights, keep]


def _unflat(forward):
    return lambda x, h0, *rest: forward(x, h0, list(rest[:-1]), rest[-1])


@torch.library.custom_op("b2t::gru_stack", mutates_args=(), device_types=("cpu", "cuda"))
def _gru_stack_op(x: torch.Tensor, h0: torch.Tensor, weights: list[torch.Tensor],
                  keep: torch.Tensor | None) -> torch.Tensor:
    with torch.no_grad():
        return native_stack(x, h0, weights, keep).contiguous()


@_gru_stack_op.register_kernel("xla")
def _(x, h0, weights, keep):
    return detached_run(_unflat(scan_stack), *_flat(x, h0, weights, keep)).contiguous()


@_gru_stack_op.register_fake
def _(x, h0, weights, keep):
    return x.new_empty((x.shape[0], x.shape[1], h0.shape[2]), dtype=h0.dtype)


@torch.library.custom_op("b2t::gru_stack_backward", mutates_args=(), device_types=("cpu", "cuda", "xla"))
def _gru_stack_backward_op(grad: torch.Tensor, x: torch.Tensor, h0: torch.Tensor, weights: list[torch.Tensor],
                           keep: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Gradients of x, h0 and every weight, by recomputing the forward (see `custom_ops`)."""
    inputs = _flat(x, h0, weights, keep)
    dx, dh0, *dweights, _ = recompute_vjp(_unflat(_forward_fn(x)), grad, inputs, [True] * (len(inputs) - 1) + [False])
    return dx.contiguous(), dh0.contiguous(), [g.contiguous() for g in dweights]


@_gru_stack_backward_op.register_fake
def _(grad, x, h0, weights, keep):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (x, h0)) + (
        [torch.empty_like(w, memory_format=torch.contiguous_format) for w in weights],)


def _setup_context(ctx, inputs, output) -> None:
    x, h0, weights, keep = inputs
    ctx.n_weights = len(weights)
    ctx.has_keep = keep is not None
    ctx.save_for_backward(x, h0, *weights, *([keep] if ctx.has_keep else []))


def _backward(ctx, grad):
    x, h0, *rest = ctx.saved_tensors
    weights, keep = rest[: ctx.n_weights], (rest[-1] if ctx.has_keep else None)
    dx, dh0, dweights = torch.ops.b2t.gru_stack_backward(grad.contiguous(), x, h0, weights, keep)
    return dx, dh0, dweights, None


_gru_stack_op.register_autograd(_backward, setup_context=_setup_context)


def gru_stack(x: torch.Tensor, h0: torch.Tensor, weights: list[torch.Tensor],
              keep: torch.Tensor | None = None) -> torch.Tensor:
    """The stacked GRU: x (B, P, D), h0 (L, B, H), torch's flat weight order -> (B, P, H).

    `keep` (L-1, B, P, H): dropout masks applied to each layer's input after the first
    (0 or 1/(1-p)), or None for no dropout. Matmuls in x's dtype, state in h0's.
    """
    if torch.compiler.is_compiling():
        return torch.ops.b2t.gru_stack(x, h0, weights, keep)
    return _forward_fn(x)(x, h0, weights, keep)
