"""The GRU custom op `b2t::gru_layers` against torch's GRU and its autograd (what eager runs),
in value and every gradient, with and without dropout masks: on XLA (the scan forward, the
backward from its saved outputs), lazily and inside `torch.compile(backend="openxla")`; on
the CPU (torch's kernel, the same backward), in f32 and under bf16 autocast."""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch_xla
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.modules.rnn import GRU as TorchGRU

from b2t.model.gru_op import gru_stack
from b2t.model.layers import GRU_PARAM_KINDS

DEVICE = torch_xla.device()


def gru_weights(gru: TorchGRU) -> list[torch.Tensor]:
    """torch's flat weight order: weight_ih, weight_hh, bias_ih, bias_hh per layer."""
    return [getattr(gru, f"{kind}_l{k}") for k in range(gru.num_layers) for kind in GRU_PARAM_KINDS]
CPU = torch.device("cpu")


def _case(B: int, P: int, D: int, H: int, L: int, dropout: bool, seed: int):
    g = torch.Generator(device=CPU).manual_seed(seed)
    torch.manual_seed(seed)
    gru = TorchGRU(D, H, L, batch_first=True, device=CPU)
    x = torch.randn((B, P, D), generator=g, dtype=torch.float32, device=CPU)
    h0 = 0.5 * torch.randn((L, B, H), generator=g, dtype=torch.float32, device=CPU)
    keep = None
    if dropout and L > 1:
        keep = (torch.rand((L - 1, B, P, H), generator=g, device=CPU) >= 0.3).float() / 0.7
    weight = torch.randn((B, P, H), generator=g, dtype=torch.float32, device=CPU)  # a generic loss
    return gru, x, h0, keep, weight


def _outputs(fn, case, device):
    """(output, grad x, grad h0, grad of every weight) of sum(weight * fn(...)) on `device`."""
    gru, x, h0, keep, weight = case
    gru = copy.deepcopy(gru).to(device)
    xs = x.to(device).detach().requires_grad_(True)  # .to(cpu) of a CPU tensor is the tensor itself
    hs = h0.to(device).detach().requires_grad_(True)
    y = fn(xs, hs, gru_weights(gru), None if keep is None else keep.to(device))
    (y * weight.to(device)).sum().backward()
    torch_xla.sync()
    return [t.detach().cpu() for t in (y, xs.grad, hs.grad, *(w.grad for w in gru_weights(gru)))]


def _op(x, h0, weights, keep):
    """The op `gru_stack` is under torch.compile, on any device."""
    return torch.ops.b2t.gru_layers(x, h0, weights, keep)[0][-1]


def _module(x, h0, weights, keep):
    """torch's own multi-layer GRU (no dropout), what eager ran before the op existed."""
    L = h0.shape[0]
    gru = TorchGRU(x.shape[2], h0.shape[2], L, batch_first=True, device=CPU)
    with torch.no_grad():
        for w, p in zip(weights, gru_weights(gru)):
            p.copy_(w)
    y, _ = gru(x, h0)
    return y


@given(st.tuples(st.integers(1, 4), st.integers(1, 12), st.integers(1, 9), st.integers(1, 6), st.integers(1, 3)),
       st.booleans(), st.integers(0, 2**16))
def test_op_kernels_match_torch_gru_in_value_and_every_gradient(shape, dropout, seed):
    case = _case(*shape, dropout, seed)
    eager = _outputs(gru_stack, case, CPU)
    for got, want in zip(_outputs(_op, case, CPU), eager):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for got, want in zip(_outputs(_op, case, DEVICE), eager):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(2, 1, 1, 2, 2), (3, 2, 3, 3, 3)])
