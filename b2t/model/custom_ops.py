"""The XLA CTC op's (`ctc_op`) backward by recomputation, and the scan traps it works around.

The op is opaque to dynamo and AOTAutograd: one node in the forward graph, one (the
backward op) in the backward graph, so under `torch.compile(backend="openxla")` its XLA
kernel (a torch_xla scan) is traced into the same HLO module as the layers around it. The
backward kernel recomputes the differentiable forward (the scan) with autograd on and takes
its vector-Jacobian product: the forward op saves only its inputs. (The per-step state is a
small (B, 2L+1) alpha row; the GRU, whose scan would save its weights at every step, has
its own backward instead, `b2t.model.recurrence.stack_backward`.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from b2t.private_api import autograd_inside_op


def recompute_vjp(forward: Callable[..., torch.Tensor], grad: torch.Tensor, inputs: Sequence[torch.Tensor | None],
                  wanted: Sequence[bool]) -> list[torch.Tensor | None]:
    """d <grad, forward(*inputs)> / d inputs[i] for each `wanted` i (None elsewhere), recomputed.

    Runs with autograd re-enabled inside the op's kernel; inputs are detached first, so
    nothing outside the kernel is recorded. A wanted input the output does not depend on
    gets zeros (an op's gradient outputs must be tensors).
    """
    with autograd_inside_op():
        leaves = [None if t is None else t.detach().requires_grad_(w) for t, w in zip(inputs, wanted)]
        out = forward(*leaves)
        targets = [t for t, w in zip(leaves, wanted) if w]
        grads = iter(torch.autograd.grad(out, targets, grad, allow_unused=True))
    result: list[torch.Tensor | None] = []
    for t, w in zip(leaves, wanted):
        g = next(grads) if w else None
        result.append(torch.zeros_like(t) if w and g is None else g)
    return result


def traced_with_grad(xs: torch.Tensor) -> torch.Tensor:
    """A float tensor a torch_xla `scan` walks (its `xs`), requiring grad even where no gradient
    is wanted (under no_grad: an evaluation).

    scan caches the step it traced by shapes and dtypes, not by whether `xs` required grad:
    a first call at some shapes without grad left a trace with no gradient for `xs`, and
    every later training call at those shapes in the process (another model's, or another
    run's) got none (measured: weight_ih's gradient None after an evaluation call, so a
    second model trained in one process took other losses than alone).
    """
    return xs if xs.requires_grad else xs.detach().requires_grad_(True)


def detached_run(forward: Callable[..., torch.Tensor], *inputs: torch.Tensor | None) -> torch.Tensor:
    """The forward kernel: `forward` on detached inputs with autograd keys back (scan traces
    its backward as it goes and needs them).

    Float inputs require grad here as in the backward's recomputation: torch_xla's scan
    caches its traced step without the inputs' requires_grad in the key, and a trace made
    from inputs that did not require grad gave zero gradients to a later call (measured).
    """
    with autograd_inside_op():
        out = forward(*[None if t is None else t.detach().requires_grad_(t.is_floating_point()) for t in inputs])
    return out.detach()
