"""Random masks a model declares and the compiled step draws (`Backend.rng`).

Why declared: under `torch.compile(backend="openxla")` (torch_xla 2.9) a dropout drawn
inside the compiled graph used the same mask every step (`b2t.xla_workarounds`:
openxla-rng-in-graph), and drawing outside costs one more graph per bucket. So a model lists
the masks it needs (`dropout_masks(n_rows, n_time)`), the step draws uniforms for each one
(from the step's seed tensor under openxla, `b2t.engine.rng`), and the model multiplies by it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from b2t.contract import COMPUTE_DTYPE


@dataclass(frozen=True)
class DropoutMask:
    """An inverted-dropout mask of `shape`: each element 0 with probability `p`, else 1/(1-p)."""

    shape: tuple[int, ...]
    p: float

    def draw(self, uniform: torch.Tensor) -> torch.Tensor:
        """The mask in the compute dtype from uniform [0, 1) draws of `shape`."""
        if tuple(uniform.shape) != self.shape:
            raise ValueError(f"mask of shape {self.shape} drawn from uniforms of shape {tuple(uniform.shape)}")
        return (uniform >= self.p).to(COMPUTE_DTYPE) / (1.0 - self.p)
