"""The reference GRU phoneme decoder, written so every batch shape compiles to one graph.

Same layers, shapes, init and parameter count as the Brain-to-Text '25 baseline
(`model_training/rnn_model.py`; about 44M parameters with 45 days), with three changes
that keep the step on the device and its shape fixed:

- the per-day input layers are one stacked parameter indexed by the batch's day ids on
  the device (the baseline loops over days in Python and reads each id back to the host);
- patching is built from strided slices instead of `Tensor.unfold`, which
  XLA runs on the host; the element order is the baseline's, so its checkpoints give the
  same logits (`b2t.model.reference` converts them);
- on XLA the GRU runs as one while-loop per layer (`recurrence.scan_layers`), so compile
  time does not grow with T; elsewhere torch's own GRU kernel runs the same parameters.
  Under `torch.compile` it is one custom op (`gru_op`): the forward is one graph, no break.

Checkpoint keys: `day.weight` (n_days, F, F) and `day.bias` (n_days, 1, F) (the baseline
has one key per day), `gru.*` as the baseline's with `gru.h0` for its `h0`, and `out.*`.
The layers are the shared ones of `b2t.model.layers`, the family interface and the parts
every family shares `b2t.model.family`.

Dtypes: parameters are f32 master weights; the trainer sets bf16 autocast around the
forward, so the day layer, the GRU matmuls and the output layer compute in bf16 while the
GRU's hidden state stays f32. The model never sets a dtype policy itself.

Shape legend: B batch rows, T time bins, F = 512 features, P patches, H hidden units,
C = 41 classes.
"""

from __future__ import annotations

import torch
from torch import nn

from b2t.config import ModelConfig
from b2t.contract import FEATURE_DIM, PARAM_DTYPE
from b2t.model.family import PatchingDecoder
from b2t.model.layers import CPU, DayLayer, GRUStack, check_features, patches
from b2t.phonemes import N_CLASSES

CTC_HEAD = "ctc"


class GRUDecoder(PatchingDecoder):
    """Day layer -> patching -> stacked GRU with a learnable initial state -> linear to C classes.

    The device of the features picks how the GRU runs (`layers.GRUStack`); the parameters,
    and so the checkpoints, are the same on every device. Parameters are made on the CPU in
    f32: one seed gives the same weights on every backend; move the model with `.to(device)`.

    A `b2t.model.family.ModelFamily`: one CTC head, decoded; masks `input_keep` after the
    day layer and `rnn_keep` between the GRU's layers.
    """

    heads = (CTC_HEAD,)
    decode_head = CTC_HEAD
    input_masks = ("input_keep",)

    def __init__(self, n_days: int, cfg: ModelConfig, *, device: torch.device = CPU) -> None:
        super().__init__(cfg)
        self.day = DayLayer(n_days, device=device)
        g = cfg.gru
        self.gru = GRUStack(cfg.patch_size * FEATURE_DIM, g.n_units, g.n_layers, g.rnn_dropout, device=device)
        self.out = nn.Linear(g.n_units, N_CLASSES, device=device, dtype=PARAM_DTYPE)
        nn.init.xavier_uniform_(self.out.weight)

    def masked_grus(self) -> dict[str, GRUStack]:
        return {"rnn_keep": self.gru}

    def schedule(self, step: int) -> dict[str, float]:
        """Per-step values the forward reads: none in this family."""
        return {}

    def loss_weights(self, step: int) -> dict[str, float]:
        """The objective is the one head's CTC loss."""
        return {CTC_HEAD: 1.0}

    def forward(self, features: torch.Tensor, day_indices: torch.Tensor,
                masks: dict[str, torch.Tensor] | None = None, schedule: dict[str, torch.Tensor] | None = None,
                heads: tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
        """{"ctc": logits (B, P, C)} for features (B, T, F) of any float dtype and int32 day ids (B,).

        `masks`: ready-made masks for `dropout_masks` (0 or 1/(1-p)); without them (evaluation,
        or a caller that wants module dropout) `nn.functional.dropout` acts in training mode.
        `schedule` and `heads`: this family reads no schedule and has one head (the
        family interface passes both to every family).

        P = (T - patch_size) // patch_stride + 1: the output covers the whole padded T;
        `output_lengths` says how many patches of each row hold real data.
        """
        check_features(features)
        x = self.input_dropped(self.day(features, day_indices), masks or {}, "input_keep")  # (B, T, F)
        x = patches(x, self.cfg.patch_size, self.cfg.patch_stride)  # (B, P, size*F)
        y = self.gru(x, (masks or {}).get("rnn_keep"))  # (B, P, H)
        return {CTC_HEAD: self.out(y)}  # (B, P, C)
