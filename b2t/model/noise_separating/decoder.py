"""NoiseSeparatingDecoder: the three parts joined, with the GRU family's interface and graph shape.

    features -> noise.day -> patches ------> [NoiseModel GRU -> linear] = noise estimate
    features -> clean.day -> patches -> (- noise estimate) -> [clean GRU] -> clean.out -> "clean"
                                     noise estimate -> reversal -> [noisy GRU] -> noisy.out -> "noisy"

Each bracketed GRU is one custom op under torch.compile (`b2t.model.gru_op`), so dynamo
traces the whole model into one graph, as it does the GRU decoder. Objective: CTC(clean)
+ w * CTC(noisy), w and the reversal scale ramped by `schedule` / `loss_weights` (config
`model.noise_separating`).

Dtypes as the GRU decoder: f32 master weights, bf16 compute under the trainer's autocast,
f32 GRU state. Checkpoint keys: `noise.*`, `clean.*`, `noisy.*` (each part's day layer,
GRU with `gru.h0`, output layer).

Shape legend: B rows, T bins, F = 512 features, P patches, D = patch_size * F, C = 41 classes.
"""

from __future__ import annotations

import torch

from b2t.config import ModelConfig
from b2t.contract import FEATURE_DIM
from b2t.model.family import PatchingDecoder
from b2t.model.layers import CPU, GRUStack, check_features, patches
from b2t.model.noise_separating.clean import CleanSpeechModel
from b2t.model.noise_separating.noise import NoiseModel
from b2t.model.noise_separating.noisy import NoisySpeechModel

CLEAN_HEAD, NOISY_HEAD = "clean", "noisy"
PARTS = ("noise", "clean", "noisy")
"""The three parts, by attribute (and checkpoint-key prefix)."""
REVERSAL = "reversal"
"""The `schedule` entry the forward reads: the gradient-reversal scale."""


def ramp(step: int, value: float, warmup_steps: int) -> float:
    """`value` reached linearly from 0 over `warmup_steps` (step 1 is the first optimizer step)."""
    return value if step >= warmup_steps else value * step / warmup_steps


class NoiseSeparatingDecoder(PatchingDecoder):
    """NoiseModel + CleanSpeechModel + NoisySpeechModel (parts `noise`, `clean`, `noisy`).

    Same construction contract as `GRUDecoder`: parameters made on `device` in f32, the
    features' device picks how the GRUs run, `forward` returns named CTC heads, `decode_head`
    is "clean".
    """

    heads = (CLEAN_HEAD, NOISY_HEAD)
    decode_head = CLEAN_HEAD
    input_masks = ("noise_input_keep", "clean_input_keep")

    def __init__(self, n_days: int, cfg: ModelConfig, *, device: torch.device = CPU) -> None:
        super().__init__(cfg)
        parts, width = cfg.noise_separating, cfg.patch_size * FEATURE_DIM
        self.noise = NoiseModel(n_days, width, parts.noise, device=device)
        self.clean = CleanSpeechModel(n_days, width, parts.clean, device=device)
        self.noisy = NoisySpeechModel(width, parts.noisy, device=device)

    def masked_grus(self) -> dict[str, GRUStack]:
        return {f"{part}_rnn_keep": getattr(self, part).gru for part in PARTS}

    def schedule(self, step: int) -> dict[str, float]:
        """The gradient-reversal scale at `step`."""
        c = self.cfg.noise_separating
        return {REVERSAL: ramp(step, c.reversal_scale, c.reversal_warmup_steps)}

    def loss_weights(self, step: int) -> dict[str, float]:
        """CTC(clean) + w * CTC(noisy), w at `step`."""
        c = self.cfg.noise_separating
        return {CLEAN_HEAD: 1.0, NOISY_HEAD: ramp(step, c.noisy_loss_weight, c.noisy_loss_warmup_steps)}

    def forward(self, features: torch.Tensor, day_indices: torch.Tensor,
                masks: dict[str, torch.Tensor] | None = None, schedule: dict[str, torch.Tensor] | None = None,
                heads: tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
        """{"clean": logits (B, P, C), "noisy": logits (B, P, C)} for features (B, T, F) and int32 day ids (B,).

        `masks`: drawn `dropout_masks` (else module dropout); `schedule`: the step's
        `schedule` values as (1,) tensors (without them no reversed gradient is formed);
        `heads`: the heads wanted (default both): evaluation asks for "clean" only, and the
        noisy GRU does not run.
        """
        check_features(features)
        masks, size, stride = masks or {}, self.cfg.patch_size, self.cfg.patch_stride
        noisy = heads is None or NOISY_HEAD in heads
        noise_in = self.input_dropped(self.noise.day(features, day_indices), masks, "noise_input_keep")
        clean_in = self.input_dropped(self.clean.day(features, day_indices), masks, "clean_input_keep")
        noise = self.noise.estimate(patches(noise_in, size, stride), masks.get("noise_rnn_keep"))  # (B, P, D)
        if self.cfg.noise_separating.zero_noise_estimate:  # the ablation without a NoiseModel
            noise = torch.zeros_like(noise)
        clean_h = self.clean.hidden(patches(clean_in, size, stride), noise, masks.get("clean_rnn_keep"))
        out = {CLEAN_HEAD: self.clean.out(clean_h)}  # (B, P, C)
        if noisy:
            reversal = None if schedule is None else schedule[REVERSAL]
            out[NOISY_HEAD] = self.noisy.out(self.noisy.hidden(noise, reversal, masks.get("noisy_rnn_keep")))
        return out
