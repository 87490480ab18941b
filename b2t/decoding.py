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
from b2t.words.nbest import Hypothesis

EvalStep = Callable[[Batch], tuple[Tensor, ...]]
"""A compiled eval step: batch -> (per-row loss (B,), greedy ids (B, P), output lengths (B,)
[, log-probabilities (B, P, C)]), as `b2t.engine.step.Stepper.eval_step` returns them."""


@dataclass(frozen=True)
class TrialResult:
    """One trial's decode. The reference fields are None where the split has no labels (test)."""

    session: str
    block: int
    trial: int
    group: str  # HDF5 group name, e.g. trial_0007 (its number is the trial's place in the file)
    decoded_phonemes: list[int]  # greedy decode
    reference_phonemes: list[int] | None  # the label sequence
    loss: float | None  # CTC negative log-likelihood of the reference
    phoneme_edits: int | None  # edit distance of the decode to the reference
    reference_words: str | None = None  # the sentence label
    log_probs: np.ndarray | None = field(default=None, repr=False, compare=False)  # (P, C) f32, valid frames only
    decoded_words: str | None = None  # the chosen sentence, when words were decoded
    nbest: tuple[Hypothesis, ...] | None = None  # the word hypotheses chosen among, best first by the beam

    @property
    def word_edits(self) -> int | None:
        if self.decoded_words is None or self.reference_words is None:
            return None
        return edit_distance(words_of(self.decoded_words), words_of(self.reference_words))

    def to_dict(self) -> dict[str, Any]:
        """The trials.jsonl record: every field always present, null where it does not apply."""
        d = {
            "session": self.session, "block": self.block, "trial": self.trial, "group": self.group,
            "decoded_phonemes": phoneme_string(self.decoded_phonemes),
            "reference_phonemes": None if self.reference_phonemes is None else phoneme_string(self.reference_phonemes),
            "phoneme_edits": self.phoneme_edits, "loss": self.loss,
            "decoded_words": self.decoded_words, "reference_words": self.reference_words,
            "word_edits": self.word_edits,
        }
        if self.nbest is not None:
            d["nbest"] = [h.to_dict() for h in self.nbest]
        return d


@dataclass
class EvalSummary:
    per: ErrorRate
    loss: float | None  # mean CTC loss over labelled trials (None without any)
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
            ref = labels[r][: label_lens[r]] or None  # test rows carry no labels
            yield TrialResult(
                session=row["session"], block=int(row["block"]), trial=int(row["trial"]), group=row["group"],
                decoded_phonemes=hyps[r], reference_phonemes=ref, loss=None if ref is None else float(nll[r]),
                phoneme_edits=None if ref is None else edit_distance(hyps[r], ref),
                reference_words=row.get("sentence"),
                log_probs=None if frames is None else frames[r, : int(out_lens[r])].copy(),
            )


def summarize(results: Iterable[TrialResult]) -> EvalSummary:
    """PER (and WER where words were decoded) per session and aggregate, as the competition scores."""
    per, wer, loss, labelled, worded, n = ErrorRate(), ErrorRate(), 0.0, 0, 0, 0
    for res in results:
        n += 1
        if res.reference_phonemes is not None:
            per.add(res.session, res.decoded_phonemes, res.reference_phonemes)
            loss += res.loss or 0.0
            labelled += 1
        if res.decoded_words is not None and res.reference_words is not None:
            wer.add(res.session, words_of(res.decoded_words), words_of(res.reference_words))
            worded += 1
    return EvalSummary(per=per, loss=loss / labelled if labelled else None, n_trials=n, wer=wer if worded else None)
