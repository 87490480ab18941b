"""Shared layers (b2t.model.layers): patching as the baseline's unfold, patch counts as the
bucket formula, the GRU stack's bf16 gradients on XLA against float64."""

from __future__ import annotations

import pytest
import torch
import torch_xla
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.modules.rnn import GRU as TorchGRU

from b2t.buckets import patch_count
from b2t.model.gru_op import gru_stack
from b2t.model.layers import DayLayer, GRUStack, patch_counts, patches

CPU = torch.device("cpu")


def batch_features(n_rows: int, n_time: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator(device=CPU).manual_seed(seed)
    return torch.randn(n_rows, n_time, 512, generator=gen, dtype=torch.float32, device=CPU)


def unfold_patches(x: torch.Tensor, size: int, stride: int) -> torch.Tensor:
    """The baseline's patching: unfold over time, then (B, P, size, F) flattened."""
    u = x.unsqueeze(1).permute(0, 3, 1, 2).unfold(3, size, stride)  # (B, F, 1, P, size)
    u = u.squeeze(2).permute(0, 2, 3, 1)  # (B, P, size, F)
    return u.reshape(x.shape[0], u.shape[1], -1)


@pytest.mark.parametrize("n_time", [14, 15, 17, 18, 126, 131])
def test_patches_equal_the_reference_unfold_at_baseline_sizes(n_time: int) -> None:
    x = batch_features(2, n_time)
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


@given(
    size=st.integers(1, 9),
    stride=st.integers(1, 9),
    extra=st.integers(0, 30),
    seed=st.integers(0, 2**16),
)
def test_patches_gradient_is_the_reference_unfolds(size, stride, extra, seed) -> None:
    """`patches` has its own backward (`layers._Patches`): it must give unfold's gradients,
    also where windows overlap (stride < size) or skip bins (stride > size)."""
    gen = torch.Generator(device=CPU).manual_seed(seed)
    x = torch.randn(2, size + extra, 3, generator=gen, dtype=torch.float64, device=CPU, requires_grad=True)
    grad = torch.randn(patches(x, size, stride).shape, generator=gen, dtype=torch.float64, device=CPU)
    (got,) = torch.autograd.grad(patches(x, size, stride), x, grad)
    (want,) = torch.autograd.grad(unfold_patches(x, size, stride), x, grad)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("size", "stride"), [(14, 4), (3, 1), (5, 5)])
def test_output_lengths_match_the_bucket_formula(size: int, stride: int) -> None:
    n = torch.arange(0, 80, dtype=torch.int32, device=CPU)
    counts = patch_counts(n, size, stride)
    assert counts.dtype == torch.int32
    assert counts.tolist() == [patch_count(int(k), size, stride) for k in n]


def test_day_layer_picks_each_row_s_day_on_the_device():
    layer = DayLayer(3, 4)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(3, 4, 4, generator=torch.Generator(device=CPU).manual_seed(1), device=CPU))
    x = torch.randn(5, 2, 4, generator=torch.Generator(device=CPU).manual_seed(2), device=CPU)
    days = torch.tensor([2, 0, 2, 1, 0], dtype=torch.int32, device=CPU)
    want = torch.stack([torch.nn.functional.softsign(x[i] @ layer.weight[d] + layer.bias[d]) for i, d in
                        enumerate(days.tolist())])
    torch.testing.assert_close(layer(x, days), want)
    with pytest.raises(ValueError, match="n_days must be >= 1"):
        DayLayer(0)


def test_xla_bf16_gradients_stay_close_to_float64() -> None:
    """Under bf16 autocast every GRU gradient is within 1% of float64 over 300 steps.

    The backward sums the per-step parameter gradients in h0's dtype (f32): summed in bf16
    they put 2-3% of error into weight_hh and the biases.
    """
    n_units, n_layers = 64, 2
    torch.manual_seed(0)
    gru = GRUStack(256, n_units, n_layers, 0.0)
    gen = torch.Generator(device=CPU).manual_seed(0)
    x = torch.randn(8, 300, 256, generator=gen, dtype=torch.float32, device=CPU)
    h0 = 0.1 * torch.randn(n_layers, 8, n_units, generator=gen, dtype=torch.float32, device=CPU)
    exact = TorchGRU(256, n_units, n_layers, batch_first=True, device=CPU, dtype=torch.float64)
    exact.load_state_dict({name: getattr(gru, name).detach().double() for name in gru.param_names})
    exact(x.double(), h0.double())[0].square().mean().backward()

    device = torch_xla.device()
    gru.to(device)
    with torch.autocast("xla", dtype=torch.bfloat16):  # the decoder feeds the GRU bf16
        y = gru_stack(x.to(device).bfloat16(), h0.to(device), gru.weights(), None)
    y.float().square().mean().backward()
    torch_xla.sync()
    for name, p_exact in exact.named_parameters():
        p = getattr(gru, name)
        error = (p.grad.cpu().double() - p_exact.grad).norm() / p_exact.grad.norm()
        assert error < 0.01, f"{name}: relative gradient error {error:.4f}"


