"""The GRU layer stack as custom ops, so dynamo never cuts the graph.

`gru_stack` is what the decoder calls. Under `torch.compile` it is one custom op, which
dynamo and AOTAutograd see as one node with a fake (shape) implementation and a second
op as its backward:
- on XLA, `b2t::gru_stack`: the scan GRU (`recurrence.scan_stack`), whose while-loops the
  openxla bridge traces into the same HLO module as the layers around them; its backward
  (`b2t::gru_stack_backward`) recomputes the scan and takes its vector-Jacobian product;
- on CPU and CUDA (inductor), `b2t::gru_layers`: torch's own GRU kernel (cuDNN on CUDA,
  `recurrence.native_layers`), returning every layer's outputs, which it saves; its
  backward (`b2t::gru_layers_backward`, `recurrence.native_stack_backward`) recomputes
  only the gates from them, for all steps at once, and runs no forward again.
Outside a compile `gru_stack` calls the kernels directly, with their own autograd: eager
CPU/CUDA runs exactly torch's GRU and its autograd, lazy XLA exactly the scan.

Shape legend: B rows, P patches (time steps), D input width, H hidden units, L layers.
"""

from __future__ import annotations

import torch

from b2t.model.custom_ops import detached_run, recompute_vjp
from b2t.model.recurrence import native_layers, native_stack, native_stack_backward, scan_stack


def _flat(x, h0, weights, keep):
    return [x, h0, *weights, keep]


def _unflat(forward):
    return lambda x, h0, *rest: forward(x, h0, list(rest[:-1]), rest[-1])


def _weight_grads_like(x, h0, weights):
    """Fake gradients of x, h0 and every weight (contiguous, like the kernels return them)."""
    like = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in (x, h0, *weights)]
    return like[0], like[1], like[2:]


@torch.library.custom_op("b2t::gru_stack", mutates_args=(), device_types="xla")
def _gru_stack_op(x: torch.Tensor, h0: torch.Tensor, weights: list[torch.Tensor],
                  keep: torch.Tensor | None) -> torch.Tensor:
    return detached_run(_unflat(scan_stack), *_flat(x, h0, weights, keep)).contiguous()


@_gru_stack_op.register_fake
def _(x, h0, weights, keep):
    return x.new_empty((x.shape[0], x.shape[1], h0.shape[2]), dtype=h0.dtype)


@torch.library.custom_op("b2t::gru_stack_backward", mutates_args=(), device_types="xla")
def _gru_stack_backward_op(grad: torch.Tensor, x: torch.Tensor, h0: torch.Tensor, weights: list[torch.Tensor],
                           keep: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Gradients of x, h0 and every weight, by recomputing the forward scan (see `custom_ops`)."""
    inputs = _flat(x, h0, weights, keep)
    dx, dh0, *dweights, _ = recompute_vjp(_unflat(scan_stack), grad, inputs, [True] * (len(inputs) - 1) + [False])
    return dx.contiguous(), dh0.contiguous(), [g.contiguous() for g in dweights]


@_gru_stack_backward_op.register_fake
def _(grad, x, h0, weights, keep):
    return _weight_grads_like(x, h0, weights)


def _setup_context(ctx, inputs, output, *, save_output: bool = False) -> None:
    x, h0, weights, keep = inputs
    ctx.n_weights = len(weights)
    ctx.has_keep = keep is not None
    ctx.save_for_backward(x, h0, *weights, *([keep] if ctx.has_keep else []), *([output] if save_output else []))


def _saved(ctx) -> list:
    """[x, h0, weights, keep (or None), *saved outputs]."""
    x, h0, *rest = ctx.saved_tensors
    n, k = ctx.n_weights, int(ctx.has_keep)
    return [x, h0, list(rest[:n]), rest[n] if k else None, *rest[n + k :]]


def _backward(ctx, grad):
    dx, dh0, dweights = torch.ops.b2t.gru_stack_backward(grad.contiguous(), *_saved(ctx))
    return dx, dh0, dweights, None


_gru_stack_op.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("b2t::gru_layers", mutates_args=(), device_types=("cpu", "cuda"))
def _gru_layers_op(x: torch.Tensor, h0: torch.Tensor, weights: list[torch.Tensor],
                   keep: torch.Tensor | None) -> torch.Tensor:
    """Every layer's output (L, B, P, H) in h0's dtype: the last is the stack's output, and all
    of them are what the backward needs."""
    with torch.no_grad():
        return torch.stack([y.to(h0.dtype) for y in native_layers(x, h0, weights, keep)])


@_gru_layers_op.register_fake
def _(x, h0, weights, keep):
    return x.new_empty((h0.shape[0], x.shape[0], x.shape[1], h0.shape[2]), dtype=h0.dtype)


@torch.library.custom_op("b2t::gru_layers_backward", mutates_args=(), device_types=("cpu", "cuda"))
def _gru_layers_backward_op(grad: torch.Tensor, x: torch.Tensor, h0: torch.Tensor, weights: list[torch.Tensor],
                            keep: torch.Tensor | None, states: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    with torch.no_grad():
        dx, dh0, *dweights = native_stack_backward(grad, x, h0, weights, keep, states)
    return dx.contiguous(), dh0.contiguous(), [g.contiguous() for g in dweights]


@_gru_layers_backward_op.register_fake
def _(grad, x, h0, weights, keep, states):
    return _weight_grads_like(x, h0, weights)


def _layers_backward(ctx, grad):
    dx, dh0, dweights = torch.ops.b2t.gru_layers_backward(grad.contiguous(), *_saved(ctx))
    return dx, dh0, dweights, None


_gru_layers_op.register_autograd(
    _layers_backward, setup_context=lambda ctx, inputs, output: _setup_context(ctx, inputs, output, save_output=True))


def gru_stack(x: torch.Tensor, h0: torch.Tensor, weights: list[torch.Tensor],
              keep: torch.Tensor | None = None) -> torch.Tensor:
    """The stacked GRU: x (B, P, D), h0 (L, B, H), torch's flat weight order -> (B, P, H).

    `keep` (L-1, B, P, H): dropout masks applied to each layer's input after the first
    (0 or 1/(1-p)), or None for no dropout. Matmuls in x's dtype, state in h0's.
    """
    xla = x.device.type == "xla"
    if torch.compiler.is_compiling():
        return torch.ops.b2t.gru_stack(x, h0, weights, keep) if xla else torch.ops.b2t.gru_layers(x, h0, weights, keep)[-1]
    return (scan_stack if xla else native_stack)(x, h0, weights, keep)
