"""The `realistic` preset of `b2t-synth`: data hard enough to tell decoders, and good changes, apart.

The basic preset holds one fixed full-rank pattern per phoneme at std 1 against white
noise of 0.5, which the tiny decoder learns to near 0 PER in 150 steps; here it is still
near chance after 150 (docs/separation.md has the calibration). With the ground truth
kept part by part (`Parts`: speech + offset + non-speech + noise = the features written):

- speech: low SNR per channel, spread over many channels. Every phoneme pattern lives in
  a `LATENT_DIM`-dimensional subspace (a population code), reaches `TUNED_FRACTION` of the
  channels, at std `SPEECH_STD` per tuned channel (less at the envelope's edges) against
  white noise `--noise-std` (0.5);
- coarticulation: a phoneme's pattern moves from an onset to an offset pattern of its
  own over its duration, plus terms for the phonemes before and after it (`CONTEXT`);
- overlap: each phoneme's raised-cosine envelope reaches `OVERLAP` of its duration into
  each neighbour, so consecutive patterns add up in time;
- drift that grows with the days between sessions: the mixing matrix and the channel
  offset are random walks over calendar days (`--drift-std`, `--offset-std` per sqrt(day)),
  so distant sessions differ more than neighbouring ones;
- block-to-block offsets (`BLOCK_OFFSET_STD` per channel, one draw per block of a session);
- non-speech (with `--structured-noise-rank` K > 0, the preset's default 4): the per-trial
  drifting rank-K component of the basic preset plus a part shared by every trial of a
  session (rank `SHARED_RANK`, the same time course from each trial's start, like a
  cue-evoked response), at `SHARED_STD` times `--structured-noise-std`.

Shape legend: T bins, F = 512 features, C = 41 classes, R = LATENT_DIM.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from b2t.contract import FEATURE_DIM
from b2t.phonemes import N_CLASSES
from preprocess.hdf5_source import SPLIT_FILES
from preprocess.synth_core import (
    Parts,
    SynthSpec,
    SynthTrial,
    TextModel,
    _rng,
    drifting_latents,
    noise_subspace,
    sentence_phonemes,
    session_days,
    structured_noise,
)

SPEECH_STD = 0.7  # per tuned channel, at the middle of a phoneme (white noise: --noise-std)
TUNED_FRACTION = 0.7  # channels that carry speech
LATENT_DIM = 32  # speech patterns live in an R-dimensional subspace of the channels
CONTEXT = 0.4  # strength of the neighbour terms, relative to the phoneme's own pattern
OVERLAP = 0.5  # an envelope reaches this fraction of its phoneme's duration into each neighbour
BLOCK_OFFSET_STD = 0.1  # per channel, one offset per block
SHARED_RANK = 2  # the non-speech part every trial of a session shares
SHARED_STD = 0.5  # of that part, relative to --structured-noise-std


@dataclass(frozen=True)
class SpeechTables:
    """(C, F) each; row 0 (blank: rest, or no neighbour) is zero in every table."""

    onset: np.ndarray  # a phoneme's pattern at its start
    offset: np.ndarray  # ... and at its end (linear in between)
    before: np.ndarray  # added while the phoneme before it is this one (times CONTEXT)
    after: np.ndarray  # added while the phoneme after it is this one (times CONTEXT)


def speech_tables(rng: np.random.Generator) -> SpeechTables:
    """The four tables, through one channel map: latent (C, R) rows -> (R, F), on the tuned channels."""
    channel_map = rng.standard_normal((LATENT_DIM, FEATURE_DIM)) / np.sqrt(LATENT_DIM)  # (R, F)
    channel_map *= rng.random(FEATURE_DIM) < TUNED_FRACTION
    base = rng.standard_normal((N_CLASSES, LATENT_DIM))

    def table(latent: np.ndarray) -> np.ndarray:
        out = SPEECH_STD * latent @ channel_map
        out[0] = 0.0
        return out

    onset, offset = (table((base + 0.6 * rng.standard_normal(base.shape)) / np.sqrt(1.36)) for _ in range(2))
    before, after = (table(CONTEXT * rng.standard_normal(base.shape)) for _ in range(2))
    return SpeechTables(onset, offset, before, after)


def session_drift(spec: SynthSpec, day: int) -> tuple[np.ndarray, np.ndarray]:
    """Session `day`'s mixing matrix (F, F) and channel offset (F,): I and 0 plus random walks
    whose steps have variance proportional to the calendar days since the session before
    (the first session takes one day's step from I)."""
    days = session_days(spec)
    walk, offset = np.zeros((FEATURE_DIM, FEATURE_DIM)), np.zeros(FEATURE_DIM)
    for d in range(day + 1):
        gap = days[d] - days[d - 1] if d else 1
        rng = _rng(spec.seed, 8, d)
        walk += np.sqrt(gap) * rng.standard_normal((FEATURE_DIM, FEATURE_DIM)) / np.sqrt(FEATURE_DIM)
        offset += np.sqrt(gap) * rng.standard_normal(FEATURE_DIM)
    return np.eye(FEATURE_DIM) + spec.drift_std * walk, spec.offset_std * offset


def speech(labels: Sequence[int], durations: np.ndarray, lead: int, n_bins: int, tables: SpeechTables) -> np.ndarray:
    """(T, F): every phoneme's overlapping envelope times its onset-to-offset and context pattern."""
    out = np.zeros((n_bins, FEATURE_DIM))
    starts = lead + np.concatenate([[0], np.cumsum(durations)[:-1]])
    before, after = (0, *labels[:-1]), (*labels[1:], 0)
    for k, d, s, b, a in zip(labels, durations, starts, before, after):
        reach = OVERLAP * d
        t = np.arange(max(0, int(np.floor(s - reach))), min(n_bins, int(np.ceil(s + d + reach))))
        envelope = np.sin(np.pi * (t + 0.5 - (s - reach)) / (d + 2 * reach)) ** 2  # 1 mid-phoneme, 0 at its reach
        u = np.clip((t + 0.5 - s) / d, 0.0, 1.0)[:, None]  # progress through the phoneme
        pattern = (1 - u) * tables.onset[k] + u * tables.offset[k] + tables.before[b] + tables.after[a]
        out[t] += envelope[:, None] * pattern
    return out


def shared_noise(n_bins: int, spec: SynthSpec, day: int) -> np.ndarray:
    """(T, F): the session's shared non-speech part, the first T bins of the same time course in every trial."""
    rng = _rng(spec.seed, 10, day)
    loadings = rng.standard_normal((SHARED_RANK, FEATURE_DIM)) * (SHARED_STD * spec.structured_noise_std
                                                                 / np.sqrt(SHARED_RANK))
    # a fresh stream of the same seed per trial: row t of the latents depends on draws 0..t only
    return drifting_latents(n_bins, SHARED_RANK, spec.structured_noise_timescale, _rng(spec.seed, 11, day)) @ loadings


def generate_trials(spec: SynthSpec, day: int, split: str, model: TextModel,
                    lexicon: dict[str, tuple[int, ...]], tables: SpeechTables) -> Iterator[SynthTrial]:
    """One split of one session in the realistic preset, a trial at a time, with its `Parts`."""
    mixing, session_offset = session_drift(spec, day)
    recorded = SpeechTables(*(t @ mixing for t in (tables.onset, tables.offset, tables.before, tables.after)))
    splits = list(SPLIT_FILES)
    rng = _rng(spec.seed, 3, day, splits.index(split))
    subspace = noise_subspace(_rng(spec.seed, 6, day), spec)
    noise_rng = _rng(spec.seed, 7, day, splits.index(split))
    counts = spec.trials()
    first = sum(counts[s] for s in splits[: splits.index(split)])
    for i in range(counts[split]):
        words = model.sample(rng, spec.words)
        labels = sentence_phonemes(words, lexicon)
        block, trial = divmod(first + i, spec.trials_per_block)
        durations = rng.integers(spec.bins_per_phoneme[0], spec.bins_per_phoneme[1] + 1, len(labels))
        lead, trail = rng.integers(spec.rest_bins[0], spec.rest_bins[1] + 1, 2)
        n_bins = int(lead + durations.sum() + trail)
        block_offset = BLOCK_OFFSET_STD * _rng(spec.seed, 9, day, block).standard_normal(FEATURE_DIM)
        nonspeech = np.zeros((n_bins, FEATURE_DIM), np.float32)
        if spec.structured_noise_rank:
            nonspeech += structured_noise(n_bins, subspace, noise_rng, spec)
            nonspeech += shared_noise(n_bins, spec, day).astype(np.float32)
        parts = Parts(
            speech=speech(labels, durations, int(lead), n_bins, recorded).astype(np.float32),
            offset=(session_offset + block_offset).astype(np.float32),
            nonspeech=nonspeech,
            noise=np.float32(spec.noise_std) * rng.standard_normal((n_bins, FEATURE_DIM), dtype=np.float32),
        )
        yield SynthTrial(parts.total(), words, labels, block + 1, trial, parts)
