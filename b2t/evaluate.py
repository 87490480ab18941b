"""A checkpoint over a split: the competition's order, words, and the `Evaluator`.

`b2t-eval` builds an `Evaluator` that rebuilds a checkpoint's model, compiles each bucket's
eval graph once before the split, decodes every trial (`b2t.decoding`, shared with the
trainer's validation), returns the trials in the competition's id order and, with a
lexicon, decodes words in parallel worker processes: each trial's n best hypotheses
(`b2t.words.nbest`), optionally rescored by a causal LM (`b2t.words.rescore`), chosen
among with weights given or tuned on val (`b2t.words.tune`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from b2t.contract import BucketShape, trial_number
from b2t.data.dataset import Dataset
from b2t.data.loader import StreamConfig
from b2t.data.manifest import Manifest
from b2t.decoding import TrialResult, decode_batches
from b2t.engine.backend import CompileStats, make_backend
from b2t.engine.checkpoint import trained_config
from b2t.engine.checkpoint_checks import CheckpointError
from b2t.engine.concurrent_compiles import default_jobs
from b2t.engine.step import make_stepper
from b2t.errors import DatasetError, UsageError
from b2t.metrics import edit_distance
from b2t.phonemes import PHONEMES
from b2t.progress import progress_bar
from b2t.text import normalize_text, words_of
from b2t.train.warmup import warm_up
from b2t.train.warmup_progress import WarmUpReport
from b2t.words.beam import MAX_HOMOPHONES, BeamOptions, WordDecoder
from b2t.words.lexicon import Lexicon, cmu_lexicon, load_lexicon
from b2t.words.nbest import Hypothesis, Weights, best
from b2t.words.tune import ALPHA, Grid, NBestTable, TuneResult, tune
from b2t.workers import run_jobs, worker_pool

if TYPE_CHECKING:
    from b2t.words.rescore import CausalLMScorer

# --- the competition's order ----------------------------------------------------------

def trial_order_key(sessions: Sequence[str]) -> Callable[[str, str], tuple[int, int]]:
    """Sort key of (session, HDF5 group): sessions in day-index order, then the file's trial
    order (`b2t.contract.trial_number`, the order b2t-preprocess reads a file in)."""
    day = {s: i for i, s in enumerate(sessions)}

    def key(session: str, group: str) -> tuple[int, int]:
        if session not in day:
            raise DatasetError(f"trial {group} of session {session!r} is not in the session list {list(sessions)}")
        return day[session], trial_number(group)

    return key


def competition_order(results: Iterable[TrialResult], sessions: Sequence[str]) -> list[TrialResult]:
    """`results` in the competition's id order (`trial_order_key`)."""
    key = trial_order_key(sessions)
    return sorted(results, key=lambda r: key(r.session, r.group))


def excluded_trials(manifest: Manifest, split: str) -> list[tuple[str, str, str]]:
    """(session, group, reason) of the trials of `split` that b2t-preprocess left out."""
    name = f"data_{split}.hdf5"
    return [(Path(e.file).parent.name, e.trial, e.reason) for e in manifest.exclusions if Path(e.file).name == name]


def submission_rows(results: Sequence[TrialResult], excluded: Sequence[tuple[str, str, str]],
                    sessions: Sequence[str]) -> list[tuple[int, str]]:
    """(id, text) for every trial of the split in the competition's order; excluded trials get ''.

    Keeping a row for a trial the model never saw keeps every later id where the competition expects it.
    """
    key = trial_order_key(sessions)
    texts = [(key(r.session, r.group), normalize_text(r.decoded_words or "")) for r in results]
    texts += [(key(session, group), "") for session, group, _ in excluded]
    return [(i, text) for i, (_, text) in enumerate(sorted(texts))]


# --- words ---------------------------------------------------------------------------

