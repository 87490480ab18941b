"""The synthetic dataset's parts: its spec, word model, phoneme and noise generators and the
basic trial generator (`b2t-synth` writes them in `preprocess.synth`; the realistic preset,
`preprocess.synth_realistic`, builds on these)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import date, timedelta
from importlib.resources import files
from typing import Any, Protocol

import h5py
import numpy as np

from b2t.contract import FEATURE_DIM
from b2t.errors import UsageError
from b2t.phonemes import N_CLASSES, PHONEME_IDS, SILENCE_ID
from preprocess.hdf5_source import SPLIT_FILES

LABEL_WIDTH = 500
"""Width of `seq_class_ids` and `transcription` in the real files (zero padded)."""
FIRST_DAY = date(2023, 8, 11)
SPEC_NAME = "synth.json"  # written last: its presence marks a finished dataset
GROUND_TRUTH_NAME = "ground_truth.hdf5"  # beside the session folders: no session file, no folder
TRUTH_PARTS = ("speech", "offset", "nonspeech")  # the noise is the rest: features - speech - offset - nonspeech
PRESETS: dict[str, dict[str, Any]] = {
    "basic": {},
    "realistic": {"noise_std": 0.5, "drift_std": 0.1, "offset_std": 0.1, "structured_noise_rank": 4},
}
"""Each preset's defaults for the general options (any option given explicitly wins)."""
TEXTS = ("bigram", "topics")
"""The text models `--text` chooses from (`preprocess.synth_text`)."""


@dataclass(frozen=True)
class SynthSpec:
    sessions: int = 5
    train_trials: int = 48  # per session
    val_trials: int = 12
    test_trials: int = 12
    seed: int = 0
    words: tuple[int, int] = (2, 8)  # words per sentence, inclusive range
    bins_per_phoneme: tuple[int, int] = (5, 9)  # inclusive range, drawn per phoneme
    rest_bins: tuple[int, int] = (10, 30)  # leading and trailing rest, drawn per trial end
    noise_std: float = 0.5  # per bin and channel; the phoneme patterns have std 1
    drift_std: float = 0.5  # per-session mixing matrix = I + drift_std * N(0, 1/F)
    offset_std: float = 0.5  # per-session channel offset
    trials_per_block: int = 20
    corpus_sentences: int = 3000  # written to corpus.txt for an n-gram LM
    structured_noise_rank: int = 0  # K drifting latents per trial; 0 = off (the files as before)
    structured_noise_std: float = 1.0  # of the added component, relative to the patterns' std 1
    structured_noise_timescale: float = 50.0  # bins; the latents' lag-1 autocorrelation is exp(-1/this)
    preset: str = "basic"  # how speech, drift and offsets are made (PRESETS)
    ground_truth: bool = False  # also write GROUND_TRUTH_NAME
    text: str = "bigram"  # the sentences' text model (TEXTS; preprocess.synth_text)

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise UsageError(f"preset must be one of {', '.join(PRESETS)}, got {self.preset!r}")
        if self.text not in TEXTS:
            raise UsageError(f"text must be one of {', '.join(TEXTS)}, got {self.text!r}")
        for name in ("words", "bins_per_phoneme", "rest_bins"):
            lo, hi = getattr(self, name)
            if not 0 <= lo <= hi:
                raise UsageError(f"{name} must be a range lo <= hi with lo >= 0, got {(lo, hi)}")
        if self.words[0] < 1 or self.bins_per_phoneme[0] < 1:
            raise UsageError("words and bins_per_phoneme must start at 1 or more")
        if self.sessions < 1 or self.train_trials < 1 or min(self.val_trials, self.test_trials) < 0:
            raise UsageError("need at least 1 session and 1 train trial per session; val/test counts >= 0")
        if self.trials_per_block < 1 or self.corpus_sentences < 0:
            raise UsageError("trials_per_block must be at least 1 and corpus_sentences at least 0")
        stds = {"noise_std": self.noise_std, "drift_std": self.drift_std, "offset_std": self.offset_std}
        if not all(0 <= v < math.inf for v in stds.values()):  # nan fails too
            raise UsageError(f"noise_std, drift_std and offset_std must be finite and >= 0, got {stds}")
        if not 0 <= self.structured_noise_rank <= FEATURE_DIM:
            raise UsageError(f"structured_noise_rank must be 0 (off) to {FEATURE_DIM}, got {self.structured_noise_rank}")
        if not (0 <= self.structured_noise_std < math.inf and 0 < self.structured_noise_timescale < math.inf):
            raise UsageError(
                "structured_noise_std must be finite and >= 0, and structured_noise_timescale finite and > 0 (bins), "
                f"got {self.structured_noise_std} and {self.structured_noise_timescale}"
            )

    def trials(self) -> dict[str, int]:
        return {"train": self.train_trials, "val": self.val_trials, "test": self.test_trials}


