"""The GRU recurrence on XLA: each layer's time loop as one XLA while-loop.

`scan_gru` computes what torch's GRU kernel computes, for the parameters of a
`b2t.model.layers.GRUStack`, with each layer's loop lowered by
`torch_xla.experimental.scan`, so compile time does not grow with T (a Python loop over
time is unrolled: minutes of compilation at a few hundred steps).

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
from torch import nn

Carry = dict[str, torch.Tensor]


def scan_gru(gru: nn.Module, x: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
    """What `gru(x, h0)[0]` computes, as one XLA while-loop per layer: (B, P, D) -> (B, P, H).

    Matmuls run in the autocast dtype when autocast is on (else in the input's dtype);
    the hidden state stays in h0's dtype (f32) so rounding does not pile up over the steps.
    `h0` is (L, B, H). Dropout `gru.dropout` acts between layers in training mode.
    """
    from torch_xla.experimental.scan import scan

    device_type = x.device.type
    compute = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype
    y = x.transpose(0, 1)  # (P, B, D): scan walks the leading dim
    for layer in range(gru.num_layers):
        w_ih = getattr(gru, f"weight_ih_l{layer}").to(compute)
        gates_x = F.linear(y.to(compute), w_ih)  # (P, B, 3H): all steps in one matmul
        # The carry holds the f32 parameters: the scan sums their gradients over all steps in
        # the carry's dtype (bf16 sums put 2-3% of error into the bias and weight_hh grads).
        params = {name: getattr(gru, f"{name}_l{layer}") for name in ("weight_hh", "bias_ih", "bias_hh")}
        with torch.autocast(device_type, enabled=False):
            _, y = scan(_gru_step, {"h": h0[layer], **params}, gates_x, is_fn_pure=True)  # (P, B, H)
        if layer < gru.num_layers - 1:
            y = F.dropout(y, gru.dropout, gru.training)
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
