"""CleanSpeechModel: reads phonemes from the patches with the noise estimate taken out.

Shape legend: B rows, P patches, D = patch_size * F, H hidden units, C = 41 classes.
"""

from __future__ import annotations

import torch
from torch import nn

from b2t.config import GRUConfig
from b2t.contract import PARAM_DTYPE
from b2t.model.layers import CPU, DayLayer, GRUStack
from b2t.phonemes import N_CLASSES


class CleanSpeechModel(nn.Module):
    """Its own day layer -> patches - noise estimate -> GRU stack -> phoneme logits (C)."""

    def __init__(self, n_days: int, patch_width: int, cfg: GRUConfig, *, device: torch.device = CPU) -> None:
        super().__init__()
        self.day = DayLayer(n_days, device=device)
        self.gru = GRUStack(patch_width, cfg.n_units, cfg.n_layers, cfg.rnn_dropout, device=device)
        self.out = nn.Linear(cfg.n_units, N_CLASSES, device=device, dtype=PARAM_DTYPE)
        nn.init.xavier_uniform_(self.out.weight)

    def hidden(self, x: torch.Tensor, noise: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """GRU states (B, P, H) of patches (B, P, D) minus the noise estimate (B, P, D);
        `keep`: the GRU's between-layer masks."""
        return self.gru(x - noise, keep)
