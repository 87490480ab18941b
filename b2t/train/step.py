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
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

from b2t.config import Config
from b2t.contract import LOSS_DTYPE, Batch, BucketShape, empty_batch
from b2t.model.ctc import ctc_loss
from b2t.train.augment import augment
from b2t.train.backend import Backend
from b2t.train.mesh import host_copy
from b2t.train.optim import set_lrs, step_count
from b2t.train.rng import Stream


class Stepper:
    """Owns the compiled train and eval functions of one run."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, backend: Backend, cfg: Config,
                 forward: nn.Module | None = None):
        """`optimizer`: None for evaluation only (no gradients or AdamW state are allocated).
        `forward`: the module whose call runs `model`'s forward, e.g. its DistributedDataParallel
        wrapper (which all-reduces gradients in backward); default `model` itself."""
        self.model, self.optimizer, self.backend, self.cfg = model, optimizer, backend, cfg
        self.forward = model if forward is None else forward
        self._train_fn = backend.compile(self._forward_loss)
        self._eval_fn = backend.compile(self._forward_eval)
        self._log_probs_fn = backend.compile(self._forward_log_probs)
        self._loss_totals = self._zero_totals()
        if optimizer is not None:
            # Gradients exist from the start, so the first backward accumulates like every later
            # one: a backward that creates .grad traces a different graph than one that adds to it.
            for p in model.parameters():
                p.grad = self.backend.zeros(p)
            self._init_optimizer_state()
            # the objective's gradient seed as device data (a lazily computed one is one more graph)
            self._grad_seed = backend.replicated(torch.full((), 1.0 / cfg.train.grad_accum, device="cpu"))
        backend.shard(model, optimizer)

    def _init_optimizer_state(self) -> None:
        """Create AdamW's state up front (zero moments, step 0: what its first step would make).

        Otherwise the first step traces a state-creating graph that no later step reuses,
        and restoring a pre-warm-up snapshot would bring that extra graph back.
        """
        for group in self.optimizer.param_groups:
            step_device = None if group.get("capturable") else torch.device("cpu")
            for p in group["params"]:
                if not self.optimizer.state[p]:
                    step = step_count(0.0, bool(group.get("capturable")))
                    self.optimizer.state[p] = {  # uploads: device data like every later state
                        "step": step.to(step_device or p.device),
                        "exp_avg": self.backend.zeros(p),
                        "exp_avg_sq": self.backend.zeros(p),
                    }

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
        masks = None
        if rng is not None:
            B, T, _ = features.shape
            declared = self.model.dropout_masks(B, T)
            masks = {name: declared[name].draw(rng.uniform(Stream.MASKS + i, declared[name].shape))
                     for i, name in enumerate(sorted(declared))}  # a stream per mask, by name
        with self.backend.autocast():
            heads = self.forward(features, day_indices, masks, schedule, heads_wanted)  # {head: (B, P, C)} bf16
        out_lens = self.model.output_lengths(n_time_steps)  # (B,) int32
        names, k = tuple(heads), len(heads)
        # One CTC over the heads stacked along the rows: one recurrence (one XLA while-loop)
        # whatever the number of heads. CTC in f32.
        log_probs = torch.cat([heads[n].to(LOSS_DTYPE).log_softmax(-1) for n in names])  # (k*B, P, C)
        nll = ctc_loss(log_probs, seq_class_ids.repeat(k, 1), out_lens.repeat(k), phone_seq_lens.repeat(k))
        return heads, dict(zip(names, nll.chunk(k))), out_lens

    def _forward_loss(self, features: Tensor, n_time_steps: Tensor, seq_class_ids: Tensor,
                      phone_seq_lens: Tensor, day_indices: Tensor, valid: Tensor,
                      seed: Tensor | None = None, schedule: dict[str, Tensor] | None = None,
                      weights: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
        """Mean CTC loss of each head over the batch's valid rows (padding rows weigh nothing)
        and, given loss `weights` ((1,) each), the objective under `TOTAL`, inside the graph."""
        _, nll, _ = self._heads_and_nll(features, n_time_steps, seq_class_ids, phone_seq_lens, day_indices,
                                        seed, schedule)
        weight = valid.to(LOSS_DTYPE)
        rows = weight.sum().clamp(min=1.0)
        losses = {name: (loss * weight).sum() / rows for name, loss in nll.items()}
        if weights is None:
            return losses
        return {TOTAL: sum((weights[name] * loss).sum() for name, loss in losses.items()), **losses}

    def _forward_eval(self, features: Tensor, n_time_steps: Tensor, seq_class_ids: Tensor,
                      phone_seq_lens: Tensor, day_indices: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The decode head's per-row CTC loss, greedy frame ids (B, P) and output lengths."""
        head = self.model.decode_head
        heads, nll, out_lens = self._heads_and_nll(features, n_time_steps, seq_class_ids, phone_seq_lens, day_indices,
                                                   heads_wanted=(head,))
        return nll[head], heads[head].argmax(-1).to(torch.int32), out_lens

    def _forward_log_probs(self, features: Tensor, n_time_steps: Tensor, seq_class_ids: Tensor,
                           phone_seq_lens: Tensor, day_indices: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """`_forward_eval` plus the decode head's (B, P, C) f32 log-probabilities a word beam search reads."""
        head = self.model.decode_head
        heads, nll, out_lens = self._heads_and_nll(features, n_time_steps, seq_class_ids, phone_seq_lens, day_indices,
                                                   heads_wanted=(head,))
        logits = heads[head]
        log_probs = logits.to(LOSS_DTYPE).log_softmax(-1)  # (B, P, C) f32
        return nll[head], logits.argmax(-1).to(torch.int32), out_lens, log_probs

    def _inputs(self, batch: Batch, step: int | None = None, micro: int = 0, *,
                with_valid: bool = False) -> dict[str, Any]:
        """The compiled functions' inputs, placed by the backend (sharded over its mesh).

        With `step` (training): also `valid`, the model's `schedule` values and loss weights
        at `step`, and the step's seed: a (1,) int32 tensor uploaded from the host (device
        data whatever its value: no recompilation) that seeds every random draw of the step,
        so a resumed run draws what an unbroken one did.
        """
        t = self.backend.place(batch.tensors)
        inputs = {k: t[k] for k in ("features", "n_time_steps", "seq_class_ids", "phone_seq_lens", "day_indices")}
        if step is None:
            return {**inputs, "valid": t["valid"]} if with_valid else inputs
        seed = (self.cfg.train.seed * 1_000_003 + step * 64 + micro) % 2**31
        self.backend.seed(seed)  # torch's RNG, where the backend draws from it
        return {**inputs, "valid": t["valid"],
                "seed": self.backend.replicated(torch.tensor([seed], dtype=torch.int32, device="cpu")),
                "schedule": self._uploaded(self.model.schedule(step)),
                "weights": self._uploaded(self.model.loss_weights(step))}

    def _uploaded(self, values: dict[str, float]) -> dict[str, Tensor]:
        """Per-step values as (1,) f32 tensors copied from the host: device data whatever the
        value, so a ramp through 0 or 1 keeps the graph (torch_xla bakes those in as constants)."""
        return {name: self.backend.replicated(torch.tensor([v], dtype=LOSS_DTYPE, device="cpu"))
                for name, v in values.items()}

    def forward_backward(self, batch: Batch, step: int, micro: int) -> tuple[Tensor, dict[str, Tensor]]:
        """The objective (the heads' losses weighted by `model.loss_weights(step)`) of one
        micro-batch and each head's loss, device scalars; the objective's gradient is added to `.grad`."""
        self.model.train()
        losses = self._train_fn(**self._inputs(batch, step, micro))
        objective = losses.pop(TOTAL)
        objective.backward(self._grad_seed)  # d(objective / grad_accum)
        return objective.detach(), {name: loss.detach() for name, loss in losses.items()}

    @torch.no_grad()
    def losses(self, batch: Batch) -> dict[str, Tensor]:
        """Each head's mean loss on `batch` through the compiled training objective, with no
        randomness: eval mode (no dropout), eval augmentation (smoothing only), no gradient."""
        self.model.eval()
        return self._train_fn(**self._inputs(batch, with_valid=True))

    def update(self, step: int) -> Tensor:
        """Clip, set this step's learning rates, apply AdamW, clear gradients; returns the grad norm."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        clip = self.cfg.optim.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        set_lrs(self.optimizer, step, self.cfg.optim)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)
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

    def take_losses(self) -> dict[str, float]:
        """Sums of step losses since the last call (`total` and each head's): the deliberate
        host read of the loop.

        The fresh totals are uploaded from the host as (1,) tensors: a 0-dim zero, on the
        device or uploaded, is traced as a graph constant (torch_xla's special scalars), and
        the next step would compile a graph of its own (`b2t.xla_workarounds`: special-scalars).
        """
        values = {name: float(t.cpu()[0]) for name, t in self._loss_totals.items()}  # transfers, no new graph
        self._loss_totals = self._zero_totals()
        return values

    def loss_totals(self) -> list[Tensor]:
        """The device-side loss sums `take_losses` will read (state a step updates)."""
        return list(self._loss_totals.values())

    def _zero_totals(self) -> dict[str, Tensor]:
        return self._uploaded(dict.fromkeys((TOTAL, *self.model.heads), 0.0))

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

    def warm_up(self, buckets: Sequence[BucketShape], report: Callable[[str], None], *,
                log_probs: bool = False) -> None:
        """Compile every graph a run will need, on one all-padding batch per bucket: the one
        warm-up recipe of training and evaluation alike.

        The batches are made on the host and placed by the step, as the loader's batches are
        (a batch made on the device is a different graph input, and under SPMD it takes
        another placement path). With an optimizer, per bucket two optimizer steps and an
        eval inside `_preserved_state()`, which puts weights and optimizer state back
        before each later bucket and at the end; then one eval per bucket again. Each
        bucket starts from the run's initial state, as a run's first step may fall in any
        bucket (AdamW's step counts are (1,) tensors, `optim.step_count`, so fresh and
        stepped state trace the same step graph). Measured on
        XLA: the eval graph traced right after training steps and the one traced after the
        restore differ (the order of the lazy graph's outputs), and validation meets both;
        and under openxla a shape's second eval call still compiles one more graph.
        `log_probs`: warm the word-decoding eval step instead of the greedy one.
        """
        evaluate = self.log_probs_step if log_probs else self.eval_step
        batches = [Batch(i, empty_batch(shape), {}) for i, shape in enumerate(buckets)]
        with self._preserved_state() as restore:
            for i, batch in enumerate(batches):
                if i:
                    restore()  # every bucket from the run's initial state
                if self.optimizer is not None:
                    report(f"train step, {_shape_of(batch)}")
                    for step in (1, 2):  # seeds of later steps: a seed of 0 is traced as a constant
                        self.train_step([batch] * self.cfg.train.grad_accum, step)
                report(f"eval step, {_shape_of(batch)}")
                evaluate(batch)
        for batch in batches:
            report(f"eval step again, {_shape_of(batch)}")
            evaluate(batch)
        if self.optimizer is not None:
            self.take_losses()  # warm-up losses are not the run's

    @contextlib.contextmanager
    def _preserved_state(self) -> Iterator[Callable[[], None]]:
        """Yield `restore`, which puts weights, gradients and optimizer state back as they were
        on entry; it also runs on exit. Nothing to keep without an optimizer (evaluation
        changes no weight).

        Kept as host copies, taken once (`mesh.host_copy`: a sharded tensor is read shard by
        shard), and uploaded back: an upload is device data and compiles nothing, where
        device-side clones and copies would be two more graphs. The uploads are whole
        tensors, so an fsdp mesh annotates them again (`Backend.shard`).
        """
        if self.optimizer is None:
            yield lambda: None
            return
        live = list(self.model.state_dict().values()) + [p.grad for p in self.model.parameters()]
        live += [t for s in self.optimizer.state.values() for t in s.values()]
        saved = [host_copy(t) for t in live]

        def restore() -> None:
            with torch.no_grad():
                for t, s in zip(live, saved):
                    t.copy_(s)
            self.backend.shard(self.model, self.optimizer)
            self.backend.sync()

        try:
            yield restore
        finally:
            restore()


class WarmUpReport:
    """`Stepper.warm_up`'s `report`: one line per piece that compiled, e.g. `compiled eval step,
    bucket T=126 B=16: 2 graphs, 3.1 s`, and none for a piece whose graphs were cached (XLA
    counts them; inductor's are not counted, so each of its pieces gets a line; eager compiles
    nothing). On a terminal the bar also says what compiles now; piped output gets only the
    lines, no carriage-return frames."""

    def __init__(self, bar: tqdm, backend: Backend) -> None:
        self.bar, self.backend = bar, backend
        stream = getattr(bar, "fp", None)
        self.live = not getattr(bar, "disable", True) and bool(getattr(stream, "isatty", lambda: False)())
        self.what, self.started, self.before = "", time.perf_counter(), self._compiled()

    def _compiled(self) -> int | None:
        return self.backend.stats().compilations if self.backend.xla else None

    def __call__(self, what: str) -> None:
        compiled = self._compiled()
        if self.what and self.backend.name != "eager":
            seconds = time.perf_counter() - self.started
            if compiled is None:
                self.bar.write(f"compiled {self.what}: {seconds:.1f} s")
            elif compiled > self.before:
                n = compiled - self.before
                self.bar.write(f"compiled {self.what}: {n} graph{'s' * (n > 1)}, {seconds:.1f} s")
        hint = "" if self.what else " (the first compile can take minutes)"
        self.what, self.started, self.before = what, time.perf_counter(), compiled
        if what and self.live:
            self.bar.set_description_str(f"compiling {what}{hint}")


TOTAL = "total"
"""The name of the summed loss among the per-head losses `take_losses` returns."""


def _shape_of(batch: Batch) -> str:
    B, T, _ = batch.tensors["features"].shape
    return f"bucket T={T} B={B}"
