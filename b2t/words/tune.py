"""The n-best weights tuned on labelled trials (`b2t-eval --tune`), and the file that carries them.

The beam searched once, with its own weights, and kept each trial's n best hypotheses with
their scores (`b2t.words.nbest`). Choosing among them again under other `Weights` needs
no new search, so every grid point is one argmax per trial over the kept list: all points,
trials and hypotheses at once as (points, trials, n) arrays. The search is a full grid
(`Grid`), then a coordinate search from its best point: along each weight while the WER
falls, at the grid's spacing (so past its edge if need be), then at half of it, and so on. The
default weights (those the run would choose with untuned: the beam's own, plus the given
neural weight when rescoring) are one of the points and win every tie, so the WER reported
is never worse than theirs; among other equal points the one nearest to them wins.

A val split of a few hundred sentences has noise: a point a handful of word errors better
there is as likely to be worse on test (on the realistic synth, points a word or two better on
val were worse on test). So the best point replaces the defaults only when its gain is not
chance: a paired sign-flip test over the trials (`sign_flip_p`, exact) must give p < alpha
(`ALPHA` unless `--tune-alpha`; 1 takes the best point whatever its gain).

The weights file (`save_weights`, JSON) records the weights, the beam settings and n-best
size they were tuned over and what they were tuned on; `b2t-eval --weights FILE` searches
with those settings and chooses with those weights, so the val WER it gives is the one
tuning reported.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from b2t.atomic import atomic_write_text
from b2t.config import ConfigError, check_value
from b2t.errors import InputFileError, MissingInput, UsageError
from b2t.words.nbest import Hypothesis, Weights

WEIGHTS_KIND = "b2t-eval n-best weights"
WEIGHTS_VERSION = 1
MAX_CELLS = 4_000_000
"""Score cells (points x trials x n) computed at once."""
MAX_WALK = 40
"""Steps the coordinate search takes along one weight per round at most."""
ALPHA = 0.05
"""The tuned weights replace the defaults only when their gain has a chance below this (`sign_flip_p`)."""


def _steps(lo: float, hi: float, step: float) -> tuple[float, ...]:
    return tuple(float(v) for v in np.round(np.arange(lo, hi + step / 2, step), 6))


@dataclass(frozen=True)
class Grid:
    """The full grid's values per weight (the coordinate search then refines between them)."""

    lm_weight: tuple[float, ...] = _steps(0.0, 3.0, 0.25)
    word_score: tuple[float, ...] = _steps(-3.0, 6.0, 0.5)
    neural_weight: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0)
    rounds: int = 4  # coordinate-search rounds after the first (at the grid's spacing), each with half the step


@dataclass(frozen=True)
class TuneResult:
    default: Weights  # the weights untuned
    default_errors: int
    best: Weights  # the weights chosen: the search's best, or the defaults when its gain may be chance
    best_errors: int
    reference_words: int
    points: int  # grid points scored
    found: Weights  # the search's best point
    found_errors: int
    p_value: float  # the chance of a gain at least the found point's (`sign_flip_p`)
    alpha: float = ALPHA

    @property
    def kept_default(self) -> bool:
        """The untuned weights are the ones chosen: no point does better, or its gain is one chance
        gives (p >= alpha)."""
        return self.best == self.default

    @property
    def default_wer(self) -> float:
        return self.default_errors / self.reference_words

    @property
    def best_wer(self) -> float:
        return self.best_errors / self.reference_words

    def to_dict(self) -> dict[str, Any]:
        return {"default": {**self.default.to_dict(), "wer": self.default_wer},
                "best": {**self.best.to_dict(), "wer": self.best_wer},
                "found": {**self.found.to_dict(), "wer": self.found_errors / self.reference_words},
                "p_value": self.p_value, "alpha": self.alpha, "kept_default": self.kept_default,
                "reference_words": self.reference_words, "points": self.points}

    def describe(self) -> str:
        """One line: the WER at the defaults and at the weights chosen, and why those."""
        line = (f"WER {self.default_wer:.4f} at the default weights ({self.default.describe()}), "
                f"{self.found_errors / self.reference_words:.4f} at the best point ({self.found.describe()})")
        if self.found_errors == self.default_errors:
            return line + ": the defaults kept (no point does better)"
        verdict = "kept the defaults: a gain chance gives" if self.kept_default else "chose the best point"
        return (line + f": {verdict} ({self.default_errors - self.found_errors} fewer word errors, "
                f"paired sign-flip p = {self.p_value:.3g}, alpha {self.alpha:g})")


