"""Greedy-decoding evaluation over every batch of a split: PER per session and aggregate.

Used by the trainer's validation and by `b2t-eval`. One device->host transfer per batch
(the (B, P) greedy ids, lengths and per-row losses); padding rows are skipped by `valid`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from b2t.data.loader import Batch
from b2t.metrics import ErrorRate, edit_distance, greedy_decode
from b2t.phonemes import phoneme_string
from b2t.train.step import Stepper


@dataclass(frozen=True)
class TrialResult:
    session: str
    block: int
    trial: int
    group: str
    phonemes: list[int]  # greedy decode
    reference: list[int]  # empty for test trials
    loss: float  # CTC negative log-likelihood (0 for test trials)
    edits: int

    def to_dict(self) -> dict:
        return {
            "session": self.session, "block": self.block, "trial": self.trial, "group": self.group,
            "phonemes": phoneme_string(self.phonemes), "reference": phoneme_string(self.reference),
            "edits": self.edits, "loss": self.loss,
        }


@dataclass
class EvalSummary:
    per: ErrorRate
    loss: float  # mean CTC loss over labelled trials
    n_trials: int

    def to_dict(self) -> dict:
        return {"per": self.per.rate(), "loss": self.loss, "n_trials": self.n_trials, "per_session": self.per.to_dict()}


def decode_batches(stepper: Stepper, batches: Iterable[Batch]) -> Iterator[TrialResult]:
    """Every valid row of `batches`, greedy-decoded, in stream order."""
    for batch in batches:
        nll, ids, out_lens = (x.cpu() for x in stepper.eval_step(batch.to(stepper.backend.device)))
        hyps = greedy_decode(ids, out_lens)
        valid = batch.tensors["valid"].tolist()
        labels, label_lens = batch.tensors["seq_class_ids"].tolist(), batch.tensors["phone_seq_lens"].tolist()
        for r, row in enumerate(batch.meta["rows"]):
            if not valid[r]:
                continue
            ref = labels[r][: label_lens[r]]
            yield TrialResult(
                session=row["session"], block=int(row["block"]), trial=int(row["trial"]), group=row["group"],
                phonemes=hyps[r], reference=ref, loss=float(nll[r]) if ref else 0.0,
                edits=edit_distance(hyps[r], ref),
            )


def summarize(results: Iterable[TrialResult]) -> EvalSummary:
    per, loss, labelled, n = ErrorRate(), 0.0, 0, 0
    for res in results:
        n += 1
        if res.reference:
            per.add(res.session, res.phonemes, res.reference)
            loss += res.loss
            labelled += 1
    return EvalSummary(per=per, loss=loss / max(labelled, 1), n_trials=n)
