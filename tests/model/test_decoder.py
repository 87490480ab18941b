"""GRUDecoder: the reference's parameters and init, its patch order and day selection, and
the XLA path (same numbers as torch's GRU, no host fallback, one compile per shape, a
graph that does not grow with T)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
import torch_xla
import torch_xla.debug.metrics as met
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.modules.rnn import GRU as TorchGRU

from b2t.buckets import patch_count
from b2t.config import ModelConfig
from b2t.contract import FEATURE_DIM, N_CLASSES
from b2t.model.decoder import GRUDecoder, from_reference_state_dict, patch_counts, patches
from b2t.model.recurrence import gru_weights, make_gru, scan_stack

SMALL = ModelConfig(n_units=32, n_layers=2, input_dropout=0.1, rnn_dropout=0.1)
N_DAYS = 3
CPU = torch.device("cpu")


def small_model(*, xla: bool, seed: int = 0) -> GRUDecoder:
    torch.manual_seed(seed)
    return GRUDecoder(N_DAYS, SMALL, xla=xla)


def batch(n_rows: int, n_time: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random features (B, T, F) and day ids (B,) with repeats, on the CPU."""
    gen = torch.Generator(device=CPU).manual_seed(seed)
    features = torch.randn(n_rows, n_time, FEATURE_DIM, generator=gen, dtype=torch.float32, device=CPU)
    days = torch.randint(0, N_DAYS, (n_rows,), generator=gen, dtype=torch.int32, device=CPU)
    return features, days


def unfold_patches(x: torch.Tensor, size: int, stride: int) -> torch.Tensor:
    """The baseline's patching: unfold over time, then (B, P, size, F) flattened."""
    u = x.unsqueeze(1).permute(0, 3, 1, 2).unfold(3, size, stride)  # (B, F, 1, P, size)
    u = u.squeeze(2).permute(0, 2, 3, 1)  # (B, P, size, F)
    return u.reshape(x.shape[0], u.shape[1], -1)


def reference_state_dict(model: GRUDecoder) -> dict[str, torch.Tensor]:
    """`model`'s weights in the baseline checkpoint's layout (per-day keys, `_orig_mod.` prefix)."""
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("day_")}
    for d in range(model.n_days):
        state[f"day_weights.{d}"] = model.day_weights[d].detach()
        state[f"day_biases.{d}"] = model.day_biases[d].detach()
    return {f"_orig_mod.{k}": v for k, v in state.items()}


def reference_logits(
    state: dict[str, torch.Tensor], cfg: ModelConfig, x: torch.Tensor, days: torch.Tensor
) -> torch.Tensor:
    """The baseline's forward in eval mode, written out: a per-row loop over day weights."""
    state = {k.removeprefix("_orig_mod."): v for k, v in state.items()}
    w = torch.stack([state[f"day_weights.{d}"] for d in days.tolist()])  # (B, F, F)
    b = torch.cat([state[f"day_biases.{d}"] for d in days.tolist()]).unsqueeze(1)  # (B, 1, F)
    x = F.softsign(torch.einsum("btd,bdk->btk", x, w) + b)
    x = unfold_patches(x, cfg.patch_size, cfg.patch_stride)
    gru = TorchGRU(x.shape[2], cfg.n_units, cfg.n_layers, batch_first=True, device=CPU, dtype=torch.float32)
    gru.load_state_dict({k.removeprefix("gru."): v for k, v in state.items() if k.startswith("gru.")})
    h0 = state["h0"].expand(cfg.n_layers, x.shape[0], cfg.n_units).contiguous()
    return F.linear(gru(x, h0)[0], state["out.weight"], state["out.bias"])


def compile_count() -> int:
    data = met.metric_data("CompileTime")
    return 0 if data is None else data[0]


def fallbacks() -> list[str]:
    return [name for name in met.counter_names() if name.startswith("aten::")]


@pytest.fixture(scope="module")
def baseline() -> GRUDecoder:
    return GRUDecoder(45, ModelConfig(), xla=False)


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
        "day_weights": (45, FEATURE_DIM, FEATURE_DIM),
        "day_biases": (45, 1, FEATURE_DIM),
        "h0": (1, 1, 768),
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


def test_backends_build_identical_parameters_from_one_seed() -> None:
    on_cpu, on_xla = small_model(xla=False).state_dict(), small_model(xla=True).state_dict()
    assert on_cpu.keys() == on_xla.keys()
    assert all(torch.equal(on_cpu[k], on_xla[k]) for k in on_cpu)