class NBestTable:
    """Trials' n-best lists as (trials, n) arrays; `errors` scores many weight points at once.

    nbests: each trial's hypotheses, best first; edits: each hypothesis's word edits against
    its trial's reference. Missing entries (shorter lists) never win.
    """

    def __init__(self, nbests: Sequence[Sequence[Hypothesis]], edits: Sequence[Sequence[int]],
                 searched: Weights) -> None:
        if not nbests or any(not n for n in nbests):
            raise UsageError("tuning needs at least one trial, each with at least one hypothesis")
        self.searched = searched
        width = max(map(len, nbests))
        shape = (len(nbests), width)
        self.beam = np.full(shape, -np.inf)  # (trials, n)
        self.ngram, self.n_words, self.neural = np.zeros(shape), np.zeros(shape), np.zeros(shape)
        self.edits = np.zeros(shape, dtype=np.int64)
        self.has_neural = all(h.neural is not None for n in nbests for h in n)
        for t, (hyps, errs) in enumerate(zip(nbests, edits)):
            if len(hyps) != len(errs):
                raise ValueError(f"trial {t}: {len(hyps)} hypotheses but {len(errs)} edit counts")
            for k, (h, e) in enumerate(zip(hyps, errs)):
                self.beam[t, k], self.ngram[t, k], self.n_words[t, k] = h.beam, h.ngram, h.n_words
                self.neural[t, k] = h.neural if self.has_neural else 0.0
                self.edits[t, k] = e

    def trial_errors(self, point: Weights) -> np.ndarray:
        """(trials,) word edits of the hypothesis `point` chooses in each trial."""
        scores = (self.beam + (point.lm_weight - self.searched.lm_weight) * self.ngram
                  + (point.word_score - self.searched.word_score) * self.n_words + point.neural_weight * self.neural)
        return np.take_along_axis(self.edits, scores.argmax(-1)[:, None], -1)[:, 0]

    def errors(self, points: Sequence[Weights]) -> np.ndarray:
        """(len(points),) total word edits of the hypotheses each point chooses."""
        out = []
        per_chunk = max(1, MAX_CELLS // self.beam.size)
        for start in range(0, len(points), per_chunk):
            chunk = points[start:start + per_chunk]
            da = np.array([p.lm_weight - self.searched.lm_weight for p in chunk])[:, None, None]  # (G, 1, 1)
            dc = np.array([p.word_score - self.searched.word_score for p in chunk])[:, None, None]
            b = np.array([p.neural_weight for p in chunk])[:, None, None]
            scores = self.beam + da * self.ngram + dc * self.n_words + b * self.neural  # (G, trials, n)
            chosen = scores.argmax(-1)  # (G, trials): the first of equal scores, as `nbest.best`
            out.append(np.take_along_axis(self.edits[None], chosen[..., None], -1)[..., 0].sum(-1))
        return np.concatenate(out)


def tune(table: NBestTable, reference_words: int, default: Weights | None = None, grid: Grid = Grid(),
         alpha: float = ALPHA) -> TuneResult:
    """The weights with the fewest word errors over `table`, kept only when their gain is not
    chance at level `alpha` (see the module docstring).

    reference_words: the total reference length (WER's denominator); default: the weights
    untuned (the beam's own if None). The neural weight is searched only when every
    hypothesis has a neural score.
    """
    if reference_words < 1:
        raise UsageError("tuning needs trials with reference sentences (a labelled split such as val)")
    default = default or table.searched
    if default.neural_weight and not table.has_neural:
        raise UsageError("the default weights weigh a neural LM score the n-best lists do not have")
    neural = grid.neural_weight if table.has_neural else (0.0,)
    steps = {"lm_weight": _spacing(grid.lm_weight), "word_score": _spacing(grid.word_score),
             "neural_weight": _spacing(neural) if table.has_neural else 0.0}
    scored: dict[Weights, int] = {}

    def score(points: list[Weights]) -> None:
        new = [p for p in dict.fromkeys(points) if p not in scored]
        if new:
            scored.update(zip(new, (int(e) for e in table.errors(new))))

    def rank(p: Weights) -> tuple[int, float]:
        distance = sum(abs(getattr(p, k) - getattr(default, k)) / s for k, s in steps.items() if s)
        return scored[p], distance

    score([default, table.searched] + [Weights(lm_weight=a, neural_weight=b, word_score=c)
                        for a, b, c in itertools.product(grid.lm_weight, neural, grid.word_score)])
    best = min(scored, key=rank)
    for r in range(grid.rounds + 1):  # the grid's spacing first (it may walk past the grid's edge), then halves
        for name, step in steps.items():
            if not step:
                continue
            delta = step / 2 ** r
            for _ in range(MAX_WALK):  # on along this weight while it gets better
                value = getattr(best, name)
                candidates = [_with(best, name, v) for v in (value - delta, value + delta)
                              if v >= 0 or name == "word_score"]
                score(candidates)
                moved = min([best, *candidates], key=rank)
                if moved == best:
                    break
                best = moved
    p = sign_flip_p(table.trial_errors(default) - table.trial_errors(best))
    chosen = best if p < alpha else default
    return TuneResult(default=default, default_errors=scored[default], best=chosen, best_errors=scored[chosen],
                      reference_words=reference_words, points=len(scored), found=best, found_errors=scored[best],
                      p_value=p, alpha=alpha)


def sign_flip_p(gains: np.ndarray) -> float:
    """One-sided p-value of the paired sign-flip test of per-trial gains (word errors at the
    defaults minus at the tuned weights): the chance that the gains, each flipped in sign at
    random as they would be if the two weightings were equally good, sum to at least their
    sum. Exact: the integer distribution of sum(+-|gain|), built one trial at a time."""
    total = int(gains.sum())
    if total <= 0:
        return 1.0
    sizes = np.abs(gains[gains != 0]).astype(np.int64)
    span = int(sizes.sum())
    probs = np.zeros(2 * span + 1)  # probs[span + s]: the chance of the sum s
    probs[span] = 1.0
    for size in sizes:  # partial sums stay within +-span: the roll never wraps a nonzero entry
        probs = 0.5 * (np.roll(probs, size) + np.roll(probs, -size))
    return float(min(1.0, probs[span + total:].sum()))


def _spacing(values: Sequence[float]) -> float:
    """The grid's smallest step along one weight (0 for a single value)."""
    v = sorted(set(values))
    return float(min(np.diff(v))) if len(v) > 1 else 0.0


def _with(w: Weights, name: str, value: float) -> Weights:
    d = w.to_dict()
    d[name] = round(float(value), 6)
    return Weights(**d)


# --- the weights file ----------------------------------------------------------------------

@dataclass(frozen=True)
class WeightsFile:
    """What `--weights FILE` applies: choose with `weights` among the `nbest` best hypotheses
    of a beam searching with `search` (BeamOptions' fields)."""

    weights: Weights
    search: dict[str, Any]
    nbest: int
    lm: str | None  # the n-gram LM tuned with (for the record and the check that one is given)
    rescore: str | None  # the causal LM directory tuned with
    tuned_on: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": WEIGHTS_KIND, "version": WEIGHTS_VERSION, "weights": self.weights.to_dict(),
                "search": self.search, "nbest": self.nbest, "lm": self.lm, "rescore": self.rescore,
                "tuned_on": self.tuned_on}


