"""NoisySpeechModel: reads phonemes from the noise estimate, through a gradient reversal.

It minimises its CTC loss; the reversal hands the NoiseModel the opposite gradient, so the
NoiseModel learns to leave no phoneme information in its estimate (domain-adversarial
training, with the noise estimate as the "domain").

Shape legend: B rows, P patches, D = patch_size * F, H hidden units, C = 41 classes.
"""

from __future__ import annotations

import torch
from torch import nn

from b2t.config import GRUConfig
from b2t.contract import PARAM_DTYPE
from b2t.model.layers import CPU, GRUStack, reverse_gradient
from b2t.phonemes import N_CLASSES


class NoisySpeechModel(nn.Module):
    """Noise estimate -> gradient reversal -> GRU stack (learnable h0, no day layer) -> logits (C)."""

    def __init__(self, patch_width: int, cfg: GRUConfig, *, device: torch.device = CPU) -> None:
        super().__init__()
        self.gru = GRUStack(patch_width, cfg.n_units, cfg.n_layers, cfg.rnn_dropout, device=device)
        self.out = nn.Linear(cfg.n_units, N_CLASSES, device=device, dtype=PARAM_DTYPE)
        nn.init.xavier_uniform_(self.out.weight)

    def hidden(self, noise: torch.Tensor, reversal: torch.Tensor | None,
               keep: torch.Tensor | None = None) -> torch.Tensor:
        """GRU states (B, P, H) of the noise estimate (B, P, D); `reversal` (1,) is the scale
        of the reversed gradient (None: no gradient reaches the NoiseModel from here); `keep`:
        the GRU's between-layer masks."""
        noise = noise.detach() if reversal is None else reverse_gradient(noise, reversal)
        return self.gru(noise, keep)
