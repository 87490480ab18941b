"""The GRU stack's kernels, for the parameters of a `b2t.model.layers.GRUStack`.

Forward, every layer's output:
- `native_layers` (CPU, CUDA): torch's GRU kernel (what `nn.GRU` calls, `b2t.private_api.gru_layer`),
  one layer per call so the dropout between layers is an explicit mask;
- `scan_layers` (XLA): the same equations with each layer's time loop lowered to one XLA
  while-loop by torch_xla's scan, so compile time does not grow with T (a Python loop over
  time is unrolled: minutes of compilation at a few hundred steps).

Backward, `stack_backward` (every device): the gradients from the layers' saved outputs,
without running the forward again. Not scan's own autograd: it saves each step's carry, and
the carry holds the recurrent weight, so its backward kept one copy of weight_hh per time
step (a (T, 3H, H) buffer, larger than a v5e chip for the 687M model, which the TPU compiler refused).

Dropout masks between layers (`keep`) are drawn by the caller, never here: inside a
compiled graph a random op draws the same numbers at every call. `b2t.model.gru_op` wraps
the kernels as custom ops, so dynamo sees a single node and never cuts the graph.

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

from collections.abc import Callable

import torch
import torch.nn.functional as F

from b2t.private_api import gru_layer, scan_no_grad

Carry = dict[str, torch.Tensor]


def _layers(weights: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    if len(weights) % 4:
        raise ValueError(f"expected 4 GRU tensors per layer, got {len(weights)}")
    return [weights[i : i + 4] for i in range(0, len(weights), 4)]


def _native_autocast(x: torch.Tensor, h0: torch.Tensor) -> torch.autocast:
    """Autocast to x's dtype when that is below h0's (what the trainer's bf16 autocast does
    around the model): torch's GRU then computes its gates in bf16 (on the CPU: the matmuls
    and gate activations, with the state in f32; on CUDA cuDNN runs in bf16)."""
    low = x.dtype != h0.dtype
    return torch.autocast(x.device.type, dtype=x.dtype if low else torch.get_autocast_dtype(x.device.type),
                          enabled=low)


def native_layers(x: torch.Tensor, h0: torch.Tensor, weights: list[torch.Tensor],
                  keep: torch.Tensor | None, first_gates: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Torch's GRU kernel, layer by layer: (B, P, D), (L, B, H) -> every layer's output (B, P, H).

    `keep` (L-1, B, P, H): dropout masks applied to each layer's input after the first, or None.
    `first_gates` (P, B, 3H): the first layer's input projection from `input_gates`, given so
    the backward can keep it (the kernel keeps no gates); it goes into torch's kernel as the
    input, with an identity input weight and no input bias: x * 1 + 0 in the kernel's f32
    accumulation is exact, so the outputs are the kernel's own, bit for bit.
    """
    # Time-major and packed, as torch's kernel walks it: batch-first, the kernel would
    # transpose the input itself, and its input projection on that view copies the weight
    # once per step wherever the weight does not require grad (inside a custom op's kernel).
    y, outputs = x.transpose(0, 1).contiguous(), []  # (P, B, D)
    with _native_autocast(x, h0):
        for layer, params in enumerate(_layers(weights)):
            if layer and keep is not None:
                y = y * keep[layer - 1].transpose(0, 1).to(y.dtype)
            if not layer and first_gates is not None:
                y, params = first_gates, _identity_input(params)
            y = gru_layer(y, h0[layer : layer + 1], params)  # (P, B, H)
            outputs.append(y.transpose(0, 1))
    return outputs