def save_weights(path: Path, wf: WeightsFile) -> None:
    atomic_write_text(path, json.dumps(wf.to_dict(), indent=1) + "\n")


def load_weights(path: Path) -> WeightsFile:
    """The weights file at `path`; a file that is not one is a ValueError naming it and why."""
    try:
        d = json.loads(path.read_text())
    except FileNotFoundError:
        raise MissingInput(f"weights file {path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputFileError(f"{path}: not a weights file that b2t-eval --tune writes ({e})") from None
    if not isinstance(d, dict) or d.get("kind") != WEIGHTS_KIND:
        raise InputFileError(f"{path}: not a weights file that b2t-eval --tune writes (no kind {WEIGHTS_KIND!r})")
    if d.get("version") != WEIGHTS_VERSION:
        raise InputFileError(f"{path}: weights file version {d.get('version')!r}; this b2t reads version {WEIGHTS_VERSION}")
    try:
        weights = Weights(**{k: check_value(f"weights.{k}", d["weights"][k], float)
                             for k in ("lm_weight", "neural_weight", "word_score")})
        search, nbest = dict(d["search"]), check_value("nbest", d["nbest"], int)
        lm, rescore = d.get("lm"), d.get("rescore")
    except ConfigError as e:  # a value of the wrong type, or NaN/inf (float() took "nan", int() 2.7)
        raise InputFileError(f"{path}: {e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise InputFileError(f"{path}: a weights file with a missing or malformed field ({e!r})") from None
    if nbest < 1:
        raise InputFileError(f"{path}: nbest must be >= 1, got {nbest}")
    if weights.lm_weight < 0 or weights.neural_weight < 0:
        raise InputFileError(f"{path}: the LM weights must be >= 0, got {weights.describe()}")
    if weights.neural_weight and rescore is None:  # no hypothesis would have a neural score to weigh
        raise InputFileError(f"{path}: neural_weight {weights.neural_weight:g} without a --rescore LM it was tuned with")
    return WeightsFile(weights=weights, search=search, nbest=nbest, lm=lm, rescore=rescore,
                       tuned_on=dict(d.get("tuned_on") or {}))