def test_an_h0_with_equal_layers_rows_and_units_reads_each_layers_state(shape):
    """L == B == H: selecting a layer's state by a view inside the XLA kernel read the wrong
    elements (found by the property test above), so the kernel gathers it."""
    case = _case(*shape, True, 0)
    for got, want in zip(_outputs(_op, case, DEVICE), _outputs(gru_stack, case, CPU)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_without_masks_it_is_torch_gru():
    case = _case(3, 7, 5, 4, 2, False, 1)
    y_module = _module(case[1], case[2], gru_weights(case[0]), None)
    torch.testing.assert_close(gru_stack(case[1], case[2], gru_weights(case[0]), None), y_module, rtol=0, atol=0)


@pytest.mark.parametrize(("layers", "loops"), [(2, 4), (5, 10)])
def test_inside_openxla_matches_the_lazy_scan_of_one_time_loop_per_layer_each_way(layers, loops):
    """Lazily and inside openxla, the values and gradients of torch's GRU; each layer's time
    steps are one while-loop in the forward and one in the backward (the layers unrolled: a loop
    over the layers stacked their weights each step, 2 GiB more temp per chip for the 687M model)."""
    case = _case(3, 9, 6, 5, layers, True, 3)
    lazy = _outputs(gru_stack, case, DEVICE)
    try:
        compiled = _outputs(torch.compile(gru_stack, backend="openxla"), case, DEVICE)
    finally:
        torch._dynamo.reset()
    for got, want in zip(compiled, lazy):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    for got, want in zip(lazy, _outputs(gru_stack, case, CPU)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert _while_loops(gru_stack, case) == loops


def _forward_on_xla(B: int, P: int, D: int, H: int, L: int):
    """x, h0, weights and dropout masks of a case on the XLA device, and the op's forward outputs
    (states, gates): what its backward kernel takes. Call under no_grad."""
    gru, x, h0, keep, _ = _case(B, P, D, H, L, True, 0)
    weights = [w.to(DEVICE) for w in gru_weights(gru)]
    x, h0, keep = x.to(DEVICE), h0.to(DEVICE), keep.to(DEVICE)
    return x, h0, weights, keep, *torch.ops.b2t.gru_layers(x, h0, weights, keep)


def test_the_backward_kernel_on_xla_copies_nothing_the_size_of_an_activation_to_the_device():
    """The backward op's kernel runs without functionalization, where XLA made each strided view
    (a `chunk` of the gates) by gathering with a host-built index tensor of the view's size,
    copied to every device: host memory and graph arguments that grew with B x P x H (under
    openxla on an 8-device mesh, 0.7 GB per chunk for the baseline at T=498)."""
    import torch_xla.debug.metrics as met

    B, P, D, H, L = 4, 64, 6, 32, 2
    with torch.no_grad():
        x, h0, weights, keep, states, gates = _forward_on_xla(B, P, D, H, L)
        grad = torch.ones_like(states)
        torch_xla.sync()

        def outbound() -> float:
            data = met.metric_data("OutboundData")
            return 0.0 if data is None else data[1]

        before = outbound()
        dx, dh0, dweights = torch.ops.b2t.gru_layers_backward(grad, x, h0, weights, keep, states, gates)
        copied = outbound() - before
        torch_xla.sync()
    print(f"bytes copied to the device by the backward kernel: {copied:.0f} (one activation: {B * P * H * 4})")
    assert copied < B * P * H * 4
    assert dx.shape == x.shape and dh0.shape == h0.shape and len(dweights) == len(weights)


def test_the_weight_gradients_on_xla_sum_over_rows_and_steps_as_two_dims():
    """Each weight gradient contracts rows and steps as two dims, never one merged (B * P) dim:
    merged, the TPU compiler first copied the whole layer input into another layout (docs/tpu.md:
    the baseline's largest kernel to compile), and on a mesh GSPMD gathered the rows it splits."""
    B, P, D, H, L = 3, 5, 7, 4, 2
    with torch.no_grad():
        x, h0, weights, keep, states, gates = _forward_on_xla(B, P, D, H, L)
        _, _, dweights = torch.ops.b2t.gru_layers_backward(torch.ones_like(states), x, h0, weights, keep,
                                                           states, gates)
        hlo = torch_xla._XLAC._get_xla_tensors_hlo(dweights)
    products = [line.strip() for line in hlo.splitlines() if re.search(rf"= f32\[{3 * H},({D}|{H})\]\S* dot\(", line)]
    assert len(products) == 2 * L  # weight_ih's and weight_hh's of each layer
    for line in products:
        assert "lhs_contracting_dims={0,1}" in line, f"a weight gradient over one merged dim: {line[:160]}"


@pytest.mark.parametrize("shape", [(3, 7, 5, 4, 2), (4, 12, 9, 6, 3)])
def test_the_cpu_ops_bf16_gradients_are_as_close_to_f32_as_torchs_own(shape):
    """Under bf16 autocast the forward is torch's kernel (equal values); the gradients come
    from the saved outputs, not from torch's bf16 autograd, so they differ from eager's by
    bf16 rounding: each is at least about as close to the f32 gradient as eager's is."""
    case = _case(*shape, True, 0)

    def in_bf16(fn):
        def run(x, h0, weights, keep):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return fn(x.to(torch.bfloat16), h0, weights, keep)
        return run

    f32 = _outputs(lambda x, h0, weights, keep: gru_stack(x.to(torch.bfloat16).float(), h0, weights, keep), case, CPU)
    eager, op = _outputs(in_bf16(gru_stack), case, CPU), _outputs(in_bf16(_op), case, CPU)
    torch.testing.assert_close(op[0], eager[0], rtol=0, atol=0)
    for i, (got, theirs, want) in enumerate(zip(op, eager, f32)):
        error, their_error = ((t - want).abs().max() / want.abs().max() for t in (got, theirs))
        assert error <= 1.5 * their_error + 1e-3, (i, float(error), float(their_error))


def test_compiled_on_the_cpu_it_is_one_graph_with_the_eager_values_and_gradients():
    """Under torch.compile on the CPU the stack is `b2t::gru_layers` inside dynamo's graph (AOTAutograd,
    no codegen), with eager's values and gradients."""
    case = _case(3, 9, 6, 5, 2, True, 3)
    _, x, h0, keep, _ = case
    try:
        explained = torch._dynamo.explain(gru_stack)(x, h0, gru_weights(case[0]), keep)
        assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
        assert any("gru_layers" in str(n.target) for n in explained.graphs[0].graph.nodes)
        compiled = _outputs(torch.compile(gru_stack, backend="aot_eager"), case, CPU)
    finally:
        torch._dynamo.reset()
    for got, want in zip(compiled, _outputs(gru_stack, case, CPU)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_cpu_kernel_projects_the_input_of_all_steps_in_one_matmul():
    """Inside the op's kernel the weights do not require grad, and inductor hands it a view
    with padded rows (the patches' slice): torch's GRU on that input batch-first broadcast
    the input weight to every step (a bmm over a copy of it per step, three quarters of
    inductor's CPU step on the tiny config); time-major and packed it is one matmul."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from b2t.model.recurrence import native_layers

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    gru, x, h0, keep, _ = _case(3, 7, 5, 4, 2, True, 0)
    padded = torch.nn.functional.pad(x, (0, 3))[:, :, :5]  # (B, P, D) with row stride D + 3
    weights = [w.detach() for w in gru_weights(gru)]
    with torch.no_grad(), Ops() as ops:
        got = native_layers(padded, h0, weights, keep)[-1]
    assert "bmm" not in ops.seen, sorted(ops.seen)
    torch.testing.assert_close(got, gru_stack(x, h0, weights, keep), rtol=0, atol=0)


def _while_loops(fn, case) -> int:
    """While-loops in the XLA graph of fn's output and every gradient."""
    gru, x, h0, keep, weight = case
    gru = copy.deepcopy(gru).to(DEVICE)
    xs, hs = x.to(DEVICE).requires_grad_(True), h0.to(DEVICE).requires_grad_(True)
    y = fn(xs, hs, gru_weights(gru), keep.to(DEVICE))
    (y * weight.to(DEVICE)).sum().backward()
    hlo = torch_xla._XLAC._get_xla_tensors_hlo([y, xs.grad, hs.grad, *(w.grad for w in gru_weights(gru))])
    torch_xla.sync()
    return hlo.count(" while(")
