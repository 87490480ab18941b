"""The one step function, compiled per backend: forward + CTC under one dtype policy.

Layout of a step (B rows, T bins, P = patches, C = 41 classes):
  augment (fixed shapes, device RNG)  ->  compiled forward + loss  ->  backward
  -> (every grad_accum micro-batches) clip, schedule, AdamW  ->  sync
The compiled region is `forward_loss`: day layer, patching and output layer are traced by
dynamo; the two recurrences (GRU, CTC) are explicit islands that run as XLA while-loops
(see b2t/model). Nothing in a step reads a value back to the host: losses accumulate on
the device and the loop reads them every `log_every` steps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from b2t.buckets import patch_count
from b2t.config import Config
from b2t.contract import COMPUTE_DTYPE, LOSS_DTYPE, PARAM_DTYPE
from b2t.data.loader import Batch
from b2t.model.ctc import ctc_loss
from b2t.train.augment import augment
from b2t.train.counter_rng import CounterRng, Stream
from b2t.train.backend import Backend
from b2t.train.optim import set_lrs


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
        self._loss_total = _device_zero(backend)
        if optimizer is None:
            return
        # Gradients exist from the start, so the first backward accumulates like every later
        # one: a backward that creates .grad traces a different graph than one that adds to it.
        for p in model.parameters():
            p.grad = _uploaded_zeros(p)
        self._init_optimizer_state()
        # the loss's gradient seed, device data (a lazily computed one is one more graph)
        self._grad_seed = backend.replicated(torch.full((), 1.0 / cfg.train.grad_accum, device="cpu"))

    def _init_optimizer_state(self) -> None:
        """Create AdamW's state up front (zero moments, step 0: what its first step would make).

        Otherwise the first step traces a state-creating graph that no later step reuses,
        and restoring a pre-warm-up snapshot would bring that extra graph back. Zeros are
        uploaded from the host, so they are device data like every later state.
        """
        for group in self.optimizer.param_groups:
            step_device = None if group.get("capturable") else torch.device("cpu")
            for p in group["params"]:
                if not self.optimizer.state[p]:
                    step = torch.zeros((), dtype=torch.float32, device="cpu")
                    self.optimizer.state[p] = {
                        "step": step.to(step_device or p.device),
                        "exp_avg": _uploaded_zeros(p),
                        "exp_avg_sq": _uploaded_zeros(p),
                    }

    def _logits_and_nll(self, features: Tensor, n_time_steps: Tensor, seq_class_ids: Tensor,
                        phone_seq_lens: Tensor, day_indices: Tensor, rng: CounterRng | None = None
                        ) -> tuple[Tensor, Tensor, Tensor]:
        """Augment (training when `rng` is given: noise, cut, dropout), forward, per-row CTC."""
        train = rng is not None
        features, n_time_steps = augment(features, n_time_steps, self.cfg.augment, train=train, rng=rng)
        input_keep = rnn_keep = None
        if train:
            m = self.cfg.model
            B, T, _ = features.shape
            input_keep = rng.keep(Stream.INPUT_KEEP, features.shape, m.input_dropout, COMPUTE_DTYPE)
            shape = self.model.rnn_keep_shape(B, patch_count(T, m.patch_size, m.patch_stride))
            rnn_keep = None if shape is None else rng.keep(Stream.RNN_KEEP, shape, m.rnn_dropout, PARAM_DTYPE)
        with self.backend.autocast():
            logits = self.forward(features, day_indices, input_keep, rnn_keep)  # (B, P, C) bf16
        log_probs = logits.to(LOSS_DTYPE).log_softmax(-1)  # CTC in f32
        out_lens = self.model.output_lengths(n_time_steps)  # (B,) int32
        nll = ctc_loss(log_probs, seq_class_ids, out_lens, phone_seq_lens)  # (B,)
        return logits, nll, out_lens

    def _forward_loss(self, features: Tensor, n_time_steps: Tensor, seq_class_ids: Tensor,
                      phone_seq_lens: Tensor, day_indices: Tensor, valid: Tensor, seed: Tensor) -> Tensor:
        """Mean CTC loss over the batch's valid rows (padding rows weigh nothing); `seed` (1,)
        int32 keys every random draw of the step (`CounterRng`)."""
        _, nll, _ = self._logits_and_nll(features, n_time_steps, seq_class_ids, phone_seq_lens, day_indices,
                                         CounterRng(seed))
        weight = valid.to(LOSS_DTYPE)
        return (nll * weight).sum() / weight.sum().clamp(min=1.0)

    def _forward_eval(self, features: Tensor, n_time_steps: Tensor, seq_class_ids: Tensor,
                      phone_seq_lens: Tensor, day_indices: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Per-row CTC loss, greedy frame ids (B, P) and output lengths: all a decoder needs."""
        logits, nll, out_lens = self._logits_and_nll(features, n_time_steps, seq_class_ids, phone_seq_lens, day_indices)
        return nll, logits.argmax(-1).to(torch.int32), out_lens

    def _forward_log_probs(self, features: Tensor, n_time_steps: Tensor, seq_class_ids: Tensor,
                           phone_seq_lens: Tensor, day_indices: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """`_forward_eval` plus the (B, P, C) f32 log-probabilities a word beam search reads."""
        logits, nll, out_lens = self._logits_and_nll(features, n_time_steps, seq_class_ids, phone_seq_lens, day_indices)
        log_probs = logits.to(LOSS_DTYPE).log_softmax(-1)  # (B, P, C) f32
        return nll, logits.argmax(-1).to(torch.int32), out_lens, log_probs

    def inputs(self, batch: Batch, step: int | None = None, micro: int = 0) -> dict[str, Tensor]:
        """The compiled functions' inputs, placed by the backend (sharded over its mesh).

        With `step` (training): also `valid` and the step's seed, a (1,) int32 tensor
        uploaded from the host (device data whatever its value: no recompilation), from which
        every random draw of the step is hashed; a resumed run draws what an unbroken one did.
        """
        t = self.backend.place(batch.tensors)
        inputs = {k: t[k] for k in ("features", "n_time_steps", "seq_class_ids", "phone_seq_lens", "day_indices")}
        if step is None:
            return inputs
        seed = (self.cfg.train.seed * 1_000_003 + step * 64 + micro) % 2**31
        return {**inputs, "valid": t["valid"],
                "seed": self.backend.replicated(torch.tensor([seed], dtype=torch.int32, device="cpu"))}

    def forward_backward(self, batch: Batch, step: int, micro: int) -> Tensor:
        """Loss (device scalar) of one micro-batch; its gradient is added to `.grad`."""
        self.model.train()
        loss = self._train_fn(**self.inputs(batch, step, micro))
        loss.backward(self._grad_seed)  # d(loss / grad_accum)
        return loss.detach()

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
        """One optimizer step over `grad_accum` micro-batches; returns (mean loss, grad norm).

        Under DDP, gradients are all-reduced in the last micro-batch's backward only
        (`no_sync` around the others): the sum is the same, the traffic 1/grad_accum.
        """
        no_sync = getattr(self.forward, "no_sync", contextlib.nullcontext)
        losses = []
        for i, batch in enumerate(batches):
            with no_sync() if i < len(batches) - 1 else contextlib.nullcontext():
                losses.append(self.forward_backward(batch, step, i))
        norm = self.update(step)
        loss = torch.stack(losses).mean()
        self._loss_total += loss  # inside the step's graph, so every step traces the same graph
        self.backend.sync()
        return loss, norm

    def take_loss_total(self) -> float:
        """Sum of step losses since the last call: the deliberate host read of the loop.

        The fresh total is uploaded from the host as a (1,) tensor: a 0-dim zero, on the
        device or uploaded, is traced as a graph constant (torch_xla's special scalars), and
        the next step would compile a graph of its own (measured).
        """
        total = float(self._loss_total.cpu()[0])
        self._loss_total = _device_zero(self.backend)
        return total

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
        out = self.backend.gathered(fn(**self.inputs(batch)))
        self.backend.sync()
        return out

    def warm_up(self, batches: Sequence[Batch], report: Callable[[str], None]) -> None:
        """Compile every graph the loop will need, one all-padding batch per bucket.

        Per bucket, two optimizer steps (the second sees the state the first leaves) and an
        eval inside `_preserved_state()`, which puts weights and optimizer state back
        afterwards; then one eval per bucket again. Measured on XLA: the eval island traced
        right after training steps and the one traced after the restore differ (the order
        of the lazy graph's outputs), and validation meets both.
        """
        with self._preserved_state():
            for batch in batches:
                report(f"train step, {_shape_of(batch)}")
                for step in (1, 2):  # seeds of later steps: a seed of 0 is traced as a constant
                    self.train_step([batch] * self.cfg.train.grad_accum, step)
                self.eval_step(batch)
        for batch in batches:
            report(f"eval step, {_shape_of(batch)}")
            self.eval_step(batch)
        self.take_loss_total()  # warm-up losses are not the run's

    @contextlib.contextmanager
    def _preserved_state(self) -> Iterator[None]:
        """Put weights, gradients and optimizer state back on exit.

        Kept as host copies and uploaded back: an upload is device data and compiles
        nothing, where device-side clones and copies would each be one more graph.
        """
        live = list(self.model.state_dict().values()) + [p.grad for p in self.model.parameters()]
        live += [t for s in self.optimizer.state.values() for t in s.values()]
        saved = [t.detach().cpu() for t in live]
        try:
            yield
        finally:
            with torch.no_grad():
                for t, s in zip(live, saved):
                    t.copy_(s)
            self.backend.sync()


def _shape_of(batch: Batch) -> str:
    B, T, _ = batch.tensors["features"].shape
    return f"bucket T={T} B={B}"


def _uploaded_zeros(p: Tensor) -> Tensor:
    return torch.zeros(p.shape, dtype=p.dtype, device="cpu").to(p.device)


def _device_zero(backend: Backend) -> Tensor:
    return backend.replicated(torch.zeros((1,), dtype=LOSS_DTYPE, device="cpu"))
