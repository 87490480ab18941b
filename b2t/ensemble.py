"""Checkpoints over a split, one after another, and their ensemble: per-frame log-probabilities averaged.

`b2t-eval CKPT [CKPT ...] DATASET` runs each checkpoint through its own `Evaluator` (its
eval graph compiled once per bucket in its warm-up, then the split), keeps every trial's
(P, C) log-probabilities and frees the model before the next one loads. The ensemble's
frame t is the normalised geometric mean of the members' distributions,
log_softmax(mean_m log p_m(t)), so greedy decoding, the CTC loss and the word beam read it
as they read one model's output. Averaging frame by frame needs the members to frame a
trial alike and to pick the same day layer for it: the same session list and the same
patching (size, stride); other checkpoints are refused by name before any model runs.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from b2t.data.dataset import Dataset
from b2t.decoding import EvalSummary, TrialResult, summarize
from b2t.engine.checkpoint import trained_config
from b2t.errors import UsageError
from b2t.evaluate import CompileCount, Evaluator
from b2t.metrics import edit_distance, greedy_decode
from b2t.model.ctc import ctc_loss


@dataclass(frozen=True)
class Member:
    """One checkpoint's own run over the split."""

    checkpoint: Path
    backend: str
    compiles: CompileCount
    summary: EvalSummary  # its PER on its own

    def to_dict(self) -> dict[str, Any]:
        per = self.summary.per.rate()
        return {"checkpoint": str(self.checkpoint), "backend": self.backend, "per": None if np.isnan(per) else per,
                "compilations": self.compiles.to_dict()}


def _signature(path: Path) -> tuple[list[str], tuple[int, int]]:
    """A checkpoint's session list and (patch_size, patch_stride), from its header."""
    state, cfg = trained_config(path)
    return list(state.sessions), (cfg.model.patch_size, cfg.model.patch_stride)


def check_members(checkpoints: Sequence[Path]) -> None:
    """Refuse checkpoints that cannot be averaged frame by frame, naming the first that differs."""
    paths = list(checkpoints)
    if len(set(map(Path.resolve, paths))) < len(paths):
        raise UsageError("a checkpoint is listed twice: an ensemble averages different checkpoints")
    sessions, patching = _signature(paths[0])
    for path in paths[1:]:
        other_sessions, other_patching = _signature(path)
        if other_sessions != sessions:
            raise UsageError(f"{path} was trained on other sessions than {paths[0]} ({len(other_sessions)} against "
                             f"{len(sessions)}, or another order): an ensemble needs the same day layers")
        if other_patching != patching:
            raise UsageError(f"{path} patches with size/stride {other_patching[0]}/{other_patching[1]}, {paths[0]} "
                             f"with {patching[0]}/{patching[1]}: an ensemble averages frames, which need the "
                             "same patching")


def combine(members: Sequence[Sequence[TrialResult]]) -> list[TrialResult]:
    """The ensemble's trials from its members' (same trials, same order, each with log_probs)."""
    out = []
    for trials in zip(*members, strict=True):
        first = trials[0]
        if any((t.session, t.group) != (first.session, first.group) for t in trials):
            raise ValueError(f"the members decoded other trials at {first.session} {first.group}: the same "
                             "dataset gives every member the same trials")
        stacked = torch.from_numpy(np.stack([t.log_probs for t in trials]))  # (M, P, C) f32; same P by check_members
        log_probs = stacked.mean(0).log_softmax(-1)  # (P, C)
        frames = len(log_probs)
        phonemes = greedy_decode(log_probs.argmax(-1)[None], [frames])[0]
        ref = first.reference_phonemes
        out.append(replace(first, decoded_phonemes=phonemes, log_probs=log_probs.numpy(),
                           loss=None if ref is None else _nll(log_probs, ref),
                           phoneme_edits=None if ref is None else edit_distance(phonemes, ref)))
    return out


def _nll(log_probs: torch.Tensor, reference: list[int]) -> float:
    """The CTC loss of one trial's (P, C) log-probabilities, as the eval step computes it per row."""
    def ints(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32)

    return float(ctc_loss(log_probs[None], ints(reference)[None], ints([len(log_probs)]), ints([len(reference)]))[0])


def evaluate_checkpoints(checkpoints: Sequence[Path], data: Dataset, split: str, *, backend: str | None,
                         device: str | None, log_probs: bool, progress: bool = True,
                         compile_jobs: int | None = None) -> tuple[list[TrialResult], list[Member]]:
    """The split's trials decoded by one checkpoint, or by the ensemble of several, and each member's run.

    log_probs: keep each trial's log-probabilities (for the word beam); an ensemble always
    computes them, and drops them again unless asked. compile_jobs: `Evaluator`'s.
    """
    check_members(checkpoints)
    ensemble = len(checkpoints) > 1
    runs, members = [], []
    for path in checkpoints:
        evaluator = Evaluator(path, backend, device, compile_jobs=compile_jobs)
        results, compiles = evaluator.run(data, split, log_probs=log_probs or ensemble, progress=progress)
        members.append(Member(path, evaluator.backend.name, compiles, summarize(results)))
        runs.append(results)
        del evaluator
        gc.collect()  # the next member's weights take the device memory this one held
    if not ensemble:
        return runs[0], members
    combined = combine(runs)
    return combined if log_probs else [replace(r, log_probs=None) for r in combined], members