def test_init_follows_the_reference() -> None:
    model = small_model(xla=False)
    hidden = SMALL.n_units
    eye = torch.eye(FEATURE_DIM, dtype=torch.float32, device=CPU)
    assert torch.equal(model.day_weights.detach(), eye.expand(N_DAYS, -1, -1))
    assert not model.day_biases.detach().any()

    def assert_xavier(w: torch.Tensor, fan_in: int, fan_out: int) -> None:
        bound = math.sqrt(6 / (fan_in + fan_out))
        assert 0.8 * bound < w.detach().abs().max() <= bound

    for k in range(SMALL.n_layers):
        w_hh = getattr(model.gru, f"weight_hh_l{k}").detach()  # (3H, H)
        # orthogonal_ on a tall (3H, H) matrix gives orthonormal columns: W^T W = I as a
        # whole (the three gate blocks together, not each block on its own)
        torch.testing.assert_close(w_hh.T @ w_hh, torch.eye(hidden, dtype=torch.float32, device=CPU))
        w_ih = getattr(model.gru, f"weight_ih_l{k}")
        assert_xavier(w_ih, w_ih.shape[1], 3 * hidden)
        for name in ("bias_ih", "bias_hh"):  # torch's default, which the reference keeps
            bias = getattr(model.gru, f"{name}_l{k}").detach()
            assert bias.any() and bias.abs().max() <= 1 / math.sqrt(hidden)
    assert_xavier(model.h0, hidden, hidden)  # a (1, 1, H) tensor has fan_in = fan_out = H
    assert_xavier(model.out.weight, hidden, N_CLASSES)


# --- patching, day selection, lengths (CPU) -------------------------------------------------


@pytest.mark.parametrize("n_time", [14, 15, 17, 18, 126, 131])
def test_patches_equal_the_reference_unfold_at_baseline_sizes(n_time: int) -> None:
    x, _ = batch(2, n_time)
    assert torch.equal(patches(x, 14, 4), unfold_patches(x, 14, 4))


@given(
    size=st.integers(1, 9),
    stride_frac=st.floats(0, 1),
    extra=st.integers(0, 30),
    n_rows=st.integers(1, 3),
    n_feat=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_patches_equal_the_reference_unfold(size, stride_frac, extra, n_rows, n_feat, seed) -> None:
    stride = 1 + round(stride_frac * (size - 1))
    gen = torch.Generator(device=CPU).manual_seed(seed)
    x = torch.randn(n_rows, size + extra, n_feat, generator=gen, dtype=torch.float32, device=CPU)
    assert torch.equal(patches(x, size, stride), unfold_patches(x, size, stride))


def test_forward_equals_the_baseline_forward_on_its_checkpoint() -> None:
    """Day selection (vs a per-row loop), patch order and h0 expansion, end to end."""
    donor = small_model(xla=False, seed=1)
    with torch.no_grad():  # days that differ, so a wrong day choice shows
        donor.day_weights.add_(0.1 * torch.randn_like(donor.day_weights))
        donor.day_biases.add_(0.1 * torch.randn_like(donor.day_biases))
    state = reference_state_dict(donor)
    model = small_model(xla=False).eval()
    model.load_state_dict(from_reference_state_dict(state))
    x, _ = batch(5, 37)
    days = torch.tensor([2, 0, 2, 1, 0], dtype=torch.int32, device=CPU)
    with torch.no_grad():
        torch.testing.assert_close(model(x, days), reference_logits(state, SMALL, x, days))


def test_reference_state_dict_with_a_missing_day_is_refused() -> None:
    state = reference_state_dict(small_model(xla=False))
    del state["_orig_mod.day_weights.1"]
    with pytest.raises(ValueError, match=r"day_weights\.<d> keys must be numbered 0\.\.n-1"):
        from_reference_state_dict(state)


@pytest.mark.parametrize(("size", "stride"), [(14, 4), (3, 1), (5, 5)])
def test_output_lengths_match_the_bucket_formula(size: int, stride: int) -> None:
    n = torch.arange(0, 80, dtype=torch.int32, device=CPU)
    counts = patch_counts(n, size, stride)
    assert counts.dtype == torch.int32
    assert counts.tolist() == [patch_count(int(k), size, stride) for k in n]


def test_output_lengths_use_the_model_patching() -> None:
    n = torch.tensor([0, 13, 14, 17, 18, 126], dtype=torch.int32, device=CPU)
    assert small_model(xla=False).output_lengths(n).tolist() == [0, 0, 1, 1, 2, 29]


def test_bad_inputs_are_refused_with_the_reason() -> None:
    model = small_model(xla=False)
    days = torch.zeros(2, dtype=torch.int32, device=CPU)
    with pytest.raises(ValueError, match="features must be"):
        model(torch.zeros(2, 20, 7, dtype=torch.float32, device=CPU), days)
    with pytest.raises(ValueError, match="need at least patch_size=14"):
        model(torch.zeros(2, 13, FEATURE_DIM, dtype=torch.float32, device=CPU), days)
    with pytest.raises(ValueError, match="built with xla=True but got features on cpu"):
        small_model(xla=True)(torch.zeros(2, 20, FEATURE_DIM, dtype=torch.float32, device=CPU), days)
    with pytest.raises(ValueError, match="n_days must be >= 1"):
        GRUDecoder(0, SMALL, xla=False)


def test_forward_under_cpu_autocast_gives_bf16_logits() -> None:
    x, days = batch(2, 30)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = small_model(xla=False)(x.bfloat16(), days)
    assert logits.shape == (2, 5, N_CLASSES) and logits.dtype == torch.bfloat16
    assert torch.isfinite(logits).all()


# --- XLA ------------------------------------------------------------------------------------


def test_xla_scan_gru_equals_torch_gru_in_value_and_gradient() -> None:
    """Same weights, f32, eval: XLA (scan) vs CPU (torch's kernel) agree to 1e-4.

    A bf16-autocast call runs first on purpose: torch_xla's own scan GRU reuses that trace
    for the later f32 call (its cache ignores autocast) and misses by more than 1e-3.
    """
    device = torch_xla.device()
    cpu_model = small_model(xla=False).eval()
    xla_model = small_model(xla=True).eval().to(device)
    x, days = batch(4, 30, seed=3)
    with torch.autocast("xla", dtype=torch.bfloat16):
        xla_model(x.to(device), days.to(device)).float().sum().backward()
    xla_model.zero_grad(set_to_none=True)
    torch_xla.sync()

    logits_xla = xla_model(x.to(device), days.to(device))
    logits_xla.square().mean().backward()
    logits_cpu = cpu_model(x, days)
    logits_cpu.square().mean().backward()
    torch_xla.sync()
    torch.testing.assert_close(logits_xla.cpu(), logits_cpu, rtol=1e-4, atol=1e-4)
    for (name, p_xla), p_cpu in zip(xla_model.named_parameters(), cpu_model.parameters()):
        torch.testing.assert_close(
            p_xla.grad.cpu(), p_cpu.grad, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}"
        )


