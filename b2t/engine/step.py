"""The one step function, compiled per backend: forward + CTC under one dtype policy.

Layout of a step (B rows, T bins, P = patches, C = 41 classes):
  compiled [augment + dropout masks (the step's draws) -> forward + loss + objective]
  -> compiled backward -> (every grad_accum micro-batches) clip, schedule, AdamW -> sync
Under openxla that is one dynamo forward graph and one backward graph per bucket, with
the GRU and CTC recurrences inside them as custom ops (b2t/model/gru_op.py, ctc_op.py),
and the update as one lazy graph shared by all buckets. Nothing in a step reads a value
back to the host: losses accumulate on the device and the loop reads them every
`log_every` steps.

The model is any family of `b2t.model.registry`: it returns named CTC heads, each gets its
own CTC loss (per row, averaged over valid rows; the objective is their sum weighted by
the model's `loss_weights`), and its `decode_head` is what evaluation decodes. The random
masks it declares are drawn inside the compiled region from the step's draws
(`Backend.rng`), and its per-step `schedule` and loss weights are uploaded as (1,) tensors.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from b2t.config import Config
from b2t.contract import LOSS_DTYPE, Batch
from b2t.engine.augment import augment
from b2t.engine.backend import Backend
from b2t.engine.checkpoint import load_checkpoint
from b2t.engine.device_state import start_training_state
from b2t.engine.optim import make_optimizer, set_lrs
from b2t.engine.rng import Rng, Stream
from b2t.model.ctc import ctc_loss
from b2t.model.masks import DropoutMask
from b2t.model.registry import build_model

TOTAL = "total"
"""The name of the summed loss among the per-head losses `take_losses` returns."""


class Stepper:
    """Owns the compiled train and eval functions of one run."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, backend: Backend, cfg: Config,
                 forward: nn.Module | None = None):
        """`optimizer`: None for evaluation only (no gradients or AdamW state are allocated).
        `forward`: the module whose call runs `model`'s forward, e.g. its DistributedDataParallel
        wrapper (which all-reduces gradients in backward); default `model` itself."""
        self.model, self.optimizer, self.backend, self.cfg = model, optimizer, backend, cfg
        self.forward = model if forward is None else forward
        self.compute = backend.compute_dtype(cfg.train.compute_dtype)  # resolved once per run
        self.lrs: dict[str, float] = {}  # the learning rates the last update set, by parameter group
        self._train_fn = backend.compile(self._forward_loss)
        self._eval_fn = backend.compile(self._forward_eval)
        self._log_probs_fn = backend.compile(functools.partial(self._forward_eval, log_probs=True))
        self._loss_totals = self._zero_totals()
        if optimizer is not None:
            start_training_state(model, optimizer, backend)
            self._grad_seed = backend.upload(1.0 / cfg.train.grad_accum, shape=())  # d(objective / grad_accum)
        backend.shard(model, optimizer)

    def _heads_and_nll(self, features: Tensor, n_time_steps: Tensor, seq_class_ids: Tensor,
                       phone_seq_lens: Tensor, day_indices: Tensor, seed: Tensor | None = None,
                       schedule: dict[str, Tensor] | None = None, *,
                       heads_wanted: tuple[str, ...] | None = None) -> tuple[dict[str, Tensor], dict[str, Tensor], Tensor]:
        """Logits of every head (B, P, C), the per-row CTC loss (B,) f32 of each head in
        `heads_wanted` (default all), output lengths (B,).

        With `seed` ((1,) int32): training augmentation and the model's dropout masks, drawn
        inside the compiled region (`Backend.rng`); without it evaluation augmentation
        (smoothing only) and no masks.
        """
        rng = None if seed is None else self.backend.rng(seed)
        features, n_time_steps = augment(features, n_time_steps, self.cfg.augment, train=rng is not None, rng=rng)
        masks = None if rng is None else _drawn(self.model.dropout_masks(*features.shape[:2]), rng)
        with self.backend.autocast(self.compute):
            heads = self.forward(features, day_indices, masks, schedule, heads_wanted)  # {head: (B, P, C)} bf16 or f32
        out_lens = self.model.output_lengths(n_time_steps)  # (B,) int32
        return heads, _ctc_per_head(heads, seq_class_ids, out_lens, phone_seq_lens), out_lens

    def _forward_loss(self, features: Tensor, n_time_steps: Tensor, seq_class_ids: Tensor, phone_seq_lens: Tensor,
                      day_indices: Tensor, valid: Tensor, seed: Tensor, schedule: dict[str, Tensor],
                      weights: dict[str, Tensor]) -> dict[str, Tensor]:
        """Mean CTC loss of each head over the batch's valid rows (padding rows weigh nothing)
        and the objective (the losses weighted by `weights`, (1,) each) under `TOTAL`."""
        _, nll, _ = self._heads_and_nll(features, n_time_steps, seq_class_ids, phone_seq_lens, day_indices,
                                        seed, schedule)
        weight = valid.to(LOSS_DTYPE)
        rows = weight.sum().clamp(min=1.0)
        losses = {name: (loss * weight).sum() / rows for name, loss in nll.items()}
        return {TOTAL: sum((weights[name] * loss).sum() for name, loss in losses.items()), **losses}

    def _forward_eval(self, features: Tensor, n_time_steps: Tensor, seq_class_ids: Tensor, phone_seq_lens: Tensor,
                      day_indices: Tensor, log_probs: bool = False) -> tuple[Tensor, ...]:
        """The decode head's per-row CTC loss, greedy frame ids (B, P) and output lengths; with
        `log_probs` also its (B, P, C) f32 log-probabilities a word beam search reads."""
        head = self.model.decode_head
        heads, nll, out_lens = self._heads_and_nll(features, n_time_steps, seq_class_ids, phone_seq_lens, day_indices,
                                                   heads_wanted=(head,))
        logits = heads[head]
        out = (nll[head], logits.argmax(-1).to(torch.int32), out_lens)
        return (*out, logits.to(LOSS_DTYPE).log_softmax(-1)) if log_probs else out

    def _inputs(self, batch: Batch, step: int | None = None, micro: int = 0) -> dict[str, Any]:
        """The compiled functions' inputs, placed by the backend (sharded over its mesh).

        With `step` (training): also `valid`, the model's `schedule` values and loss weights
        at `step`, and the step's seed, all uploaded (`Backend.upload`); the seed seeds every
        random draw of the step, so a resumed run draws what an unbroken one did.
        """
        t = self.backend.place(batch.tensors)
        inputs = {k: t[k] for k in ("features", "n_time_steps", "seq_class_ids", "phone_seq_lens", "day_indices")}
        if step is None:
            return inputs
        seed = (self.cfg.train.seed * 1_000_003 + step * 64 + micro) % 2**31
        self.backend.seed(seed)  # torch's RNG, where the backend draws from it
        return {**inputs, "valid": t["valid"], "seed": self.backend.upload(seed, torch.int32),
                "schedule": self.backend.uploads(self.model.schedule(step)),
                "weights": self.backend.uploads(self.model.loss_weights(step))}

    def forward_backward(self, batch: Batch, step: int, micro: int) -> tuple[Tensor, dict[str, Tensor]]:
        """The objective (the heads' losses weighted by `model.loss_weights(step)`) of one
        micro-batch and each head's loss, device scalars; the objective's gradient is added to `.grad`."""
        self.model.train()
        losses = self._train_fn(**self._inputs(batch, step, micro))
        objective = losses.pop(TOTAL)
        objective.backward(self._grad_seed)
        return objective.detach(), {name: loss.detach() for name, loss in losses.items()}

    def trace_graphs(self, batch: Batch, *, train: bool, log_probs: bool = False) -> None:
        """Trace what this bucket's first train step (`train`: its forward and, where it is a
        dynamo graph, backward) or eval step (`log_probs`: the word-decoding one) compiles, as
        the step would, and nothing after: openxla's warm-up compiles those graphs side by side
        meanwhile (`b2t.engine.concurrent_compiles`), then runs its steps. No weight changes; the
        gradients are dropped, as an update drops them."""
        if not train:
            with torch.no_grad():
                self.model.eval()
                (self._log_probs_fn if log_probs else self._eval_fn)(**self._inputs(batch))
            return
        self.model.train()
        losses = self._train_fn(**self._inputs(batch, 1, 0))
        if self.backend.dynamo_backward:
            losses[TOTAL].backward(self._grad_seed)
        self.optimizer.zero_grad(set_to_none=True)

    def update(self, step: int) -> Tensor:
        """Clip, set this step's learning rates, apply AdamW, drop the gradients; returns the grad norm.

        The weights and AdamW's state are donated here (`Backend.donate`), after every forward
        and backward of the step: openxla compiles its forward and backward graphs with whatever
        donors their inputs carry, and the weights are their inputs.

        Gradients live within a step only (`set_to_none`): the next backward makes them anew, so
        no zeroed copy of them is kept between steps. Kept and donated, that copy sat beside the
        step's own gradients, which the update reads after the last backward (docs/parallel.md says
        what that cost the 687M model)."""
        params = self._trained()
        self.backend.donate(self._weights_and_moments())
        clip = self.cfg.optim.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        self.lrs = set_lrs(self.optimizer, step, self.cfg.optim)  # by group, for the loop's log
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm.detach()

    def train_step(self, batches: list[Batch], step: int) -> tuple[Tensor, Tensor]:
        """One optimizer step over `grad_accum` micro-batches; returns (mean total loss, grad norm).

        Under DDP, gradients are all-reduced in the last micro-batch's backward only
        (`no_sync` around the others): the sum is the same, the traffic 1/grad_accum.
        """
        no_sync = getattr(self.forward, "no_sync", contextlib.nullcontext)
        objectives, micro = [], []
        for i, batch in enumerate(batches):
            with no_sync() if i < len(batches) - 1 else contextlib.nullcontext():
                objective, losses = self.forward_backward(batch, step, i)
            objectives.append(objective)
            micro.append(losses)
        norm = self.update(step)
        losses = {name: torch.stack([m[name] for m in micro]).mean() for name in micro[0]}
        loss = torch.stack(objectives).mean()
        for name, value in {TOTAL: loss, **losses}.items():  # inside the step's graph: every step traces the same graph
            self._loss_totals[name] = self._loss_totals[name] + value
        self.backend.sync()
        return loss, norm

    def _trained(self) -> list[nn.Parameter]:
        """The weights this step's backward gave a gradient (after it: the ones AdamW updates)."""
        return [p for p in self.model.parameters() if p.grad is not None]

    def _weights_and_moments(self, params: list[nn.Parameter] | None = None) -> list[Tensor]:
        params = self._trained() if params is None else params
        return [*params, *(t for p in params for t in self.optimizer.state[p].values() if isinstance(t, Tensor))]

    def training_state(self) -> list[Tensor]:
        """Every tensor a train step overwrites, and donates (`Backend.donate`): the weights the
        optimizer trains and their AdamW state (moments, step counts). Gradients are not state:
        each step makes and drops its own (`update`)."""
        return self._weights_and_moments([p for group in self.optimizer.param_groups for p in group["params"]])

    def take_losses(self) -> dict[str, float]:
        """Sums of step losses since the last call (`TOTAL` and each head's): the deliberate
        host read of the loop. The fresh totals are uploads (`Backend.upload`), so the next
        step traces the same graph."""
        values = {name: float(t.cpu()[0]) for name, t in self._loss_totals.items()}  # transfers, no new graph
        self._loss_totals = self._zero_totals()
        return values

    def loss_totals(self) -> list[Tensor]:
        """The device-side loss sums `take_losses` will read (state a step updates)."""
        return list(self._loss_totals.values())

    def _zero_totals(self) -> dict[str, Tensor]:
        return self.backend.uploads(dict.fromkeys((TOTAL, *self.model.heads), 0.0))

    def eval_step(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        return self._evaluate(self._eval_fn, batch)

    def log_probs_step(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """`eval_step` that also returns the (B, P, C) f32 log-probabilities (for word decoding).

        Its own compiled graph per bucket: evaluation runs either this or `eval_step`, so the
        (B, P, C) transfer is paid only when words are decoded.
        """
        return self._evaluate(self._log_probs_fn, batch)

    @torch.no_grad()
    def _evaluate(self, fn: Callable, batch: Batch) -> tuple[Tensor, ...]:
        self.model.eval()
        out = self.backend.gathered(fn(**self._inputs(batch)))
        self.backend.sync()
        return out


def _drawn(declared: dict[str, DropoutMask], rng: Rng) -> dict[str, Tensor]:
    """The model's declared dropout masks drawn from the step's draws, a stream per mask (by name)."""
    return {name: declared[name].draw(rng.uniform(Stream.MASKS + i, declared[name].shape))
            for i, name in enumerate(sorted(declared))}


def _ctc_per_head(heads: dict[str, Tensor], targets: Tensor, out_lens: Tensor, target_lens: Tensor) -> dict[str, Tensor]:
    """Each head's per-row CTC loss (B,) f32 from its logits (B, P, C): one CTC over the heads
    stacked along the rows, so one recurrence (one XLA while-loop) whatever their number."""
    names, k = tuple(heads), len(heads)
    log_probs = torch.cat([heads[n].to(LOSS_DTYPE).log_softmax(-1) for n in names])  # (k*B, P, C) f32
    nll = ctc_loss(log_probs, targets.repeat(k, 1), out_lens.repeat(k), target_lens.repeat(k))
    return dict(zip(names, nll.chunk(k)))


def seeded_model(cfg: Config, n_days: int, backend: Backend, weights: Path | None = None) -> nn.Module:
    """`cfg`'s model for `n_days` sessions, its initial weights seeded by `train.seed` (every run
    of a config starts from the same ones), with a checkpoint's `weights` loaded if given, on the
    backend's device."""
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, n_days)
    if weights is not None:
        load_checkpoint(weights, model)
    return model.to(backend.device)


def make_stepper(cfg: Config, n_days: int, backend: Backend, *, optimizer: bool = True,
                 weights: Path | None = None, model: nn.Module | None = None) -> Stepper:
    """The Stepper of `cfg` on `backend`: its seeded model (`seeded_model`, or `model` as given),
    with AdamW when `optimizer` (else evaluation only). Evaluation, the TPU check and the tools
    step through this; the training loop builds its own (it resumes and wraps the model first)."""
    model = seeded_model(cfg, n_days, backend, weights) if model is None else model
    return Stepper(model, make_optimizer(model, cfg.optim) if optimizer else None, backend, cfg)
