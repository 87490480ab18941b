"""Model families by name: the one place the trainer, evaluator, planner and importer build a model.

`model.family` in the config picks the family; `model.<family>` holds its sizes. Every
family is a `b2t.model.family.ModelFamily` (the interface the step relies on, written down
there) built by its `FamilyConstructor`.
"""

from __future__ import annotations

import torch

from b2t.config import MODEL_FAMILIES, ModelConfig
from b2t.model.decoder import GRUDecoder
from b2t.model.family import FamilyConstructor, ModelFamily
from b2t.model.layers import CPU
from b2t.model.noise_separating import NoiseSeparatingDecoder

FAMILIES: dict[str, FamilyConstructor] = {"gru": GRUDecoder, "noise_separating": NoiseSeparatingDecoder}
assert tuple(FAMILIES) == MODEL_FAMILIES, "b2t.config.MODEL_FAMILIES and the registry must list the same families"


def build_model(cfg: ModelConfig, n_days: int, *, device: torch.device = CPU) -> ModelFamily:
    """The model of `cfg.family` with `n_days` day layers, made on `device` in f32.

    The same model runs on every device (the recurrences follow their input's device: XLA
    while-loops or torch's kernels), so the parameters, and the checkpoints, are the same.
    """
    return FAMILIES[cfg.family](n_days, cfg, device=device)


def count_parameters(cfg: ModelConfig, n_days: int) -> dict[str, int]:
    """Parameters per top-level part of the model (and "total"), counted on the meta device:
    the real module's shapes, no memory and no init cost."""
    model = build_model(cfg, n_days, device=torch.device("meta"))
    parts: dict[str, int] = {}
    for name, p in model.named_parameters():
        part = name.split(".", 1)[0]
        parts[part] = parts.get(part, 0) + p.numel()
    return {**parts, "total": sum(parts.values())}
