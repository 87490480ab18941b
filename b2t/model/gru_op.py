"""The GRU layer stack as one custom op, so dynamo never cuts the graph.

`gru_stack` is what the decoder calls. Under `torch.compile` it is the op `b2t::gru_layers`,
which dynamo and AOTAutograd see as one node with a fake (shape) implementation and a
second op, `b2t::gru_layers_backward`, as its backward:
- the forward returns every layer's outputs, which it saves: torch's own GRU kernel on CPU
  and CUDA (cuDNN, `recurrence.native_layers`), one XLA while-loop per layer on XLA
  (`recurrence.scan_layers`, traced by the openxla bridge into the same HLO module as the
  layers around it); on CPU and CUDA also the first layer's input projection, which it
  saves too (an empty tensor on XLA, where the compiler decides what to keep);
- the backward (`recurrence.stack_backward`) recomputes only the gates from them, for all
  steps at once, and runs no forward again.
Outside a compile, on XLA the same kernels run as a `torch.autograd.Function`, not through
the op: a custom op's kernel runs without functionalization, and there every view (a
`chunk`, a `transpose`) of a lazy XLA tensor was copied to the device (measured: two host
transfers of its base per view, 2.1 GB for the 687M model's recomputed gates on 8 devices);
inside a compile the kernels do run through the op, so they take no strided views
(`recurrence._gate_blocks`); on CPU/CUDA `gru_stack` runs torch's GRU with torch's own autograd.

Shape legend: B rows, P patches (time steps), D input width, H hidden units, L layers.
"""

from __future__ import annotations

import torch

from b2t.model.recurrence import input_gates, native_layers, native_stack, scan_layers, stack_backward


def _all_layers(x: torch.Tensor, h0: torch.Tensor, weights: list[torch.Tensor],
                keep: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every layer's output (L, B, P, H) in h0's dtype (the last is the stack's output) and
    the first layer's input projection (P, B, 3H) in x's dtype, (0,) on XLA: what the
    backward needs."""
    with torch.no_grad():
        if x.device.type == "xla":
            outputs, gates = scan_layers(x, h0, weights, keep), x.new_empty(0)
        else:
            gates = input_gates(x, h0, weights)
            outputs = native_layers(x, h0, weights, keep, gates)
        return torch.stack([y.to(h0.dtype) for y in outputs]), gates


@torch.library.custom_op("b2t::gru_layers", mutates_args=(), device_types=("cpu", "cuda", "xla"))
def _gru_layers_op(x: torch.Tensor, h0: torch.Tensor, weights: list[torch.Tensor],
                   keep: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    return _all_layers(x, h0, weights, keep)


@_gru_layers_op.register_fake
def _(x, h0, weights, keep):
    states = x.new_empty((h0.shape[0], x.shape[0], x.shape[1], h0.shape[2]), dtype=h0.dtype)
    gates = x.new_empty(0 if x.device.type == "xla" else (x.shape[1], x.shape[0], weights[0].shape[0]))
    return states, gates


@torch.library.custom_op("b2t::gru_layers_backward", mutates_args=(), device_types=("cpu", "cuda", "xla"))
def _gru_layers_backward_op(grad: torch.Tensor, x: torch.Tensor, h0: torch.Tensor, weights: list[torch.Tensor],
                            keep: torch.Tensor | None, states: torch.Tensor, gates: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    with torch.no_grad():
        dx, dh0, *dweights = stack_backward(grad, x, h0, weights, keep, states, gates if gates.numel() else None)
    return dx.contiguous(), dh0.contiguous(), [g.contiguous() for g in dweights]


@_gru_layers_backward_op.register_fake
def _(grad, x, h0, weights, keep, states, gates):
    like = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in (x, h0, *weights)]
    return like[0], like[1], like[2:]


def _setup_context(ctx, inputs, output) -> None:
    x, h0, weights, keep = inputs
    ctx.n_weights = len(weights)
    ctx.has_keep = keep is not None
    states, gates = output
    ctx.mark_non_differentiable(gates)
    ctx.save_for_backward(x, h0, *weights, *([keep] if ctx.has_keep else []), states, gates)


def _backward(ctx, grad, _gates_grad):
    x, h0, *rest = ctx.saved_tensors
    n, k = ctx.n_weights, int(ctx.has_keep)
    keep, states, gates = (rest[n] if k else None), rest[n + k], rest[n + k + 1]
    dx, dh0, dweights = torch.ops.b2t.gru_layers_backward(grad.contiguous(), x, h0, list(rest[:n]), keep, states, gates)
    return dx, dh0, dweights, None


_gru_layers_op.register_autograd(_backward, setup_context=_setup_context)


class _LazyGRULayers(torch.autograd.Function):
    """`b2t::gru_layers` and its backward for lazy XLA, with functionalization on (see above)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, h0: torch.Tensor, keep: torch.Tensor | None, *weights: torch.Tensor) -> torch.Tensor:
        states, _ = _all_layers(x, h0, list(weights), keep)
        ctx.save_for_backward(x, h0, keep, states, *weights)
        return states

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, h0, keep, states, *weights = ctx.saved_tensors
        with torch.no_grad():
            dx, dh0, *dweights = stack_backward(grad, x, h0, weights, keep, states)
        return dx, dh0, None, *dweights


def gru_stack(x: torch.Tensor, h0: torch.Tensor, weights: list[torch.Tensor],
              keep: torch.Tensor | None = None) -> torch.Tensor:
    """The stacked GRU: x (B, P, D), h0 (L, B, H), torch's flat weight order -> (B, P, H).

    `keep` (L-1, B, P, H): dropout masks applied to each layer's input after the first
    (0 or 1/(1-p)), or None for no dropout. Matmuls in x's dtype, state in h0's.
    """
    if torch.compiler.is_compiling():
        return torch.ops.b2t.gru_layers(x, h0, weights, keep)[0][-1]
    if x.device.type == "xla":
        return _LazyGRULayers.apply(x, h0, keep, *weights)[-1]
    return native_stack(x, h0, weights, keep)