@dataclass(frozen=True)
class WordRecipe:
    """How to build a `WordDecoder`; picklable, so each worker process builds its own
    (flashlight's C++ objects cannot be sent between processes)."""

    lexicon: Path | None  # lexicon file; None = the CMU pronouncing dictionary
    lm: Path | None = None  # ARPA or KenLM binary file; None = lexicon only
    options: BeamOptions = field(default_factory=BeamOptions)
    spell: bool = False  # spell the greedy phonemes into words (no search, no LM) instead
    nbest: int = 1  # hypotheses the beam search keeps per trial

    def __post_init__(self) -> None:
        if self.spell and self.lm is not None:
            raise UsageError("spelling the greedy phonemes uses no language model: drop the LM or the spelling")
        if not 1 <= self.nbest <= self.options.beam_size:
            raise UsageError(f"nbest must be in 1..beam_size={self.options.beam_size}, got {self.nbest}: "
                             "the search's final beam holds at most beam_size hypotheses")

    @property
    def searched(self) -> Weights:
        """The weights the beam search chooses with (its first hypothesis is the best under them)."""
        return Weights(lm_weight=self.options.lm_weight, word_score=self.options.word_score)

    def notes(self) -> list[str]:
        """What the search cannot do with this lexicon, said before it runs (and a lexicon that is
        none refused then): a spelling more than MAX_HOMOPHONES words share keeps only those the
        LM scores highest (flashlight's trie)."""
        lexicon = self._lexicon()
        if self.spell:
            return []
        crowded = lexicon.homophones(MAX_HOMOPHONES)
        if not crowded:
            return []
        pron, words = max(crowded.items(), key=lambda pw: len(pw[1]))
        lost = sum(len(ws) - MAX_HOMOPHONES for ws in crowded.values())
        many = f"{len(crowded)} spellings are" if len(crowded) != 1 else "1 spelling is"
        return [f"{many} shared by more than {MAX_HOMOPHONES} words (the most: "
                f"{' '.join(PHONEMES[i] for i in pron)}, {len(words)} words: {', '.join(words[:4])}, ...): the search "
                f"outputs only the {MAX_HOMOPHONES} of each the LM scores highest, so {lost} of those spellings' "
                "words never appear"]

    def _lexicon(self) -> Lexicon:
        return cmu_lexicon() if self.lexicon is None else load_lexicon(self.lexicon)

    def decode_fn(self) -> Callable[[Any], str | list[Hypothesis]]:
        """Build the decoder; returns its per-trial function: the spelled text of greedy ids, or
        the n-best hypotheses of log-probs."""
        decoder = WordDecoder(self._lexicon(), self.lm, self.options)
        return decoder.spell_greedy if self.spell else functools.partial(decoder.nbest, n=self.nbest)


_worker_decode: Callable[[Any], str | list[Hypothesis]] | None = None  # set in each worker by `_init_worker`


def _init_worker(recipe: WordRecipe) -> None:
    global _worker_decode
    torch.set_num_threads(1)  # workers share the cores; the search is single-threaded C++
    _worker_decode = recipe.decode_fn()


def _decode_in_worker(item: Any) -> str | list[Hypothesis]:
    assert _worker_decode is not None, "worker started without _init_worker"
    return _worker_decode(item)


def decode_words(results: Sequence[TrialResult], recipe: WordRecipe, *, workers: int = 1,
                 progress: bool = True) -> list[TrialResult]:
    """`results` with `decoded_words` (and, from the beam, `nbest`) filled in, same order;
    `workers` > 1 decodes in that many processes.

    Beam search needs results decoded with `log_probs=True`; spelling needs only the greedy ids.
    """
    if not recipe.spell and any(r.log_probs is None for r in results):
        raise ValueError("beam search needs each trial's log-probabilities: decode with log_probs=True")
    items = [r.decoded_phonemes if recipe.spell else r.log_probs for r in results]
    decoded: list[str | list[Hypothesis]] = [""] * len(items)
    with worker_pool(workers, _init_worker, (recipe,)) if workers > 1 else contextlib.nullcontext() as pool:
        fn = _decode_in_worker if pool else recipe.decode_fn()
        for i, d in progress_bar(run_jobs(pool, fn, items), total=len(items), unit="trial", desc="decoding words",
                                 disable=not progress):
            decoded[i] = d
    return [replace(r, decoded_words=d) if isinstance(d, str) else replace(r, nbest=tuple(d), decoded_words=d[0].words)
            for d, r in zip(decoded, results)]


def rescore(results: Sequence[TrialResult], scorer: CausalLMScorer, *, progress: bool = True) -> list[TrialResult]:
    """`results` with every n-best hypothesis's `neural` score; each distinct sentence is scored once."""
    if any(r.nbest is None for r in results):
        raise UsageError("rescoring needs the beam search's n-best lists (spelled words have none)")
    sentences = list(dict.fromkeys(h.words for r in results for h in r.nbest or ()))
    scores = dict(zip(sentences, scorer.score(sentences, progress=progress)))
    return [replace(r, nbest=tuple(replace(h, neural=scores[h.words]) for h in r.nbest or ())) for r in results]


def choose(results: Sequence[TrialResult], weights: Weights, searched: Weights) -> list[TrialResult]:
    """`results` whose `decoded_words` is the n-best hypothesis `weights` prefer (`b2t.words.nbest`)."""
    return [r if r.nbest is None else replace(r, decoded_words=r.nbest[best(r.nbest, weights, searched)].words)
            for r in results]