def input_gates(x: torch.Tensor, h0: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
    """The first layer's input projection, time-major: (B, P, D) -> (P, B, 3H) in x's dtype,
    the matmul torch's kernel runs for all steps at once (same op, operands and dtypes)."""
    w_ih, _, b_ih, _ = weights[:4]
    with _native_autocast(x, h0):
        return F.linear(x.transpose(0, 1).contiguous(), w_ih, b_ih)


def _identity_input(params: list[torch.Tensor]) -> list[torch.Tensor]:
    """A layer's [w_ih, w_hh, b_ih, b_hh] with w_ih = I (3H, 3H) and b_ih = 0, for an input
    that is already the input projection."""
    w_ih, w_hh, b_ih, b_hh = params
    return [torch.eye(w_ih.shape[0], dtype=w_ih.dtype, device=w_ih.device), w_hh, torch.zeros_like(b_ih), b_hh]


def native_stack(x: torch.Tensor, h0: torch.Tensor, weights: list[torch.Tensor],
                 keep: torch.Tensor | None) -> torch.Tensor:
    """The last of `native_layers`, (B, P, H) in h0's dtype."""
    return native_layers(x, h0, weights, keep)[-1].to(h0.dtype)


def stack_backward(grad: torch.Tensor, x: torch.Tensor, h0: torch.Tensor, weights: list[torch.Tensor],
                   keep: torch.Tensor | None, states: torch.Tensor,
                   first_gates: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Gradients [x, h0, *weights] of <grad, states> from the saved layer outputs `states`, on
    any device (the backward of both forward kernels).

    `states`, `grad` (L, B, P, H): the layer outputs stacked (in h0's dtype) and their
    gradient. Nothing of the forward runs again: each layer's gates are recomputed from its
    input and its saved outputs for all steps at once (two matmuls under the forward's
    autocast; one for the first layer when its input projection `first_gates` (P, B, 3H) was
    kept, which on CPU/CUDA saves the widest matmul of the step, D = 7168), and only the
    recurrence of the state's gradient walks the steps, in h0's dtype (a Python loop on
    CPU/CUDA, one reverse XLA while-loop on XLA). The recurrent weight is loop-invariant: it
    is read by every step, never saved per step.
    """
    layers = _layers(weights)
    d_weights: list[torch.Tensor] = []
    d_h0: list[torch.Tensor] = []
    d_y = _layer_of(grad, len(layers) - 1)
    walk = _walk_scan if x.device.type == "xla" else _walk_loop
    with torch.autocast(x.device.type, enabled=False):
        for layer in reversed(range(len(layers))):
            inp = x if layer == 0 else _masked(_layer_of(states, layer - 1), keep, layer - 1)
            state = _layer_of(states, layer)
            h_prev = torch.cat([_layer_of(h0, layer)[:, None], state[:, :-1]], dim=1)  # (B, P, H): state before each step
            gates = first_gates if layer == 0 else None
            d_in, d_state, grads = _layer_backward(d_y, inp, h_prev, layers[layer], _native_autocast(x, h0), walk, gates)
            d_weights[:0], d_h0[:0] = grads, [d_state]
            if layer:
                d_y = _layer_of(grad, layer - 1) + _masked(d_in, keep, layer - 1)
    return [d_in.to(x.dtype), torch.stack(d_h0), *(g.to(w.dtype) for g, w in zip(d_weights, weights))]


def _masked(t: torch.Tensor, keep: torch.Tensor | None, i: int) -> torch.Tensor:
    return t if keep is None else t * _layer_of(keep, i)


Walk = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def _layer_backward(d_y: torch.Tensor, inp: torch.Tensor, h_prev: torch.Tensor, params: list[torch.Tensor],
                    forward_autocast: torch.autocast, walk: Walk, gates_x: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """One layer: d output (B, P, H), its input (B, P, D), the state before each step (B, P, H),
    its input projection (P, B, 3H) if the forward kept it, else None -> d input (B, P, D) in
    the input's dtype, d initial state (B, H) and d [w_ih, w_hh, b_ih, b_hh] in h_prev's dtype.

    Each gradient of step t is d h_t (g) times a coefficient of the forward's gates, so the
    coefficients are computed for all steps first and `walk` runs only the recurrence
    g = d y_t + carry; d gates_h = g * coefficients; carry = g * z + d gates_h @ w_hh.
    """
    w_ih, w_hh, b_ih, b_hh = params
    B, P, H = h_prev.shape
    acc = h_prev.dtype
    with forward_autocast:  # the gates as the forward computed them (its op order and dtypes)
        gx = F.linear(inp, w_ih, b_ih) if gates_x is None else gates_x.transpose(0, 1)  # (B, P, 3H)
        x_r, x_z, x_n = _gate_blocks(gx)
        h_r, h_z, h_n = _gate_blocks(F.linear(h_prev, w_hh, b_hh))
        r, z = torch.sigmoid(h_r + x_r), torch.sigmoid(h_z + x_z)
        n = torch.tanh(x_n + h_n * r)
    r, z, n, h_n, h_prev, d_y = (t.to(acc).transpose(0, 1) for t in (r, z, n, h_n, h_prev, d_y))  # (P, B, H)
    d_n = (1 - z) * (1 - n * n)  # d h_t / d (n's pre-activation)
    coef = torch.stack([d_n * h_n * r * (1 - r), (h_prev - n) * z * (1 - z), d_n * r], dim=2)  # (P, B, 3, H)
    g_all, d_gates_h, carry = walk(d_y, coef, z, w_hh.to(acc))
    d_gates_x = torch.cat([d_gates_h[:, :, :2], (g_all * d_n)[:, :, None]], dim=2)  # (P, B, 3, H)
    # rows batch-first, as the input lies: the input (D = 7168 wide at the first layer) is never
    # transposed, and its gradient comes out (B, P, D) contiguous; only the 3H-wide gates move.
    # Rows and steps stay two dims, never merged into one (B * P) dim: merging them made the TPU
    # compiler copy the whole input into a new layout first (docs/tpu.md, the GRU backward)
    d_gates_x = d_gates_x.transpose(0, 1).reshape(B, P, 3 * H)
    d_gates_h = d_gates_h.reshape(P, B, 3 * H)
    with forward_autocast:  # the input's matmuls in the forward's compute dtype, as autograd would
        d_w_ih = torch.einsum("bpg,bpd->gd", d_gates_x, inp).to(acc)
        d_in = (d_gates_x @ w_ih).to(inp.dtype)  # the first layer's stays in x's dtype
    # summed over steps and rows as two dims, not one merged (P * B) dim: rows split over a mesh
    # are the minor part of a merged dim, which GSPMD cannot keep split, so it gathered every row
    # and each chip ran the whole product (8x its share on 8 chips, the TPU compiler's cost analysis)
    d_w_hh = torch.einsum("pbg,pbh->gh", d_gates_h, h_prev)
    return d_in, carry, [d_w_ih, d_w_hh, d_gates_x.sum((0, 1)), d_gates_h.sum((0, 1))]


def _gate_blocks(gates: torch.Tensor) -> list[torch.Tensor]:
    """(B, P, 3H) gates -> their r, z, n blocks (B, P, H), as copies, not views: this runs inside
    the backward op's kernel, which gets no functionalization, and there XLA makes a strided
    view (`chunk`) by gathering with an index tensor of the view's size built on the host and
    copied to every device (under openxla on 8 devices, 0.7 GB of host memory per `chunk` for
    the baseline at T=498, and each index a graph argument). The copy is one XLA slice."""
    return torch.split_with_sizes_copy(gates, [gates.shape[2] // 3] * 3, dim=2)


def _walk_loop(d_y: torch.Tensor, coef: torch.Tensor, z: torch.Tensor, w_hh: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The state-gradient recurrence step by step, written in place (CPU, CUDA):
    d_y, z (P, B, H), coef (P, B, 3, H), w_hh (3H, H) -> g (P, B, H), d gates_h (P, B, 3, H), d h0 (B, H)."""
    P, B, H = d_y.shape
    g_all, d_gates_h = torch.empty_like(d_y), torch.empty_like(coef)
    carry = d_y.new_zeros(B, H)
    for t in reversed(range(P)):
        g = torch.add(d_y[t], carry, out=g_all[t])
        torch.mul(g[:, None], coef[t], out=d_gates_h[t])
        carry = torch.addmm(g * z[t], d_gates_h[t].view(B, 3 * H), w_hh)
    return g_all, d_gates_h, carry


def _walk_scan(d_y: torch.Tensor, coef: torch.Tensor, z: torch.Tensor, w_hh: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_walk_loop` as one reverse XLA while-loop (XLA), the weight riding in the carry."""
    carry = {"d_h": d_y.new_zeros(d_y.shape[1:]), "weight_hh": w_hh}
    carry, (g_all, d_gates_h) = scan_no_grad(_state_grad_step, carry, (d_y, coef, z), reverse=True)
    return g_all, d_gates_h, carry["d_h"]


def _state_grad_step(carry: Carry, xs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
                     ) -> tuple[Carry, tuple[torch.Tensor, torch.Tensor]]:
    d_y, coef, z = xs  # (B, H), (B, 3, H), (B, H)
    g = d_y + carry["d_h"]
    d_gates_h = g[:, None] * coef
    d_h = g * z + d_gates_h.flatten(1) @ carry["weight_hh"]
    return {**carry, "d_h": d_h}, (g, d_gates_h)


def _layer_of(t: torch.Tensor, i: int) -> torch.Tensor:
    """`t[i]`; on XLA as a gather, not a view: inside a custom op's kernel (no functionalization)
    the select view of an (n, n, n) input read the wrong elements (measured with L == B == H).
    On CPU/CUDA the view, so the backward's hot path copies nothing."""
    if t.device.type != "xla":
        return t[i]
    return t.index_select(0, torch.tensor([i], device=t.device)).squeeze(0)


def scan_layers(x: torch.Tensor, h0: torch.Tensor, weights: list[torch.Tensor],
                keep: torch.Tensor | None) -> list[torch.Tensor]:
    """What `native_layers` computes, each layer's time loop one XLA while-loop:
    (B, P, D), (L, B, H) -> every layer's output (B, P, H) in h0's dtype.

    Matmuls run in x's dtype; the hidden state stays in h0's dtype (f32) so rounding does
    not pile up over the steps. Autocast is off inside, so the result depends on the
    dtypes alone. No gradient is traced: `stack_backward` is the backward.
    """
    compute = x.dtype
    y, outputs = x.transpose(0, 1), []  # (P, B, D): the scan walks the leading dim
    with torch.no_grad(), torch.autocast(x.device.type, enabled=False):
        for layer, (w_ih, w_hh, b_ih, b_hh) in enumerate(_layers(weights)):
            if layer and keep is not None:
                y = y * _layer_of(keep, layer - 1).transpose(0, 1).to(y.dtype)
            gates_x = F.linear(y.to(compute), w_ih.to(compute), b_ih.to(compute))  # (P, B, 3H): all steps in one matmul
            carry = {"h": _layer_of(h0, layer), "weight_hh": w_hh.to(compute), "bias_hh": b_hh.to(compute)}
            _, y = scan_no_grad(_gru_step, carry, gates_x)  # (P, B, H)
            outputs.append(y.transpose(0, 1))
    return outputs


def _gru_step(carry: Carry, gates_x: torch.Tensor) -> tuple[Carry, torch.Tensor]:
    """One time step of torch's GRU equations (gate order r, z, n); the weight rides in the
    carry (a scan body may not capture tensors). Matmuls in gates_x's dtype, state in h's."""
    h = carry["h"]  # (B, H), carried in full precision
    gates_h = F.linear(h.to(gates_x.dtype), carry["weight_hh"], carry["bias_hh"])  # (B, 3H)
    x_r, x_z, x_n = gates_x.chunk(3, dim=1)
    h_r, h_z, h_n = gates_h.chunk(3, dim=1)
    r = torch.sigmoid(x_r + h_r)
    z = torch.sigmoid(x_z + h_z).to(h.dtype)
    n = torch.tanh(x_n + r * h_n).to(h.dtype)
    h_new = n + z * (h - n)  # = (1 - z) * n + z * h
    return {**carry, "h": h_new}, h_new
