"""Augmentations: the reference kernel exactly, shift-based start cut, fixed shapes, no recompiles."""

import math

import numpy as np
import pytest
import torch
import torch_xla
import torch_xla.debug.metrics as met
from hypothesis import given
from hypothesis import strategies as st

from b2t.config import AugmentConfig
from b2t.engine.augment import augment, gaussian_kernel, shift_start, smooth
from b2t.engine.rng import CounterRng, Stream

OFF = AugmentConfig(white_noise_std=0.0, constant_offset_std=0.0, max_start_cut=0, smooth_std=0.0)


def _reference_kernel(std: float) -> list[float]:
    """Written out independently: scipy-style Gaussian (|x| <= 4 std), normalise, keep > 0.01, normalise."""
    radius = int(4 * std + 0.5)
    g = [math.exp(-(x * x) / (2 * std * std)) for x in range(-radius, radius + 1)]
    total = sum(g)
    kept = [v / total for v in g if v / total > 0.01]
    return [v / sum(kept) for v in kept]


def _rng(seed: int, device: torch.device | str = "cpu") -> CounterRng:
    return CounterRng(torch.tensor([seed], dtype=torch.int32, device="cpu").to(device))


def _batch(B: int, T: int, lengths: list[int], seed: int = 0,
           dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Random features that are zero beyond each row's length, as the contract says."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn((B, T, 6), generator=g, dtype=torch.float32, device="cpu")
    n = torch.tensor(lengths, dtype=torch.int32, device="cpu")
    x = x * (torch.arange(T, dtype=torch.int32, device="cpu")[None, :] < n[:, None])[:, :, None]
    return x.to(dtype), n


def _assert_zero_beyond(x: torch.Tensor, n: torch.Tensor) -> None:
    for row, length in zip(x, n.tolist()):
        assert torch.count_nonzero(row[max(length, 0):]) == 0


def test_kernel_std2_is_the_reference_kernel():
    k = gaussian_kernel(2.0)
    assert k.dtype == torch.float32 and k.shape == (9,)  # taps at |x| <= 4 survive the 0.01 threshold
    expected = torch.tensor(_reference_kernel(2.0), dtype=torch.float32, device="cpu")
    torch.testing.assert_close(k, expected, rtol=0, atol=1e-7)
    assert abs(float(k.sum()) - 1.0) < 1e-6
    assert torch.equal(k, k.flip(0)) and int(k.argmax()) == 4


@pytest.mark.parametrize("std", [0.3, 1.0, 1.5, 3.0, 7.0])
def test_kernel_other_stds_match_the_formula(std):
    expected = _reference_kernel(std)
    k = gaussian_kernel(std)
    assert len(k) == len(expected) and len(k) % 2 == 1
    torch.testing.assert_close(k, torch.tensor(expected, dtype=torch.float32, device="cpu"), rtol=0, atol=1e-7)


def test_kernel_rejects_unusable_stds():
    with pytest.raises(ValueError, match="smooth_std = 0"):
        gaussian_kernel(0.0)
    with pytest.raises(ValueError, match="too wide"):
        gaussian_kernel(50.0)


def test_the_config_refuses_a_std_whose_kernel_is_empty_and_allows_every_other():
    """smooth_std=1e6 hung the warm-up (the kernel was O(std^2) to build), 50 failed after start-up."""
    from b2t.config import MAX_SMOOTH_STD, ConfigError, load_config

    assert gaussian_kernel(MAX_SMOOTH_STD).numel() >= 1
    with pytest.raises(ValueError, match="too wide"):
        gaussian_kernel(39.9)
    for std in (39.9, 1e6):
        with pytest.raises(ConfigError, match=rf"augment.smooth_std={std} must be at most {MAX_SMOOTH_STD} bins"):
            load_config(None, [f"augment.smooth_std={std}"])


def test_smoothing_an_impulse_gives_the_kernel():
    k = gaussian_kernel(2.0)
    x = torch.zeros((2, 21, 3), dtype=torch.float32, device="cpu")
    x[1, 10, 2] = 1.0
    y = smooth(x, k)
    expected = torch.zeros_like(x)
    expected[1, 6:15, 2] = k
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-7)


