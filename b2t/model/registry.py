"""Model families by name: the one place the trainer, evaluator, planner and importer build a model.

`model.family` in the config picks the family; `model.<family>` holds its sizes. Every
family implements the interface of `GRUDecoder`, which the step relies on:

- `forward(features (B, T, F), day_indices (B,), masks, schedule, heads) -> {head: logits (B, P, C)}`:
  one or more CTC heads (those in `heads`, default all), each trained with its own CTC
  loss (named losses in the metrics);
- `loss_weights(step) -> {head: weight}`: the objective is the weighted sum of the heads'
  losses; `schedule(step) -> {name: value}`: per-step values the forward reads. The step
  uploads both as (1,) tensors, so a ramping value never changes the graph;
- `heads`: the names of those heads; `decode_head`: the one validation, `b2t-eval` and the CSV decode;
- `dropout_masks(n_rows, n_time) -> {name: DropoutMask}`: the random masks the step draws
  inside its compiled region, from the step's draws, and passes in `masks`;
- `output_lengths(n_time_steps (B,)) -> (B,) int32`: frames of each row's true length.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from b2t.config import MODEL_FAMILIES, ModelConfig
from b2t.model.decoder import GRUDecoder
from b2t.model.layers import CPU
from b2t.model.noise_separating import NoiseSeparatingDecoder

FAMILIES: dict[str, Callable[..., nn.Module]] = {"gru": GRUDecoder, "noise_separating": NoiseSeparatingDecoder}
assert tuple(FAMILIES) == MODEL_FAMILIES, "b2t.config.MODEL_FAMILIES and the registry must list the same families"


def build_model(cfg: ModelConfig, n_days: int, xla: bool, *, device: torch.device = CPU) -> nn.Module:
    """The model of `cfg.family` with `n_days` day layers, made on `device` in f32.

    `xla` picks how recurrences run (XLA while-loops or torch's kernels); the parameters,
    and so the checkpoints, are the same either way.
    """
    return FAMILIES[cfg.family](n_days, cfg, xla=xla, device=device)


def count_parameters(cfg: ModelConfig, n_days: int) -> dict[str, int]:
    """Parameters per top-level part of the model (and "total"), counted on the meta device:
    the real module's shapes, no memory and no init cost."""
    model = build_model(cfg, n_days, xla=False, device=torch.device("meta"))
    parts: dict[str, int] = {}
    for name, p in model.named_parameters():
        part = name.split(".", 1)[0]
        parts[part] = parts.get(part, 0) + p.numel()
    return {**parts, "total": sum(parts.values())}