def preset_spec(preset: str, **options: Any) -> SynthSpec:
    """The spec of `preset` (its PRESETS defaults), with `options` on top."""
    return SynthSpec(preset=preset, **{**PRESETS[preset], **options})


@dataclass(frozen=True)
class SynthSummary:
    trials: int
    bins: tuple[int, int, int]  # min, median, max trial length
    phonemes: tuple[int, int]  # min, max label length
    words: int  # distinct words used (the lexicon.txt entries)
    bytes: int


class TextModel(Protocol):
    """What draws the sentences (`--text`: `WordModel`, or `preprocess.synth_text.TopicModel`)."""

    def sample(self, rng: np.random.Generator, n_words: tuple[int, int]) -> tuple[str, ...]:
        """One sentence of n_words[0]..n_words[1] words (inclusive, uniform)."""
        ...


@dataclass(frozen=True)
class WordModel:
    """A sparse word bigram model: where a sentence starts, and which words follow which."""

    words: tuple[str, ...]
    start: np.ndarray  # (V,) probabilities
    successors: np.ndarray  # (V, K) word indices
    weights: np.ndarray  # (V, K) probabilities, each row sums to 1

    def sample(self, rng: np.random.Generator, n_words: tuple[int, int]) -> tuple[str, ...]:
        return tuple(self.words[i] for i in self.sample_ids(rng, int(rng.integers(n_words[0], n_words[1] + 1))))

    def sample_ids(self, rng: np.random.Generator, n: int) -> list[int]:
        """n word indices: a start word, then each word's successor."""
        w = int(rng.choice(len(self.words), p=self.start))
        out = [w]
        for _ in range(n - 1):
            w = int(rng.choice(self.successors[w], p=self.weights[w]))
            out.append(w)
        return out


@dataclass(frozen=True)
class Parts:
    """One trial's features part by part, float32; `total()` is the features as written.

    The basic preset folds its session offset into `speech` (the patterns carry it), so its `offset` is zero.
    """

    speech: np.ndarray  # (T, F): the phoneme patterns as the session records them
    offset: np.ndarray  # (F,): session and block offset, constant over the trial
    nonspeech: np.ndarray  # (T, F): the structured non-speech component (zero when off)
    noise: np.ndarray  # (T, F): independent white noise

    def total(self) -> np.ndarray:
        """(T, F) float32: speech + offset + noise + nonspeech, summed in that order."""
        return self.speech + self.offset + self.noise + self.nonspeech


@dataclass(frozen=True)
class SynthTrial:
    features: np.ndarray  # (T, F) float32
    words: tuple[str, ...]
    labels: tuple[int, ...]  # phoneme ids, SIL after every word
    block: int
    trial: int
    parts: Parts


def _rng(seed: int, *stream: int) -> np.random.Generator:
    """An independent random stream for one purpose (and session, split) of one seed."""
    return np.random.default_rng([seed, *stream])


def load_lexicon() -> dict[str, tuple[int, ...]]:
    """The built-in vocabulary: word -> phoneme ids (1..39), in file order."""
    lexicon = {}
    for line in files("preprocess").joinpath("synth_words.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            word, *phones = line.split()
            lexicon[word] = tuple(PHONEME_IDS[p] for p in phones)
    return lexicon


def _zipf(n: int) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1)
    return w / w.sum()


