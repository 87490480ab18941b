"""What a model family is: the interface the trainer, evaluator and planner rely on, and
the parts every family shares.

- `ModelFamily`: the members `b2t.engine.step` (forward, `heads`, `decode_head`,
  `dropout_masks`, `output_lengths`, `schedule`, `loss_weights`), `b2t.evaluate` (through the
  step) and `b2t.plan.memory` (`heads`) use. A family is also an `nn.Module`: the trainer
  moves, shards, checkpoints and switches it between train and eval as one.
- `FamilyConstructor`: how `b2t.model.registry` builds one (`FAMILIES` holds these).
- `PatchingDecoder`: the base both families share: output frames are patches of the day
  layers' output (`cfg.patch_size` bins every `cfg.patch_stride`), so `output_lengths`, the
  input dropout after each day layer and the GRU stacks' between-layer masks are written once.

Shape legend: B batch rows, T time bins, F = 512 features, P patches (output frames),
C = 41 classes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Protocol, runtime_checkable

import torch
from torch import nn

from b2t.buckets import patch_count
from b2t.config import ModelConfig
from b2t.contract import FEATURE_DIM
from b2t.model.layers import CPU, DayLayer, GRUStack, dropped, patch_counts
from b2t.model.masks import DropoutMask


@runtime_checkable
class ModelFamily(Protocol):
    """A model the trainer can train and evaluate, whatever its parts.

    `heads`: the names of its CTC heads, each trained with its own CTC loss (named losses in
    the metrics); `decode_head`: the one validation, `b2t-eval` and the CSV decode.
    """

    heads: ClassVar[tuple[str, ...]]
    decode_head: ClassVar[str]

    def forward(self, features: torch.Tensor, day_indices: torch.Tensor,
                masks: dict[str, torch.Tensor] | None = None, schedule: dict[str, torch.Tensor] | None = None,
                heads: tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
        """{head: logits (B, P, C)} for features (B, T, F) of any float dtype and int32 day
        ids (B,), for the heads in `heads` (default all).

        `masks`: the drawn `dropout_masks` (without them module dropout acts in training
        mode); `schedule`: the `schedule` values as (1,) tensors (device data, so a ramp
        keeps the graph).
        """
        ...

    def dropout_masks(self, n_rows: int, n_time: int) -> dict[str, DropoutMask]:
        """The random masks, by name, the step draws inside its compiled region (from the step's draws) for a
        (B, T) batch and passes in `masks` (`b2t.model.masks`)."""
        ...

    def output_lengths(self, n_time_steps: torch.Tensor) -> torch.Tensor:
        """Output frames (B,) int32 holding real data, from each row's true length (B,)."""
        ...

    def schedule(self, step: int) -> dict[str, float]:
        """Per-step values the forward reads, at optimizer step `step`."""
        ...

    def loss_weights(self, step: int) -> dict[str, float]:
        """{head: weight} at `step`: the objective is the weighted sum of the heads' losses."""
        ...


class FamilyConstructor(Protocol):
    """A family's class: built from the model config and the number of sessions (day layers),
    its f32 parameters made on `device` (`meta` for shapes alone)."""

    def __call__(self, n_days: int, cfg: ModelConfig, *, device: torch.device = CPU) -> ModelFamily:
        ...


class PatchingDecoder(nn.Module, ABC):
    """What both families share: day layers whose output is cut into patches, and GRU stacks.

    A subclass names its masks: `input_masks`, one per day layer, and `masked_grus`, its
    GRU stacks by mask name. The names are part of the numbers: each mask draws from a
    stream picked by its name's sorted position (`b2t.engine.step`).
    """

    input_masks: ClassVar[tuple[str, ...]]

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg

    @property
    def n_days(self) -> int:
        """Sessions the day layers cover (every day layer of a model covers the same)."""
        return next(m.n_days for m in self.modules() if isinstance(m, DayLayer))

    @abstractmethod
    def masked_grus(self) -> dict[str, GRUStack]:
        """The GRU stacks by the name of their between-layer mask (the subclass says which)."""

    def dropout_masks(self, n_rows: int, n_time: int) -> dict[str, DropoutMask]:
        """Input dropout after each day layer and dropout between each GRU's layers, as masks
        the step draws (`b2t.model.masks`): under torch.compile(openxla) a dropout inside the
        graph drew the same mask every step (measured: val PER stuck near 1 while the lazy
        backend learned)."""
        n_patches = patch_count(n_time, self.cfg.patch_size, self.cfg.patch_stride)
        masks = {name: DropoutMask((n_rows, n_time, FEATURE_DIM), self.cfg.input_dropout) for name in self.input_masks}
        for name, gru in self.masked_grus().items():
            masks.update(gru.dropout_masks(name, n_rows, n_patches))
        return masks

    def input_dropped(self, x: torch.Tensor, masks: dict[str, torch.Tensor], name: str) -> torch.Tensor:
        """A day layer's output (B, T, F) times its drawn mask `name` (module dropout without one)."""
        return dropped(x, masks.get(name), self.cfg.input_dropout, self.training)

    def output_lengths(self, n_time_steps: torch.Tensor) -> torch.Tensor:
        """Patches holding real data per row (int32, 0 below one patch), from true lengths (B,)."""
        return patch_counts(n_time_steps, self.cfg.patch_size, self.cfg.patch_stride)
