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
import copy
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from b2t.config import Config
from b2t.contract import LOSS_DTYPE
from b2t.data.loader import Batch
from b2t.model.ctc import ctc_loss
from b2t.train.augment import augment
from b2t.train.backend import Backend
from b2t.train.optim import set_lrs


class Stepper:
    """Owns the compiled train and eval functions of one run."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, backend: Backend, cfg: Config):
        self.model, self.optimizer, self.backend, self.cfg = model, optimizer, backend, cfg
        self._train_fn = backend.compile(self._forward_loss)
        self._eval_fn = backend.compile(self._forward_eval)

    def _logits_and_nll(self, features: Tensor, n_time_steps: Tensor, seq_class_ids: Tensor,
                        phone_seq_lens: Tensor, day_indices: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        with self.backend.autocast():
            logits = self.model(features, day_indices)  # (B, P, C) bf16
        log_probs = logits.to(LOSS_DTYPE).log_softmax(-1)  # CTC in f32
        out_lens = self.model.output_lengths(n_time_steps)  # (B,) int32
        nll = ctc_loss(log_probs, seq_class_ids, out_lens, phone_seq_lens)  # (B,)
        return logits, nll, out_lens

    def _forward_loss(self, features: Tensor, n_time_steps: Tensor, seq_class_ids: Tensor,
                      phone_seq_lens: Tensor, day_indices: Tensor, valid: Tensor) -> Tensor:
        """Mean CTC loss over the batch's valid rows (padding rows weigh nothing)."""
        _, nll, _ = self._logits_and_nll(features, n_time_steps, seq_class_ids, phone_seq_lens, day_indices)
        weight = valid.to(LOSS_DTYPE)
        return (nll * weight).sum() / weight.sum().clamp(min=1.0)

    def _forward_eval(self, features: Tensor, n_time_steps: Tensor, seq_class_ids: Tensor,
                      phone_seq_lens: Tensor, day_indices: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Per-row CTC loss, greedy frame ids (B, P) and output lengths: all a decoder needs."""
        logits, nll, out_lens = self._logits_and_nll(features, n_time_steps, seq_class_ids, phone_seq_lens, day_indices)
        return nll, logits.argmax(-1).to(torch.int32), out_lens

    def _inputs(self, batch: Batch, train: bool) -> dict[str, Tensor]:
        t = batch.tensors
        features, n_time_steps = augment(t["features"], t["n_time_steps"], self.cfg.augment, train=train)
        return {"features": features, "n_time_steps": n_time_steps, "seq_class_ids": t["seq_class_ids"],
                "phone_seq_lens": t["phone_seq_lens"], "day_indices": t["day_indices"]}

    def seed(self, step: int, micro: int = 0) -> None:
        """Per-step RNG seed: a resumed run draws the same noise and dropout as an unbroken one."""
        self.backend.seed(self.cfg.train.seed * 1_000_003 + step * 64 + micro)

    def forward_backward(self, batch: Batch, step: int, micro: int) -> Tensor:
        """Loss (device scalar) of one micro-batch; its gradient is added to `.grad`."""
        self.model.train()
        self.seed(step, micro)
        loss = self._train_fn(**self._inputs(batch, train=True), valid=batch.tensors["valid"])
        (loss / self.cfg.train.grad_accum).backward()
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
        """One optimizer step over `grad_accum` micro-batches; returns (mean loss, grad norm)."""
        losses = [self.forward_backward(b, step, i) for i, b in enumerate(batches)]
        norm = self.update(step)
        loss = torch.stack(losses).mean()
        self.backend.sync()
        return loss, norm

    @torch.no_grad()
    def eval_step(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        self.model.eval()
        out = self._eval_fn(**self._inputs(batch, train=False))
        self.backend.sync()
        return out

    def warm_up(self, batch: Batch) -> None:
        """Compile every graph a step and an eval of `batch`'s bucket will need.

        Two optimizer steps (AdamW's first step creates its state, so the second traces the
        steady-state graph) and one eval. Run inside `preserved_state()`: warm-up must not
        move the weights, the optimizer or anything a resumed run has to reproduce.
        """
        for step in range(2):
            self.train_step([batch] * self.cfg.train.grad_accum, step)
        self.eval_step(batch)

    @contextlib.contextmanager
    def preserved_state(self) -> Iterator[None]:
        """Restore weights and optimizer state (on the device, no host copy) on exit."""
        weights = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        optim = copy.deepcopy(self.optimizer.state_dict()["state"])
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        try:
            yield
        finally:
            with torch.no_grad():
                for k, v in self.model.state_dict().items():
                    v.copy_(weights[k])
            self.optimizer.state.clear()
            params = [p for g in self.optimizer.param_groups for p in g["params"]]
            for i, s in optim.items():
                self.optimizer.state[params[i]] = s
            for g, saved in zip(self.optimizer.param_groups, groups):
                g.update(saved)
            self.optimizer.zero_grad(set_to_none=False)
            self.backend.sync()
