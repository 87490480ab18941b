"""NoiseModel: estimates the non-speech part of every input patch.

Shape legend: B rows, T bins, F = 512 features, P patches, D = patch_size * F, H hidden units.
"""

from __future__ import annotations

import torch
from torch import nn

from b2t.config import GRUConfig
from b2t.contract import PARAM_DTYPE
from b2t.model.layers import CPU, DayLayer, GRUStack


class NoiseModel(nn.Module):
    """Day layer -> patches -> GRU -> linear back to the patch width D.

    The output layer starts at zero, so at init the estimate is 0 and the clean path reads
    the plain patches, as the GRU decoder does; the estimate grows as the losses ask.
    """

    def __init__(self, n_days: int, patch_width: int, cfg: GRUConfig, *, device: torch.device = CPU) -> None:
        super().__init__()
        self.day = DayLayer(n_days, device=device)
        self.gru = GRUStack(patch_width, cfg.n_units, cfg.n_layers, cfg.rnn_dropout, device=device)
        self.out = nn.Linear(cfg.n_units, patch_width, device=device, dtype=PARAM_DTYPE)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def estimate(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """Noise estimate (B, P, D) of patches (B, P, D); `keep`: the GRU's between-layer masks."""
        return self.out(self.gru(x, keep))
