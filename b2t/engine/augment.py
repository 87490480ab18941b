"""On-device augmentations that keep every batch's shape, so the compiled step never recompiles.

The reference recipe (white noise, a constant offset per trial and channel, a random cut
of 0..max_start_cut bins from the start, Gaussian smoothing along time) changes T when it
cuts. Here the cut is a shift left within the fixed T with each row's length reduced, so
the graph sees one shape per bucket. All randomness comes from the step's draws
(`b2t.engine.rng`: a counter RNG of a per-step seed tensor under openxla, torch's RNG on
the device elsewhere), so augmentation runs inside the compiled step on every backend,
draws new numbers every step, and nothing is read back to the host.

Padding stays padding: bins at and beyond each row's (new) length are zero on return,
both before smoothing (valid bins near the end are smoothed against zeros, in training as
in evaluation) and after it (smoothing would spread signal into the first padding bins).
Shape legend: B rows, T time bins, F features, K kernel taps.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from b2t.config import AugmentConfig, ConfigError
from b2t.engine.rng import Rng, Stream

_TRUNCATE_STDS = 4.0
"""Support of the kernel before thresholding, in stds (as scipy's gaussian_filter1d)."""
_MIN_TAP = 0.01
"""Taps of the normalised kernel at or below this are dropped (the reference's rule)."""


def gaussian_kernel(std: float, device: torch.device | str = "cpu") -> Tensor:
    """The reference's smoothing kernel: (K,) float32, odd K, centred, summing to 1.

    A Gaussian sampled at integer offsets |x| <= round(4 std), normalised; taps not above
    0.01 dropped; normalised again. For std 2 that leaves the 9 taps at |x| <= 4. Computed
    in Python floats (float64) and made on `device` directly, so inside a compiled step it
    is a constant of the device graph, not a CPU tensor the graph would have to fetch.
    """
    if std <= 0:
        raise ConfigError(f"smoothing std must be > 0, got {std} (augment.smooth_std = 0 turns smoothing off)")
    radius = int(_TRUNCATE_STDS * std + 0.5)
    w = [math.exp(-0.5 * (x / std) ** 2) for x in range(-radius, radius + 1)]
    total = sum(w)
    w = [v / total for v in w if v / total > _MIN_TAP]  # the Gaussian is unimodal: the kept taps stay centred
    if not w:
        raise ConfigError(f"smoothing std {std} is too wide: every kernel tap is below {_MIN_TAP}")
    kept = sum(w)
    return torch.tensor([v / kept for v in w], dtype=torch.float32, device=device)


def smooth(features: Tensor, kernel: Tensor) -> Tensor:
    """Convolve every channel along time with `kernel`, keeping length T ('same', zero padded).

    A sum of K shifted slices of the zero-padded features, element-wise in float32 even under
    autocast (a bf16 sum of taps would lose the small features); returns the input dtype.
    Not `F.conv1d`: a depthwise convolution wants time as its major dimension, so on the TPU
    every tensor around it was transposed (tools/compile_parts.py: tens of thousands of LLO
    instructions per copy), and the TPU multiplies an f32 convolution in bf16.
    """
    n_time = features.shape[1]  # (B, T, F)
    K = kernel.numel()
    if K % 2 != 1:
        raise ConfigError(f"smoothing kernel must have an odd length to stay centred, got {K}")
    with torch.autocast(device_type=features.device.type, enabled=False):
        w = kernel.to(device=features.device, dtype=torch.float32)  # (K,)
        x = F.pad(features.to(torch.float32), (0, 0, K // 2, K // 2))  # (B, T + K - 1, F)
        y = w[0] * x[:, :n_time]
        for k in range(1, K):
            y = y + w[k] * x[:, k : k + n_time]
    return y.to(features.dtype)  # (B, T, F)


def _zero_beyond(features: Tensor, n_time_steps: Tensor) -> Tensor:
    T = features.shape[1]
    t = torch.arange(T, dtype=n_time_steps.dtype, device=features.device)
    keep = t[None, :] < n_time_steps[:, None]  # (B, T)
    return features * keep[:, :, None].to(features.dtype)


def shift_start(features: Tensor, n_time_steps: Tensor, cut: Tensor) -> tuple[Tensor, Tensor]:
    """Drop the first `cut[b]` bins of each row by shifting it left within the same T.

    `cut` (B,) holds non-negative integers (not checked: that would be a host sync).
    Returns the shifted features, zero at and beyond each new length, and the new lengths
    `max(n - cut, 0)` in the dtype of `n_time_steps`.
    """
    B, T, _ = features.shape
    cut = cut.to(n_time_steps.dtype)
    t = torch.arange(T, dtype=torch.int64, device=features.device)
    src = (t[None, :] + cut.to(torch.int64)[:, None]).clamp(max=T - 1)  # (B, T) source bin of each bin
    rows = torch.arange(B, dtype=torch.int64, device=features.device)[:, None]  # (B, 1)
    # whole bins, B*T indices: an element-wise gather's (B, T, F) indices cost the TPU compiler
    # seconds of index packing and relayout (tools/compile_parts.py); the values are the same
    shifted = features[rows, src]  # (B, T, F)
    n_new = (n_time_steps - cut).clamp(min=0)
    return _zero_beyond(shifted, n_new), n_new


def augment(features: Tensor, n_time_steps: Tensor, cfg: AugmentConfig, *, train: bool,
            rng: Rng | None = None) -> tuple[Tensor, Tensor]:
    """The reference augmentations on a fixed-shape batch: (B, T, F) features, (B,) lengths.

    Training: white noise per bin and channel, an offset per row and channel, a start cut
    drawn uniformly from 0..max_start_cut per row, then smoothing. Evaluation: smoothing
    only, which is deterministic. Returns features in the input dtype (computed in float32)
    and the new lengths in the dtype of `n_time_steps`. `rng`: the draws (training only).
    """
    B, T, n_feat = features.shape
    if tuple(n_time_steps.shape) != (B,):
        raise ValueError(f"n_time_steps has shape {tuple(n_time_steps.shape)}, "
                         f"expected ({B},) for features {tuple(features.shape)}")
    if train and rng is None:
        raise ValueError("training augmentation needs an rng (the step's draws, Backend.rng)")
    x = features.to(torch.float32)
    n = n_time_steps
    if train:
        if cfg.white_noise_std > 0:
            x = x + cfg.white_noise_std * rng.normal(Stream.NOISE, (B, T, n_feat))
        if cfg.constant_offset_std > 0:
            x = x + cfg.constant_offset_std * rng.normal(Stream.OFFSET, (B, 1, n_feat))
    if train and cfg.max_start_cut > 0:
        cut = rng.integers(Stream.CUT, cfg.max_start_cut + 1, (B,)).to(n.dtype)
        x, n = shift_start(x, n, cut)
    else:
        x = _zero_beyond(x, n)  # noise must not fill the padding
    if cfg.smooth_std > 0:
        x = _zero_beyond(smooth(x, gaussian_kernel(cfg.smooth_std, x.device)), n)
    return x.to(features.dtype), n