def build_word_model(words: Sequence[str], rng: np.random.Generator, n_successors: int = 8) -> WordModel:
    """Zipf-weighted start words and, per word, a few Zipf-weighted successors (never itself)."""
    v = len(words)
    start = np.zeros(v)
    start[rng.permutation(v)] = _zipf(v)
    successors = np.stack([(w + 1 + rng.choice(v - 1, n_successors, replace=False)) % v for w in range(v)])
    weights = np.tile(_zipf(n_successors), (v, 1))
    return WordModel(tuple(words), start, successors, weights)


def sentence_phonemes(words: Sequence[str], lexicon: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    """Each word's phonemes followed by SIL, as in the real labels (SIL between words and at the end)."""
    return tuple(p for w in words for p in (*lexicon[w], SILENCE_ID))


def phoneme_patterns(rng: np.random.Generator) -> np.ndarray:
    """(N_CLASSES, F): row k is phoneme k's channel pattern; row 0 (blank) is rest, all zero."""
    patterns = rng.standard_normal((N_CLASSES, FEATURE_DIM))
    patterns[0] = 0.0
    return patterns


def session_patterns(patterns: np.ndarray, rng: np.random.Generator, spec: SynthSpec) -> np.ndarray:
    """(N_CLASSES, F): the patterns as one session records them, mixed by a near-identity
    matrix and shifted by an offset of its own (what the per-day input layer must undo)."""
    noise = rng.standard_normal((FEATURE_DIM, FEATURE_DIM)) / np.sqrt(FEATURE_DIM)
    mixing = np.eye(FEATURE_DIM) + spec.drift_std * noise  # (F, F)
    return patterns @ mixing + spec.offset_std * rng.standard_normal(FEATURE_DIM)


def trial_parts(labels: Sequence[int], patterns: np.ndarray, rng: np.random.Generator, spec: SynthSpec) -> Parts:
    """Rest, each phoneme's (session) pattern held for a few bins, rest; plus noise (no non-speech yet)."""
    durations = rng.integers(spec.bins_per_phoneme[0], spec.bins_per_phoneme[1] + 1, len(labels))
    lead, trail = rng.integers(spec.rest_bins[0], spec.rest_bins[1] + 1, 2)
    ids = np.concatenate([np.zeros(lead, int), np.repeat(labels, durations), np.zeros(trail, int)])  # (T,)
    noise = rng.standard_normal((len(ids), FEATURE_DIM), dtype=np.float32)  # (T, F)
    zeros = np.zeros((len(ids), FEATURE_DIM), np.float32)
    return Parts(patterns[ids].astype(np.float32), np.zeros(FEATURE_DIM, np.float32), zeros,
                 np.float32(spec.noise_std) * noise)


def noise_subspace(rng: np.random.Generator, spec: SynthSpec) -> np.ndarray:
    """(K, F) orthonormal rows: the channel directions one session's non-speech drift lives in.

    Per session, like a recording day's own sources of drift, so a model can learn it from
    that day's data; `structured_noise` varies the loadings within it per trial.
    """
    q, _ = np.linalg.qr(rng.standard_normal((FEATURE_DIM, spec.structured_noise_rank)))
    return q.T


def drifting_latents(n_bins: int, k: int, timescale: float, rng: np.random.Generator) -> np.ndarray:
    """(n_bins, k): independent stationary unit-variance AR(1) (sampled Ornstein-Uhlenbeck)
    time courses, lag-1 autocorrelation exp(-1/timescale), so they drift over ~timescale bins."""
    phi = np.exp(-1.0 / timescale)
    z = rng.standard_normal((n_bins, k))
    z[1:] *= np.sqrt(1.0 - phi**2)  # z[0] is already a draw from the stationary N(0, 1)
    for t in range(1, n_bins):
        z[t] += phi * z[t - 1]
    return z


def structured_noise(n_bins: int, subspace: np.ndarray, rng: np.random.Generator, spec: SynthSpec) -> np.ndarray:
    """(T, F) float32 of rank K: drifting latents times this trial's loadings, K orthonormal
    directions at a random rotation within the session's subspace, each with its own strength.

    Which directions move, and how strongly, changes from trial to trial, so no fixed per-day
    correction subtracts it (short of projecting the subspace away, and the speech in it). Its
    std per bin and channel is `structured_noise_std` in expectation; a trial's own varies with
    its latents' finite-sample power.
    """
    k = spec.structured_noise_rank
    q, r = np.linalg.qr(rng.standard_normal((k, k)))
    rotation = q * np.sign(np.diag(r))  # uniform over rotations
    strength = rng.uniform(0.5, 1.5, k)
    strength *= spec.structured_noise_std * np.sqrt(FEATURE_DIM / (strength**2).sum())
    loadings = strength[:, None] * rotation @ subspace  # (K, F); sum of squares = std^2 * F
    return (drifting_latents(n_bins, k, spec.structured_noise_timescale, rng) @ loadings).astype(np.float32)


def write_trial(
    f: h5py.File,
    index: int,
    features: np.ndarray,
    *,
    session: str,
    block: int,
    trial: int,
    labels: Sequence[int] | None = None,
    sentence: str | None = None,
) -> h5py.Group:
    """Write group `trial_{index:04d}` in the real layout; without labels it is a test trial.

    It does not validate, so tests use it to build bad trials too.
    """
    g = f.create_group(f"trial_{index:04d}")
    g.create_dataset("input_features", data=features)
    g.attrs["n_time_steps"] = np.int64(len(features))
    g.attrs["session"] = session
    g.attrs["block_num"] = np.int64(block)
    g.attrs["trial_num"] = np.int64(trial)
    if labels is not None:
        text = np.frombuffer((sentence or "").encode("ascii"), np.uint8)
        if max(len(labels), len(text)) > LABEL_WIDTH:
            raise ValueError(f"labels ({len(labels)}) and sentence ({len(text)}) must fit {LABEL_WIDTH} slots")
        g.create_dataset("seq_class_ids", data=_padded(labels))
        g.create_dataset("transcription", data=_padded(text))
        g.attrs["seq_len"] = np.int64(len(labels))
        g.attrs["sentence_label"] = sentence or ""
    return g


def _padded(values: Sequence[int] | np.ndarray) -> np.ndarray:
    out = np.zeros(LABEL_WIDTH, np.int32)
    out[: len(values)] = values
    return out


def session_days(spec: SynthSpec) -> list[int]:
    """Each session's calendar day counted from FIRST_DAY: 0, then 1-7 days apart."""
    return [int(d) for d in np.concatenate([[0], _rng(spec.seed, 4).integers(1, 8, spec.sessions - 1)]).cumsum()]


def session_names(spec: SynthSpec) -> list[str]:
    """`t15.YYYY.MM.DD` on `session_days`, so name order is date order."""
    return [(FIRST_DAY + timedelta(days=d)).strftime("t15.%Y.%m.%d") for d in session_days(spec)]


def generate_trials(
    spec: SynthSpec, day: int, split: str, model: TextModel, lexicon: dict[str, tuple[int, ...]], patterns: np.ndarray
) -> Iterator[SynthTrial]:
    """One split of one session, a trial at a time (so memory stays one trial).

    The structured noise has streams of its own, so switching it on leaves every other draw as it was.
    """
    recorded = session_patterns(patterns, _rng(spec.seed, 2, day), spec)
    splits = list(SPLIT_FILES)
    rng = _rng(spec.seed, 3, day, splits.index(split))
    subspace = noise_subspace(_rng(spec.seed, 6, day), spec)
    noise_rng = _rng(spec.seed, 7, day, splits.index(split))
    counts = spec.trials()
    first = sum(counts[s] for s in splits[: splits.index(split)])  # (block, trial) unique per session
    for i in range(counts[split]):
        words = model.sample(rng, spec.words)
        labels = sentence_phonemes(words, lexicon)
        block, trial = divmod(first + i, spec.trials_per_block)
        parts = trial_parts(labels, recorded, rng, spec)
        if spec.structured_noise_rank:
            parts = replace(parts, nonspeech=structured_noise(len(parts.speech), subspace, noise_rng, spec))
        yield SynthTrial(parts.total(), words, labels, block + 1, trial, parts)