def test_smoothing_matches_numpy_convolution_with_zero_edges():
    x, _ = _batch(3, 40, [40, 40, 40], seed=1)
    k = gaussian_kernel(1.5)
    y = smooth(x, k)
    for b in range(3):
        for f in range(x.shape[2]):
            ref = np.convolve(x[b, :, f].numpy().astype(np.float64), k.numpy().astype(np.float64), mode="same")
            np.testing.assert_allclose(y[b, :, f].numpy(), ref, atol=1e-6)


def test_smoothing_stays_float32_under_autocast():
    x, _ = _batch(2, 30, [30, 30], seed=5)
    k = gaussian_kernel(2.0)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        y = smooth(x, k)
    assert y.dtype == torch.float32 and torch.equal(y, smooth(x, k))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("train", [True, False])
def test_shapes_and_dtypes_are_kept(dtype, train):
    x, n = _batch(4, 32, [32, 20, 1, 0], dtype=dtype)
    y, m = augment(x, n, AugmentConfig(), train=train, rng=_rng(0))
    assert y.shape == x.shape and y.dtype == dtype
    assert m.shape == n.shape and m.dtype == torch.int32
    _assert_zero_beyond(y, m)


def test_eval_is_deterministic_smoothing_only():
    x, n = _batch(3, 30, [30, 17, 5])
    cfg = AugmentConfig(white_noise_std=5.0, constant_offset_std=5.0, max_start_cut=3, smooth_std=2.0)
    y1, m1 = augment(x, n, cfg, train=False)
    y2, _ = augment(x, n, cfg, train=False)
    assert torch.equal(y1, y2) and torch.equal(m1, n)
    expected = smooth(x, gaussian_kernel(2.0))
    for b, length in enumerate(n.tolist()):
        expected[b, length:] = 0
    torch.testing.assert_close(y1, expected, rtol=0, atol=1e-6)


@given(data=st.data(), B=st.integers(1, 5), T=st.integers(1, 24))
def test_shift_start_moves_each_row_left_by_its_cut(data, B, T):
    lengths = data.draw(st.lists(st.integers(0, T), min_size=B, max_size=B))
    cuts = data.draw(st.lists(st.integers(0, T + 2), min_size=B, max_size=B))
    x, n = _batch(B, T, lengths)
    y, m = shift_start(x, n, torch.tensor(cuts, dtype=torch.int32, device="cpu"))
    assert y.shape == x.shape and m.dtype == torch.int32
    for b, (length, c) in enumerate(zip(lengths, cuts)):
        new = max(length - c, 0)
        assert int(m[b]) == new
        assert torch.equal(y[b, :new], x[b, c:c + new])
        assert torch.count_nonzero(y[b, new:]) == 0


def test_train_start_cut_is_a_shift_within_range():
    max_cut = 3
    x, n = _batch(64, 16, [16] * 32 + [9] * 32, seed=2)
    y, m = augment(x, n, AugmentConfig(white_noise_std=0.0, constant_offset_std=0.0, max_start_cut=max_cut,
                                       smooth_std=0.0), train=True, rng=_rng(0))
    cuts = (n - m).tolist()
    assert set(cuts) == set(range(max_cut + 1))  # 64 rows: every cut 0..3 drawn
    for b, c in enumerate(cuts):
        length = int(m[b])
        assert torch.equal(y[b, :length], x[b, c:c + length])
    _assert_zero_beyond(y, m)


