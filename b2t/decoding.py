"""One pass of an eval step over batches: per-trial greedy results, and PER/WER summaries.

Below the trainer and the evaluator alike: validation during training and `b2t-eval` both
turn a split's batches into `TrialResult`s here and score them with `summarize`.

Per batch there is one device->host transfer: the greedy (B, P) ids, lengths and per-row
losses, plus the (B, P, C) f32 log-probabilities when words are decoded. Padding rows
(`valid` false) are skipped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch import Tensor

from b2t.contract import Batch
from b2t.metrics import ErrorRate, edit_distance, greedy_decode
from b2t.phonemes import phoneme_string
from b2t.text import words_of

EvalStep = Callable[[Batch], tuple[Tensor, ...]]
"""A compiled eval step: batch -> (per-row loss (B,), greedy ids (B, P), output lengths (B,)
[, log-probabilities (B, P, C)]), as `b2t.train.step.Stepper.eval_step` returns them."""


@dataclass(frozen=True)
class TrialResult:
    session: str
    block: int
    trial: int
    group: str  # HDF5 group name, e.g. trial_0007 (its number is the trial's place in the file)
    phonemes: list[int]  # greedy decode
    reference: list[int]  # empty for test trials
    loss: float  # CTC negative log-likelihood (0 for test trials)
    edits: int
    sentence: str | None = None  # the sentence label; None for test trials
    log_probs: np.ndarray | None = field(default=None, repr=False, compare=False)  # (P, C) f32, valid frames only
    words: str | None = None  # decoded text, when words were decoded

    def to_dict(self) -> dict[str, Any]:
        d = {
            "session": self.session, "block": self.block, "trial": self.trial, "group": self.group,
            "phonemes": phoneme_string(self.phonemes), "reference": phoneme_string(self.reference),
            "edits": self.edits if self.reference else None, "loss": self.loss,
            "words": self.words, "sentence": self.sentence,
        }
        if self.words is not None and self.sentence is not None:
            d["word_edits"] = edit_distance(words_of(self.words), words_of(self.sentence))
        return d


@dataclass
class EvalSummary:
    per: ErrorRate
    loss: float  # mean CTC loss over labelled trials
    n_trials: int
    wer: ErrorRate | None = None  # when words were decoded for labelled trials

    def to_dict(self) -> dict[str, Any]:
        per = self.per.rate()
        d = {"per": None if math.isnan(per) else per, "loss": self.loss, "n_trials": self.n_trials,
             "per_session": self.per.to_dict()}
        if self.wer is not None:
            d.update(wer=self.wer.rate(), wer_session=self.wer.to_dict())
        return d


def decode_batches(step: EvalStep, batches: Iterable[Batch]) -> Iterator[TrialResult]:
    """Every valid row of `batches`, greedy-decoded, in stream order.

    When `step` also returns log-probabilities, each trial keeps its (P, C) frames.
    """
    for batch in batches:
        nll, ids, out_lens, *rest = (x.cpu() for x in step(batch))  # the step places the batch
        hyps = greedy_decode(ids, out_lens)
        frames = rest[0].numpy() if rest else None  # (B, P, C) f32
        valid = batch.tensors["valid"].tolist()
        labels, label_lens = batch.tensors["seq_class_ids"].tolist(), batch.tensors["phone_seq_lens"].tolist()
        for r, row in enumerate(batch.meta["rows"]):
            if not valid[r]:
                continue
            ref = labels[r][: label_lens[r]]
            yield TrialResult(
                session=row["session"], block=int(row["block"]), trial=int(row["trial"]), group=row["group"],
                phonemes=hyps[r], reference=ref, loss=float(nll[r]) if ref else 0.0,
                edits=edit_distance(hyps[r], ref), sentence=row.get("sentence"),
                log_probs=None if frames is None else frames[r, : int(out_lens[r])].copy(),
            )


def summarize(results: Iterable[TrialResult]) -> EvalSummary:
    """PER (and WER where words were decoded) per session and aggregate, as the competition scores."""
    per, wer, loss, labelled, worded, n = ErrorRate(), ErrorRate(), 0.0, 0, 0, 0
    for res in results:
        n += 1
        if res.reference:
            per.add(res.session, res.phonemes, res.reference)
            loss += res.loss
            labelled += 1
        if res.words is not None and res.sentence is not None:
            wer.add(res.session, words_of(res.words), words_of(res.sentence))
            worded += 1
    return EvalSummary(per=per, loss=loss / max(labelled, 1), n_trials=n, wer=wer if worded else None)
