"""GRUDecoder: the reference's parameters and init, its patch order and day selection, and
the XLA path (same numbers as torch's GRU, no host fallback, one compile per shape, a
graph that does not grow with T)."""

from __future__ import annotations

import math

import pytest
import torch
import torch_xla
import torch_xla.debug.metrics as met

from b2t.config import GRUConfig, ModelConfig
from b2t.contract import FEATURE_DIM
from b2t.model.decoder import CTC_HEAD, GRUDecoder
from b2t.phonemes import N_CLASSES

SMALL = ModelConfig(input_dropout=0.1, gru=GRUConfig(n_units=32, n_layers=2, rnn_dropout=0.1))
N_DAYS = 3
CPU = torch.device("cpu")


def small_model(*, seed: int = 0) -> GRUDecoder:
    torch.manual_seed(seed)
    return GRUDecoder(N_DAYS, SMALL)


def batch(n_rows: int, n_time: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random features (B, T, F) and day ids (B,) with repeats, on the CPU."""
    gen = torch.Generator(device=CPU).manual_seed(seed)
    features = torch.randn(n_rows, n_time, FEATURE_DIM, generator=gen, dtype=torch.float32, device=CPU)
    days = torch.randint(0, N_DAYS, (n_rows,), generator=gen, dtype=torch.int32, device=CPU)
    return features, days


def compile_count() -> int:
    data = met.metric_data("CompileTime")
    return 0 if data is None else data[0]


def fallbacks() -> list[str]:
    return [name for name in met.counter_names() if name.startswith("aten::")]


@pytest.fixture(scope="module")
def baseline() -> GRUDecoder:
    return GRUDecoder(45, ModelConfig())


# --- parameters and init ---------------------------------------------------------------


def test_parameter_count_matches_the_reference_formula(baseline: GRUDecoder) -> None:
    n_feat, size, hidden, layers, days = FEATURE_DIM, 14, 768, 5, 45
    day_layers = days * (n_feat * n_feat + n_feat)
    gru_first = 3 * hidden * (size * n_feat + hidden) + 2 * 3 * hidden  # weight_ih, weight_hh, two biases
    gru_rest = (layers - 1) * (3 * hidden * (hidden + hidden) + 2 * 3 * hidden)
    expected = day_layers + gru_first + gru_rest + hidden + (hidden * N_CLASSES + N_CLASSES)  # + h0 + out
    assert expected == 44_315_177
    assert sum(p.numel() for p in baseline.parameters()) == expected


def test_state_dict_has_the_reference_keys_and_shapes(baseline: GRUDecoder) -> None:
    expected = {
        "day.weight": (45, FEATURE_DIM, FEATURE_DIM),
        "day.bias": (45, 1, FEATURE_DIM),
        "gru.h0": (1, 1, 768),
        "out.weight": (N_CLASSES, 768),
        "out.bias": (N_CLASSES,),
    }
    for k in range(5):
        expected |= {
            f"gru.weight_ih_l{k}": (3 * 768, 14 * FEATURE_DIM if k == 0 else 768),
            f"gru.weight_hh_l{k}": (3 * 768, 768),
            f"gru.bias_ih_l{k}": (3 * 768,),
            f"gru.bias_hh_l{k}": (3 * 768,),
        }
    state = baseline.state_dict()
    assert {k: tuple(v.shape) for k, v in state.items()} == expected
    assert {v.dtype for v in state.values()} == {torch.float32}


def test_init_follows_the_reference() -> None:
    model = small_model()
    hidden = SMALL.gru.n_units
    eye = torch.eye(FEATURE_DIM, dtype=torch.float32, device=CPU)
    assert torch.equal(model.day.weight.detach(), eye.expand(N_DAYS, -1, -1))
    assert not model.day.bias.detach().any()

    def assert_xavier(w: torch.Tensor, fan_in: int, fan_out: int) -> None:
        bound = math.sqrt(6 / (fan_in + fan_out))
        assert 0.8 * bound < w.detach().abs().max() <= bound

    for k in range(SMALL.gru.n_layers):
        w_hh = getattr(model.gru, f"weight_hh_l{k}").detach()  # (3H, H)
        # orthogonal_ on a tall (3H, H) matrix gives orthonormal columns: W^T W = I as a
        # whole (the three gate blocks together, not each block on its own)
        torch.testing.assert_close(w_hh.T @ w_hh, torch.eye(hidden, dtype=torch.float32, device=CPU))
        w_ih = getattr(model.gru, f"weight_ih_l{k}")
        assert_xavier(w_ih, w_ih.shape[1], 3 * hidden)
        for name in ("bias_ih", "bias_hh"):  # torch's default, which the reference keeps
            bias = getattr(model.gru, f"{name}_l{k}").detach()
            assert bias.any() and bias.abs().max() <= 1 / math.sqrt(hidden)
    assert_xavier(model.gru.h0, hidden, hidden)  # a (1, 1, H) tensor has fan_in = fan_out = H
    assert_xavier(model.out.weight, hidden, N_CLASSES)


# --- patching, day selection, lengths (CPU) -------------------------------------------------


def test_output_lengths_use_the_model_patching() -> None:
    n = torch.tensor([0, 13, 14, 17, 18, 126], dtype=torch.int32, device=CPU)
    assert small_model().output_lengths(n).tolist() == [0, 0, 1, 1, 2, 29]


def test_bad_inputs_are_refused_with_the_reason() -> None:
    model = small_model()
    days = torch.zeros(2, dtype=torch.int32, device=CPU)
    with pytest.raises(ValueError, match="features must be"):
        model(torch.zeros(2, 20, 7, dtype=torch.float32, device=CPU), days)
    with pytest.raises(ValueError, match="need at least patch_size=14"):
        model(torch.zeros(2, 13, FEATURE_DIM, dtype=torch.float32, device=CPU), days)
    with pytest.raises(ValueError, match="n_days must be >= 1"):
        GRUDecoder(0, SMALL)


def test_forward_under_cpu_autocast_gives_bf16_logits() -> None:
    x, days = batch(2, 30)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = small_model()(x.bfloat16(), days)[CTC_HEAD]
    assert logits.shape == (2, 5, N_CLASSES) and logits.dtype == torch.bfloat16
    assert torch.isfinite(logits).all()


# --- XLA ------------------------------------------------------------------------------------


def test_xla_scan_gru_equals_torch_gru_in_value_and_gradient() -> None:
    """Same weights, f32, eval: XLA (scan) vs CPU (torch's kernel) agree to 1e-4.

    A bf16-autocast call runs first on purpose: torch_xla's own scan GRU reuses that trace
    for the later f32 call (its cache ignores autocast) and misses by more than 1e-3.
    """
    device = torch_xla.device()
    cpu_model = small_model().eval()
    xla_model = small_model().eval().to(device)
    x, days = batch(4, 30, seed=3)
    with torch.autocast("xla", dtype=torch.bfloat16):
        xla_model(x.to(device), days.to(device))[CTC_HEAD].float().sum().backward()
    xla_model.zero_grad(set_to_none=True)
    torch_xla.sync()

    logits_xla = xla_model(x.to(device), days.to(device))[CTC_HEAD]
    logits_xla.square().mean().backward()
    logits_cpu = cpu_model(x, days)[CTC_HEAD]
    logits_cpu.square().mean().backward()
    torch_xla.sync()
    torch.testing.assert_close(logits_xla.cpu(), logits_cpu, rtol=1e-4, atol=1e-4)
    for (name, p_xla), p_cpu in zip(xla_model.named_parameters(), cpu_model.parameters()):
        torch.testing.assert_close(
            p_xla.grad.cpu(), p_cpu.grad, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}"
        )


def test_xla_step_compiles_once_per_shape_with_no_host_fallback() -> None:
    device = torch_xla.device()
    model = small_model().train().to(device)
    x, days = batch(4, 30)
    x, days = x.bfloat16().to(device), days.to(device)
    n_time_steps = torch.tensor([30, 13, 14, 22], dtype=torch.int32, device=device)
    torch_xla.sync()
    met.clear_all()
    counts = []
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        with torch.autocast("xla", dtype=torch.bfloat16):
            logits = model(x, days)[CTC_HEAD]
        lengths = model.output_lengths(n_time_steps)
        logits.float().square().mean().backward()
        torch_xla.sync()
        counts.append(compile_count())
    assert fallbacks() == []
    assert counts[0] >= 1 and counts[1] == counts[0], f"compilations after each call: {counts}"
    assert logits.dtype == torch.bfloat16 and lengths.cpu().tolist() == [5, 0, 1, 3]
    assert all(p.grad is not None for p in model.parameters())


def test_xla_graph_does_not_grow_with_time() -> None:
    """The recurrence is a while-loop per layer and direction, not unrolled: the traced
    forward+backward has the same number of HLO instructions at T=30 and T=510."""
    device = torch_xla.device()
    model = small_model().train().to(device)
    sizes = []
    for n_time in (30, 510):
        model.zero_grad(set_to_none=True)  # drop the last graph rather than run it
        x, days = (t.to(device) for t in batch(4, n_time))
        torch_xla.sync()  # also materialises the RNG seed, whose pending updates would add ops
        with torch.autocast("xla", dtype=torch.bfloat16):
            logits = model(x, days)[CTC_HEAD]
        logits.float().square().mean().backward()
        hlo = torch_xla._XLAC._get_xla_tensors_hlo([p.grad for p in model.parameters()])
        assert hlo.count(" while(") == 2 * SMALL.gru.n_layers  # forward and backward loops
        sizes.append(len(hlo.splitlines()))
    assert sizes[0] == sizes[1]


def test_the_forward_is_one_graph_without_a_break() -> None:
    """The GRU is one custom op (`b2t::gru_layers`, on the CPU and on XLA), not an
    island: dynamo traces the whole forward as one graph, on the CPU and on the XLA device."""
    x, days = batch(2, 30)
    device = torch_xla.device()
    try:
        for dev in (CPU, device):
            model = small_model().to(dev).eval()
            explained = torch._dynamo.explain(model)(x.to(dev), days.to(dev))
            assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
            assert any("gru_layers" in str(n.target) for n in explained.graphs[0].graph.nodes)
    finally:
        torch._dynamo.reset()