def test_train_noise_has_the_configured_spread():
    B, T, F = 4, 256, 512
    x = torch.zeros((B, T, F), dtype=torch.float32, device="cpu")
    n = torch.tensor([T, T, T, 100], dtype=torch.int32, device="cpu")
    y, m = augment(x, n, AugmentConfig(white_noise_std=0.5, constant_offset_std=0.0, max_start_cut=0,
                                       smooth_std=0.0), train=True, rng=_rng(0))
    assert torch.equal(m, n)
    assert abs(float(y[:3].std()) - 0.5) < 0.01
    _assert_zero_beyond(y, m)

    y, _ = augment(x, n, AugmentConfig(white_noise_std=0.0, constant_offset_std=2.0, max_start_cut=0,
                                       smooth_std=0.0), train=True, rng=_rng(1))
    assert torch.equal(y[:3], y[:3, :1].expand(3, T, F))  # one offset per row and channel, constant in time
    assert abs(float(y[:, 0].std()) - 2.0) < 0.2


def test_train_composition_masks_padding_before_smoothing():
    """Noise, then offset, zeroed beyond the length, smoothed, zeroed again (cut off here)."""
    B, T, F = 3, 24, 6
    x, n = _batch(B, T, [24, 15, 3], seed=4)
    cfg = AugmentConfig(white_noise_std=0.7, constant_offset_std=0.3, max_start_cut=0, smooth_std=2.0)
    y, _ = augment(x, n, cfg, train=True, rng=_rng(11))
    noise = _rng(11).normal(Stream.NOISE, (B, T, F))
    offset = _rng(11).normal(Stream.OFFSET, (B, 1, F))
    valid = (torch.arange(T, dtype=torch.int32, device="cpu")[None, :] < n[:, None])[:, :, None]  # (B, T, 1)
    noisy = x + 0.7 * noise + 0.3 * offset
    expected = smooth(noisy * valid, gaussian_kernel(2.0)) * valid
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-6)


def test_train_draws_are_keyed_by_the_seed_tensor():
    x, n = _batch(2, 20, [20, 12])
    a, na = augment(x, n, AugmentConfig(), train=True, rng=_rng(7))
    b, nb = augment(x, n, AugmentConfig(), train=True, rng=_rng(7))
    c, _ = augment(x, n, AugmentConfig(), train=True, rng=_rng(8))
    assert torch.equal(a, b) and torch.equal(na, nb) and not torch.equal(a, c)
    with pytest.raises(ValueError, match="needs an rng"):
        augment(x, n, AugmentConfig(), train=True)


def test_all_off_is_identity_on_contract_batches():
    x, n = _batch(3, 10, [10, 4, 0])
    for train in (True, False):
        y, m = augment(x, n, OFF, train=train, rng=_rng(0))
        assert torch.equal(y, x) and torch.equal(m, n)


def test_rejects_lengths_that_do_not_fit():
    x, _ = _batch(2, 8, [8, 8])
    with pytest.raises(ValueError, match=r"expected \(2,\)"):
        augment(x, torch.zeros((3,), dtype=torch.int32, device="cpu"), OFF, train=False)


def test_on_xla_compiles_once_and_stays_on_device():
    device = torch_xla.device()
    x, n = _batch(4, 64, [64, 40, 2, 0], dtype=torch.bfloat16)
    xd, nd = x.to(device), n.to(device)
    torch_xla.sync()
    met.clear_all()
    compiles, outputs = [], []
    for step in range(3):
        y, m = augment(xd, nd, AugmentConfig(), train=True, rng=_rng(step, device))
        torch_xla.sync()
        compiles.append((met.metric_data("CompileTime") or [0])[0])
        outputs.append(y.cpu())
    assert compiles == [compiles[0]] * 3, f"augment recompiled on the same shape: {compiles}"
    assert [c for c in met.counter_names() if c.startswith("aten::")] == []
    assert not torch.equal(outputs[0], outputs[1]), "a new seed must draw new numbers"
    assert y.shape == x.shape and y.dtype == torch.bfloat16 and m.dtype == torch.int32
    _assert_zero_beyond(y.cpu(), m.cpu())

    y_eval, _ = augment(xd, nd, AugmentConfig(), train=False)
    torch.testing.assert_close(y_eval.cpu(), augment(x, n, AugmentConfig(), train=False)[0], rtol=0.02, atol=0.02)
    assert [c for c in met.counter_names() if c.startswith("aten::")] == []
