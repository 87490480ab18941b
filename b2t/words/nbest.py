"""A trial's n best word hypotheses, their scores, and the weights that choose among them.

The beam search (`b2t.words.beam`) keeps, per trial, its final hypotheses with the score of
each part: `acoustic` (the emissions' natural-log probabilities along the hypothesis's
path), `ngram` (the n-gram LM's log10 probability of the words, unweighted), the number of
words and the search's own total, `beam` = acoustic + lm_weight x ngram + word_score x words
+ sil_score x SILs (the weights it searched with). A causal LM may add `neural` (its
natural-log probability of the words, `b2t.words.rescore`). Under `Weights` (a, b, c) a
hypothesis scores

    total = acoustic + a x ngram + b x neural + c x words (+ the search's SIL scores)

computed as beam + (a - lm_weight) x ngram + (c - word_score) x words + b x neural, so at the
search's own weights (b = 0) the total is the beam's score bit for bit and the first
hypothesis, the beam's choice, stays first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Hypothesis:
    """One word sequence of a trial's n-best list and its scores (see the module docstring)."""

    words: str  # lexicon words joined by spaces
    acoustic: float  # natural log
    ngram: float  # log10, unweighted (0 without an n-gram LM)
    n_words: int
    beam: float  # the search's total under the weights it searched with
    neural: float | None = None  # natural log; None until rescored

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Hypothesis:
        return cls(**{k: d[k] for k in ("words", "acoustic", "ngram", "n_words", "beam", "neural")})


@dataclass(frozen=True)
class Weights:
    """How a hypothesis's scores add up: a x n-gram, b x neural LM, c per word."""

    lm_weight: float  # a: the n-gram's log10 probability
    neural_weight: float = 0.0  # b: the causal LM's natural-log probability
    word_score: float = 0.0  # c: per word

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    def describe(self) -> str:
        return f"lm_weight={self.lm_weight:g} neural_weight={self.neural_weight:g} word_score={self.word_score:g}"


def total(h: Hypothesis, weights: Weights, searched: Weights) -> float:
    """`h`'s score under `weights`, for a beam that searched with `searched` (its neural weight unused)."""
    neural = 0.0 if weights.neural_weight == 0 else _neural(h)
    return (h.beam + (weights.lm_weight - searched.lm_weight) * h.ngram
            + (weights.word_score - searched.word_score) * h.n_words + weights.neural_weight * neural)


def best(hypotheses: Sequence[Hypothesis], weights: Weights, searched: Weights) -> int:
    """Index of the best hypothesis under `weights`; ties go to the earlier (the beam's order)."""
    if not hypotheses:
        raise ValueError("an empty n-best list has no best hypothesis")
    scores = [total(h, weights, searched) for h in hypotheses]
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


def _neural(h: Hypothesis) -> float:
    if h.neural is None:
        raise ValueError(f"hypothesis {h.words!r} has no neural LM score: rescore the n-best first")
    return h.neural
