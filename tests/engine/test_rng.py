"""The step's random draws: the counter RNG is a pure function of (seed, stream, index),
the same on the host and on XLA; torch's RNG, reseeded, repeats itself; each backend gets
the one its compiled graphs can use (on XLA one a mesh splits by rows)."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch_xla

from b2t.engine.backend import make_backend
from b2t.engine.rng import CounterRng, TorchRng


def _seed(value: int, device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.tensor([value], dtype=torch.int32).to(device)


def test_counter_draws_depend_on_seed_and_stream_only_and_match_on_xla():
    a, b = CounterRng(_seed(7)), CounterRng(_seed(7, torch_xla.device()))
    torch.testing.assert_close(a.uniform(3, (4, 5)), b.uniform(3, (4, 5)).cpu(), rtol=0, atol=0)
    assert not torch.equal(a.uniform(3, (4, 5)), a.uniform(4, (4, 5)))
    assert not torch.equal(a.uniform(3, (4, 5)), CounterRng(_seed(8)).uniform(3, (4, 5)))


def _lowbias32(x: int) -> int:
    """The counter RNG's mixing function in unsigned 32-bit arithmetic."""
    for shift, mult in ((16, 0x7FEB352D), (15, 0x846CA68B)):
        x = ((x ^ (x >> shift)) * mult) & 0xFFFFFFFF
    return x ^ (x >> 16)


@pytest.mark.parametrize("device", ["cpu", "xla"])
def test_counter_bits_are_the_unsigned_hash_of_seed_stream_and_index(device):
    """Written with Python's unsigned integers, so any change to the draws (a faster shift, a
    reordered mix) fails here unless it keeps every bit, on the host and on XLA."""
    seed, stream, n = 123456789, 6, 4096
    golden = 0x9E3779B9
    key = _lowbias32((seed * golden + stream * 0x7FEB352D) & 0xFFFFFFFF)
    want = [_lowbias32((_lowbias32(((i * golden) & 0xFFFFFFFF) ^ key) + key) & 0xFFFFFFFF) for i in range(n)]
    dev = torch_xla.device() if device == "xla" else torch.device("cpu")
    got = CounterRng(_seed(seed, dev)).bits(stream, (n,)).cpu().tolist()
    assert [g & 0xFFFFFFFF for g in got] == want
    assert any(g < 0 for g in got)  # the sign bit was set, so the logical shifts were tested


def test_a_counter_draw_is_the_flat_draw_of_its_size_reshaped():
    rng = CounterRng(_seed(11))
    flat = rng.bits(2, (3 * 4 * 5,))
    for shape in [(3, 4, 5), (12, 5), (60, 1), (1, 3, 20)]:
        assert torch.equal(rng.bits(2, shape), flat.reshape(shape))
    assert rng.bits(2, ()).shape == () and torch.equal(rng.bits(2, ()), rng.bits(2, (1,))[0])


def test_a_counter_draw_on_xla_holds_no_constant_of_its_full_size():
    """torch_xla builds an arange as a host constant of its whole size: one per draw of
    (B, T, F) made the first step of a bucket grow with T. The index is a sum of small ones."""
    shape = (4, 1022, 512)
    hlo = torch_xla._XLAC._get_xla_tensors_hlo([CounterRng(_seed(3, torch_xla.device())).normal(0, shape)])
    sizes = [math.prod(int(d) for d in dims.split(",") if d)
             for dims in re.findall(r"= \w+\[([\d,]*)\]\S* constant\(", hlo)]
    assert sizes and max(sizes) <= max(shape)


def test_counter_uniforms_cover_the_unit_interval_and_normals_are_standard():
    rng = CounterRng(_seed(1))
    u = rng.uniform(0, (200_000,))
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0
    assert float(u.mean()) == pytest.approx(0.5, abs=0.01)
    z = rng.normal(1, (200_000,))
    assert float(z.mean()) == pytest.approx(0.0, abs=0.01) and float(z.std()) == pytest.approx(1.0, abs=0.01)
    k = rng.integers(3, 5, (10_000,))
    assert k.dtype == torch.int32 and set(k.tolist()) == {0, 1, 2, 3, 4}


def test_counter_rng_refuses_a_seed_that_is_not_one_int32():
    with pytest.raises(ValueError, match=r"\(1,\) int32"):
        CounterRng(torch.tensor([1, 2], dtype=torch.int32))


def test_torch_draws_repeat_after_the_same_seed():
    backend = make_backend("eager", "cpu")
    rng = backend.rng(_seed(5))
    backend.seed(5)
    first = (rng.normal(0, (3, 4)), rng.integers(1, 9, (6,)))
    backend.seed(5)
    for got, want in zip((rng.normal(0, (3, 4)), rng.integers(1, 9, (6,))), first):
        assert torch.equal(got, want)


@pytest.mark.parametrize("name", ["xla", "openxla"])
def test_the_xla_backends_draw_with_element_wise_ops_that_a_mesh_splits_by_rows(name):
    """torch's RNG on XLA is one rng-bit-generator of the whole tensor, which GSPMD keeps whole
    on every device (each chip drew every row's masks); the counter hash is element-wise."""
    backend = make_backend(name)
    seed = _seed(1, backend.device)
    drawn = torch_xla._XLAC._get_xla_tensors_hlo([backend.rng(seed).uniform(5, (8, 16, 32))])
    assert "rng-bit-generator" in torch_xla._XLAC._get_xla_tensors_hlo([TorchRng(backend.device).uniform(5, (8, 16, 32))])
    assert "rng-bit-generator" not in drawn and "rng(" not in drawn


@pytest.mark.parametrize(("name", "kind"), [("openxla", CounterRng), ("xla", CounterRng), ("eager", TorchRng)])
def test_only_the_xla_backends_draw_from_the_counter_rng(name, kind):
    backend = make_backend(name, "cpu" if name == "eager" else None)
    assert isinstance(backend.rng(_seed(1, backend.device)), kind)
