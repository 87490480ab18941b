"""A step's random draws, by stream: `CounterRng` (pure tensor ops of a seed tensor) and
`TorchRng` (torch's RNG). The backend picks one (`Backend.rng`); both give augmentation
noise and dropout masks through the same three calls.

Why a counter RNG: a random op (torch.rand, dropout) inside a `torch.compile(backend="openxla")`
graph draws the same numbers at every call (the bridge replays the traced RNG state), and
drawing outside the graph costs one more XLA graph per bucket shape. Here each number is
a hash of (seed, stream, element index): the seed is a (1,) int32 device tensor, new every
step (device data, so no recompilation), and the same seed gives the same numbers on every
backend and device. The hash is `lowbias32` (xor-shift-multiply, 32-bit), computed in
int32 with wrapping multiplies and logical shifts of the non-negative bits; good enough
for augmentation noise and dropout masks, not for cryptography.

Both XLA backends (openxla and lazy xla) draw from it: each number depends only on its
element's global index, so under SPMD the draws split over the mesh like any element-wise op
(torch's RNG on XLA is one rng-bit-generator of the whole tensor, which the partitioner keeps
whole on every chip), and a mesh draws what one device does.

Why not everywhere: as eager tensor ops the hash costs dozens of passes over every drawn
element (docs/xla-facts.md, item 15), where torch's RNG is one
kernel. Eager and inductor use `TorchRng`, seeded per step by the trainer, so a resume still
draws what an unbroken run did.
"""

from __future__ import annotations

import enum
import math

import torch
from torch import Tensor

_GOLDEN = -1640531527  # 0x9E3779B9 as int32: spreads consecutive indices and streams
_M1 = 0x7FEB352D
_M2 = -2073254261  # 0x846CA68B as int32


class Stream(enum.IntEnum):
    """Every use of randomness in a step, one stream each (a normal draw uses two)."""

    NOISE = 0  # white noise (and 1)
    OFFSET = 2  # constant offset per row and channel (and 3)
    CUT = 4  # start cut per row
    MASKS = 5  # the model's dropout masks, one stream each from here on


def _i32(v: int) -> int:
    """A Python int wrapped to the int32 range (tensor ops then stay int32)."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def _srl(x: Tensor, k: int) -> Tensor:
    """Logical right shift of int32 bits, 2 <= k <= 31: an arithmetic shift with its copies of
    the sign bit masked off. The shift by a tensor: torch_xla lowers `>>` by a Python int as a
    division, which truncates a negative value where a shift floors (-987654321 >> 16 gave
    -15070 on XLA, -15071 on the CPU); `bitwise_right_shift` by a tensor is XLA's
    shift-right-arithmetic, two instructions where moving the sign bit on its own took six."""
    return torch.bitwise_right_shift(x, torch.full_like(x, k)) & ((1 << (32 - k)) - 1)


def _mix(x: Tensor) -> Tensor:
    x = x ^ _srl(x, 16)
    x = x * _M1
    x = x ^ _srl(x, 15)
    x = x * _M2
    return x ^ _srl(x, 16)


def _flat_index(shape: tuple[int, ...], device: torch.device) -> Tensor:
    """The row-major int32 index of every element of `shape`, as a broadcast sum of one small
    arange per dimension. Not one `arange` of the whole size: torch_xla makes an arange a
    host-built constant of its full size, traced on every trace and written into the HLO as a
    literal (docs/xla-facts.md, item 16), so the first step of a bucket grew with T."""
    if not shape:
        return torch.zeros((), dtype=torch.int32, device=device)
    index, stride = None, 1
    for dim in reversed(range(len(shape))):
        view = [1] * len(shape)
        view[dim] = shape[dim]
        term = torch.arange(shape[dim], dtype=torch.int32, device=device).view(view)
        index = term if index is None else index + term * stride
        stride *= shape[dim]
    return index


def _box_muller(u1: Tensor, u2: Tensor) -> Tensor:
    """Standard normals from two uniform [0, 1) draws of one shape."""
    radius = torch.sqrt(-2.0 * torch.log1p(-u1))  # log(1 - u), u < 1
    return radius * torch.cos(2.0 * math.pi * u2)


class CounterRng:
    """Uniform and normal draws keyed by (seed, stream); `stream` names one use of randomness."""

    def __init__(self, seed: Tensor):
        if seed.dtype != torch.int32 or tuple(seed.shape) != (1,):
            raise ValueError(f"seed must be a (1,) int32 tensor, got {tuple(seed.shape)} {seed.dtype}")
        self.seed = seed

    def bits(self, stream: int, shape: tuple[int, ...]) -> Tensor:
        """int32 hash bits of `shape` for `stream` (streams must differ between uses)."""
        n = math.prod(shape)
        if n >= 2**31:
            raise ValueError(f"{n} draws exceed the 2^31 counter range")
        key = _mix(self.seed * _GOLDEN + _i32(stream * _M1))  # (1,)
        index = _flat_index(shape, self.seed.device)
        return _mix(_mix(index * _GOLDEN ^ key) + key).reshape(shape)

    def uniform(self, stream: int, shape: tuple[int, ...]) -> Tensor:
        """f32 in [0, 1), 24 random bits each."""
        return _srl(self.bits(stream, shape), 8).to(torch.float32) * 2.0**-24

    def normal(self, stream: int, shape: tuple[int, ...]) -> Tensor:
        """f32 standard normal (Box-Muller over streams `stream` and `stream` + 1)."""
        return _box_muller(self.uniform(stream, shape), self.uniform(stream + 1, shape))

    def integers(self, stream: int, high: int, shape: tuple[int, ...]) -> Tensor:
        """int32 uniform in 0..high-1."""
        return (self.uniform(stream, shape) * high).to(torch.int32).clamp(max=high - 1)


class TorchRng:
    """`CounterRng`'s draws from torch's RNG on `device` (seeded by the caller); streams are
    ignored: successive calls draw successive numbers."""

    def __init__(self, device: torch.device):
        self.device = device

    def uniform(self, stream: int, shape: tuple[int, ...]) -> Tensor:
        return torch.rand(shape, dtype=torch.float32, device=self.device)

    def normal(self, stream: int, shape: tuple[int, ...]) -> Tensor:
        """Box-Muller over one uniform draw of (2, *shape), as `CounterRng`. Not `torch.randn`:
        torch_xla draws its normals in pairs split along the first dimension, (B/2, 2, T, F), which
        the TPU compiler relaid in copies of tens of thousands of LLO instructions
        (tools/compile_parts.py)."""
        u = self.uniform(stream, (2, *shape))
        return _box_muller(u[0], u[1])

    def integers(self, stream: int, high: int, shape: tuple[int, ...]) -> Tensor:
        return torch.randint(0, high, shape, dtype=torch.int32, device=self.device)


Rng = CounterRng | TorchRng
