"""The GRU stack's two kernels, for the parameters of a `b2t.model.layers.GRUStack`.

- `native_stack` (CPU, CUDA): torch's GRU kernel (what `nn.GRU` calls, `b2t.private_api.gru_layer`),
  one layer per call so the dropout between layers is an explicit mask;
- `scan_stack` (XLA): the same equations with each layer's time loop lowered to one XLA
  while-loop by `torch_xla.experimental.scan`, so compile time does not grow with T
  (a Python loop over time is unrolled: minutes of compilation at a few hundred steps).

Dropout masks between layers (`keep`) are drawn by the caller, never here: inside a
compiled graph a random op draws the same numbers at every call. `b2t.model.gru_op` wraps
both kernels as one custom op, so dynamo sees a single node and never cuts the graph.

Why not torch_xla's own scan GRU (`torch_xla.experimental.gru`): its traced step is cached
by input shapes and dtypes but not by the autocast state, so after one call without
autocast (an eval pass, say) a call under bf16 autocast reuses the f32 trace and the
compile fails ("mixed precision is disallowed"), or, in the other order, an f32 call
silently computes in bf16. It also multiplies the 7168-wide input by `weight_ih` inside
the loop, one row block per step. Here the input projection is one matmul over all steps
outside the loop, and the loop body runs with autocast off and explicit dtypes, so its
trace depends only on what the cache key holds.

Shape legend: B batch rows, P time steps (patches), D input width, H hidden units,
L layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from b2t.private_api import gru_layer

Carry = dict[str, torch.Tensor]


def _layers(weights: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    if len(weights) % 4:
        raise ValueError(f"expected 4 GRU tensors per layer, got {len(weights)}")
    return [weights[i : i + 4] for i in range(0, len(weights), 4)]


def native_stack(x: torch.Tensor, h0: torch.Tensor, weights: list[torch.Tensor],
                 keep: torch.Tensor | None) -> torch.Tensor:
    """Torch's GRU kernel, layer by layer: (B, P, D), (L, B, H) -> (B, P, H) in h0's dtype.

    Runs under autocast to x's dtype when that is below h0's (what the trainer's bf16
    autocast does around the model; on the CPU autocast keeps the GRU in f32, on CUDA
    cuDNN computes in bf16). `keep` (L-1, B, P, H): dropout masks between layers, or None.
    """
    low = x.dtype != h0.dtype
    y = x
    with torch.autocast(x.device.type, dtype=x.dtype if low else torch.get_autocast_dtype(x.device.type),
                        enabled=low):
        for layer, params in enumerate(_layers(weights)):
            if layer and keep is not None:
                y = y * keep[layer - 1].to(y.dtype)
            y = gru_layer(y, h0[layer : layer + 1], params)
    return y.to(h0.dtype)


def _layer_of(t: torch.Tensor, i: int) -> torch.Tensor:
    """`t[i]` as a gather, not a view: inside a custom op's kernel (no functionalization) the
    select view of an (n, n, n) input read the wrong elements (measured with L == B == H)."""
    return t.index_select(0, torch.tensor([i], device=t.device)).squeeze(0)


def scan_stack(x: torch.Tensor, h0: torch.Tensor, weights: list[torch.Tensor],
               keep: torch.Tensor | None) -> torch.Tensor:
    """What `native_stack` computes, as one XLA while-loop per layer: (B, P, D) -> (B, P, H).

    Matmuls run in x's dtype; the hidden state stays in h0's dtype (f32) so rounding does
    not pile up over the steps. Autocast is off inside, so the result depends on the
    dtypes alone. Differentiable: scan builds its backward (a reverse while-loop).
    """
    from torch_xla.experimental.scan import scan

    compute = x.dtype
    y = x.transpose(0, 1)  # (P, B, D): scan walks the leading dim
    with torch.autocast(x.device.type, enabled=False):
        for layer, (w_ih, w_hh, b_ih, b_hh) in enumerate(_layers(weights)):
            if layer and keep is not None:
                y = y * _layer_of(keep, layer - 1).transpose(0, 1).to(y.dtype)
            gates_x = F.linear(y.to(compute), w_ih.to(compute))  # (P, B, 3H): all steps in one matmul
            # The carry holds the f32 parameters: the scan sums their gradients over all steps in
            # the carry's dtype (bf16 sums put 2-3% of error into the bias and weight_hh grads).
            carry = {"h": _layer_of(h0, layer), "weight_hh": w_hh, "bias_ih": b_ih, "bias_hh": b_hh}
            _, y = scan(_gru_step, carry, gates_x, is_fn_pure=True)  # (P, B, H)
    return y.transpose(0, 1)  # (B, P, H)


def _gru_step(carry: Carry, gates_x: torch.Tensor) -> tuple[Carry, torch.Tensor]:
    """One time step of torch's GRU equations (gate order r, z, n); weights ride in the carry.

    Module-level and pure so `scan` reuses its trace; the parameters are carried, not
    closed over, because a scan body may not capture tensors.
    """
    h = carry["h"]  # (B, H), carried in full precision
    compute = gates_x.dtype
    gates_x = gates_x + carry["bias_ih"].to(compute)  # (B, 3H)
    gates_h = F.linear(h.to(compute), carry["weight_hh"].to(compute), carry["bias_hh"].to(compute))  # (B, 3H)
    x_r, x_z, x_n = gates_x.chunk(3, dim=1)
    h_r, h_z, h_n = gates_h.chunk(3, dim=1)
    r = torch.sigmoid(x_r + h_r)
    z = torch.sigmoid(x_z + h_z).to(h.dtype)
    n = torch.tanh(x_n + r * h_n).to(h.dtype)
    h_new = n + z * (h - n)  # = (1 - z) * n + z * h
    return {**carry, "h": h_new}, h_new