def tune_weights(results: Sequence[TrialResult], searched: Weights, default: Weights | None = None,
                 grid: Grid = Grid(), alpha: float = ALPHA) -> TuneResult:
    """The n-best weights with the lowest WER over the labelled trials of `results` (`b2t.words.tune`):
    `searched` the beam's own, `default` those used untuned (default: the beam's), the best kept
    only when its gain has a chance below `alpha`."""
    labelled = [r for r in results if r.reference_words is not None and r.nbest is not None]
    if not labelled:
        raise UsageError("--tune needs the beam's n-best lists of trials with reference sentences (e.g. --split val)")
    references = [words_of(r.reference_words or "") for r in labelled]
    edits = [[edit_distance(words_of(h.words), ref) for h in r.nbest or ()] for r, ref in zip(labelled, references)]
    table = NBestTable([r.nbest or () for r in labelled], edits, searched)
    return tune(table, sum(map(len, references)), default, grid, alpha)


# --- a checkpoint over a dataset -----------------------------------------------------

@dataclass(frozen=True)
class CompileCount:
    """XLA compilations around an evaluation: warming the buckets, then the whole split."""

    before: CompileStats
    warm: CompileStats
    after: CompileStats

    def to_dict(self) -> dict[str, Any]:
        return {"warm_up": self.warm.compilations - self.before.compilations,
                "during_split": self.after.compilations - self.warm.compilations,
                "total": self.after.compilations, "fallbacks": self.after.fallbacks}


class Evaluator:
    """A checkpoint's model on one backend, its eval graph compiled once per bucket shape.

    The model is rebuilt from the config and session list stored in the checkpoint, so a
    dataset is only accepted if it numbers its sessions (day indices) the same way.
    """

    def __init__(self, checkpoint: str | Path, backend: str | None = None, device: str | None = None, *,
                 compile_jobs: int | None = None) -> None:
        """backend: how to compile (default: the one the checkpoint was trained with); compile_jobs:
        openxla's eval graphs compiled at once in the warm-up (default: half the cores; 0: in turn)."""
        self.path = Path(checkpoint)
        self.compile_jobs = default_jobs() if compile_jobs is None else compile_jobs
        self.state, self.cfg = trained_config(self.path)  # the header alone; make_stepper reads the tensors
        self.backend = backend = make_backend(backend or self.cfg.train.backend, device)
        # never stepped: the Stepper's eval graphs are the ones training validates with
        self.stepper = make_stepper(self.cfg, len(self.state.sessions), backend, optimizer=False, weights=self.path)
        backend.sync()  # run what construction queued, so warm-up traces the steady-state graphs

    def check_dataset(self, data: Dataset) -> None:
        """Refuse a dataset whose session list differs: day indices would pick the wrong day layers."""
        ours, theirs = self.state.sessions, data.sessions
        if ours == theirs:
            return
        only_ckpt = sorted(set(ours) - set(theirs))
        only_data = sorted(set(theirs) - set(ours))
        detail = (f"only in the checkpoint: {only_ckpt[:5]}, only in the dataset: {only_data[:5]}"
                  if only_ckpt or only_data else "same sessions in a different order")
        raise CheckpointError(
                 f"{self.path} was trained on {len(ours)} sessions, the dataset lists {len(theirs)} ({detail}), "
                 "so day indices would select other sessions' day layers: evaluate on data preprocessed from "
                 "the same session folders the checkpoint was trained on"
             )

    def warm_up(self, buckets: list[BucketShape], *, log_probs: bool, progress: bool = True) -> None:
        """Compile each bucket's eval graph before any real batch (`b2t.train.warmup.warm_up`, the
        recipe training uses too)."""
        report = WarmUpReport.for_backend(self.backend, bar=progress)
        warm_up(self.stepper, buckets, report, log_probs=log_probs, jobs=self.compile_jobs)
        report.close(len(buckets))

    def run(self, data: Dataset, split: str, *, log_probs: bool = False,
            progress: bool = True) -> tuple[list[TrialResult], CompileCount]:
        """Every trial of `split` once, in the competition's order, and the compilations it took."""
        self.check_dataset(data)
        before = self.backend.stats()
        self.warm_up(data.buckets, log_probs=log_probs, progress=progress)
        warm = self.backend.stats()
        stream = data.eval_batches(split, StreamConfig(num_workers=self.cfg.train.num_workers))
        batches = progress_bar(stream, total=data.n_batches(split), desc=f"{split} batches", unit="batch",
                               disable=not progress)
        step = self.stepper.log_probs_step if log_probs else self.stepper.eval_step
        results = competition_order(decode_batches(step, batches), data.sessions)
        return results, CompileCount(before, warm, self.backend.stats())