def test_xla_bf16_gradients_stay_close_to_float64() -> None:
    """Under bf16 autocast every GRU gradient is within 1% of float64 over 300 steps.

    The scan sums per-step parameter gradients in its carry's dtype; carrying bf16 copies
    of the weights instead of the f32 parameters put 2-3% into weight_hh and the biases.
    """
    cfg = ModelConfig(n_units=64, n_layers=2, rnn_dropout=0.0)
    torch.manual_seed(0)
    gru = make_gru(256, cfg)
    gen = torch.Generator(device=CPU).manual_seed(0)
    x = torch.randn(8, 300, 256, generator=gen, dtype=torch.float32, device=CPU)
    h0 = 0.1 * torch.randn(cfg.n_layers, 8, cfg.n_units, generator=gen, dtype=torch.float32, device=CPU)
    exact = copy.deepcopy(gru).double()
    exact(x.double(), h0.double())[0].square().mean().backward()

    device = torch_xla.device()
    gru.to(device)
    with torch.autocast("xla", dtype=torch.bfloat16):  # the decoder's input to the GRU is bf16
        y = scan_stack(x.to(device).bfloat16(), h0.to(device), gru_weights(gru), None)
    y.float().square().mean().backward()
    torch_xla.sync()
    for (name, p), p_exact in zip(gru.named_parameters(), exact.parameters()):
        error = (p.grad.cpu().double() - p_exact.grad).norm() / p_exact.grad.norm()
        assert error < 0.01, f"{name}: relative gradient error {error:.4f}"


def test_xla_step_compiles_once_per_shape_with_no_host_fallback() -> None:
    device = torch_xla.device()
    model = small_model(xla=True).train().to(device)
    x, days = batch(4, 30)
    x, days = x.bfloat16().to(device), days.to(device)
    n_time_steps = torch.tensor([30, 13, 14, 22], dtype=torch.int32, device=device)
    torch_xla.sync()
    met.clear_all()
    counts = []
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        with torch.autocast("xla", dtype=torch.bfloat16):
            logits = model(x, days)
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
    model = small_model(xla=True).train().to(device)
    sizes = []
    for n_time in (30, 510):
        model.zero_grad(set_to_none=True)  # drop the last graph rather than run it
        x, days = (t.to(device) for t in batch(4, n_time))
        torch_xla.sync()  # also materialises the RNG seed, whose pending updates would add ops
        with torch.autocast("xla", dtype=torch.bfloat16):
            logits = model(x, days)
        logits.float().square().mean().backward()
        hlo = torch_xla._XLAC._get_xla_tensors_hlo([p.grad for p in model.parameters()])
        assert hlo.count(" while(") == 2 * SMALL.n_layers  # forward and backward loops
        sizes.append(len(hlo.splitlines()))
    assert sizes[0] == sizes[1]


def test_the_forward_is_one_graph_without_a_break() -> None:
    """The GRU is one custom op (not an island): dynamo traces the whole forward, in train
    mode (dropout masks drawn inside) and on both the CPU and the XLA device."""
    x, days = batch(2, 30)
    device = torch_xla.device()
    try:
        for xla, dev in ((False, CPU), (True, device)):
            model = small_model(xla=xla).to(dev).eval()
            explained = torch._dynamo.explain(model)(x.to(dev), days.to(dev))
            assert explained.graph_break_count == 0, explained.break_reasons
            assert explained.graph_count == 1
            assert "b2t.gru_stack" in str(explained.graphs[0].graph) or any(
                "gru_stack" in str(n.target) for n in explained.graphs[0].graph.nodes)
    finally:
        torch._dynamo.reset()
