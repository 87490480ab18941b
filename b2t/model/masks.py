"""Random masks a model declares and the step draws outside the compiled region.

Why outside: under `torch.compile(backend="openxla")` (torch_xla 2.9) a dropout drawn inside
the compiled graph used the same mask every step (`b2t.xla_workarounds`: openxla-rng-in-graph).
So a model lists the masks it needs (`dropout_masks(n_rows, n_time)`), the step draws each
one on the device from the per-step seed, and the model multiplies by it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from b2t.contract import COMPUTE_DTYPE


@dataclass(frozen=True)
class DropoutMask:
    """An inverted-dropout mask of `shape`: each element 0 with probability `p`, else 1/(1-p)."""

    shape: tuple[int, ...]
    p: float

    def draw(self, device: torch.device) -> torch.Tensor:
        """The mask in the compute dtype, from the device RNG (seeded per step by the trainer)."""
        keep = torch.rand(self.shape, dtype=torch.float32, device=device) >= self.p
        return keep.to(COMPUTE_DTYPE) / (1.0 - self.p)
