"""`b2t-synth`: a synthetic dataset in exactly the Brain-to-Text '25 HDF5 layout.

No machine here can download the real data, yet the preprocessor, the trainer, the demo and
the tests need files in its exact layout (docs/data-format.md) holding structure a
decoder can learn: sentences come from a seeded word bigram model over a built-in vocabulary
(so an n-gram LM has something to learn too), each phoneme has its own 512-channel pattern
held for a few bins plus noise, and each session mixes and shifts the channels its own way
(a near-identity matrix and an offset), so the per-day input layers matter. Optionally
(`--structured-noise-rank`) each trial also carries a slowly drifting low-rank non-speech
component, something for a model that separates noise from speech to separate.
`--preset realistic` (`preprocess.synth_realistic`) makes data on which decoders need far
more steps: low SNR, coarticulated and overlapping phonemes, drift growing with the days
between sessions, block offsets and a structured non-speech component. `--ground-truth`
writes each trial's parts (speech, offset, non-speech; noise is the rest) to `ground_truth.hdf5` beside
the session folders (docs/data-format.md), for measuring what a model separates.

Everything is derived from `--seed` through independent random streams (one per purpose,
session and split), so the same seed gives byte-identical files, and changing the number of
test trials does not change the training data. Lengths follow from the sentences: the
defaults give about 70-400 bins (median about 190; 6-45 phonemes), quick for CI; for the
real data's range use `--words 4 16 --bins-per-phoneme 12 32 --rest-bins 20 100`, which
gives about 350-1,900 bins (median about 1,050) and phoneme sequences up to about 80.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import date, timedelta
from functools import partial
from importlib.resources import files
from pathlib import Path
from typing import Any

import click
import h5py
import numpy as np

from b2t.cli_errors import Command
from b2t.contract import FEATURE_DIM
from b2t.phonemes import N_CLASSES, PHONEME_IDS, PHONEMES, SILENCE_ID
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

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {', '.join(PRESETS)}, got {self.preset!r}")
        for name in ("words", "bins_per_phoneme", "rest_bins"):
            lo, hi = getattr(self, name)
            if not 0 <= lo <= hi:
                raise ValueError(f"{name} must be a range lo <= hi with lo >= 0, got {(lo, hi)}")
        if self.words[0] < 1 or self.bins_per_phoneme[0] < 1:
            raise ValueError("words and bins_per_phoneme must start at 1 or more")
        if self.sessions < 1 or self.train_trials < 1 or min(self.val_trials, self.test_trials) < 0:
            raise ValueError("need at least 1 session and 1 train trial per session; val/test counts >= 0")
        if self.trials_per_block < 1 or self.corpus_sentences < 0:
            raise ValueError("trials_per_block must be at least 1 and corpus_sentences at least 0")
        if min(self.noise_std, self.drift_std, self.offset_std) < 0:
            raise ValueError("noise_std, drift_std and offset_std must be >= 0")
        if not 0 <= self.structured_noise_rank <= FEATURE_DIM:
            raise ValueError(f"structured_noise_rank must be 0 (off) to {FEATURE_DIM}, got {self.structured_noise_rank}")
        if not (self.structured_noise_std >= 0 and self.structured_noise_timescale > 0):
            raise ValueError(
                "structured_noise_std must be >= 0 and structured_noise_timescale > 0 (bins), "
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


@dataclass(frozen=True)
class WordModel:
    """A sparse word bigram model: where a sentence starts, and which words follow which."""

    words: tuple[str, ...]
    start: np.ndarray  # (V,) probabilities
    successors: np.ndarray  # (V, K) word indices
    weights: np.ndarray  # (V, K) probabilities, each row sums to 1


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


def sample_sentence(model: WordModel, rng: np.random.Generator, n_words: tuple[int, int]) -> tuple[str, ...]:
    n = int(rng.integers(n_words[0], n_words[1] + 1))
    w = int(rng.choice(len(model.words), p=model.start))
    out = [w]
    for _ in range(n - 1):
        w = int(rng.choice(model.successors[w], p=model.weights[w]))
        out.append(w)
    return tuple(model.words[i] for i in out)


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
    spec: SynthSpec, day: int, split: str, model: WordModel, lexicon: dict[str, tuple[int, ...]], patterns: np.ndarray
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
        words = sample_sentence(model, rng, spec.words)
        labels = sentence_phonemes(words, lexicon)
        block, trial = divmod(first + i, spec.trials_per_block)
        parts = trial_parts(labels, recorded, rng, spec)
        if spec.structured_noise_rank:
            parts = replace(parts, nonspeech=structured_noise(len(parts.speech), subspace, noise_rng, spec))
        yield SynthTrial(parts.total(), words, labels, block + 1, trial, parts)


def write_dataset(spec: SynthSpec, out: Path) -> SynthSummary:
    """Write the whole dataset into `out` (absent or empty); returns summary figures.

    lexicon.txt lists the words of every sentence drawn, the test trials' (whose text is not
    written) and corpus.txt's included, so a decoder's lexicon covers the test set.
    """
    lexicon = load_lexicon()
    model = build_word_model(list(lexicon), _rng(spec.seed, 0))
    generate: Callable[[int, str], Iterator[SynthTrial]]
    if spec.preset == "realistic":
        from preprocess import synth_realistic  # it builds on this module's helpers

        tables = synth_realistic.speech_tables(_rng(spec.seed, 1))
        generate = partial(synth_realistic.generate_trials, spec, model=model, lexicon=lexicon, tables=tables)
    else:
        generate = partial(generate_trials, spec, model=model, lexicon=lexicon,
                           patterns=phoneme_patterns(_rng(spec.seed, 1)))
    lengths: list[int] = []
    label_lens: list[int] = []
    used: set[str] = set()
    out.mkdir(parents=True)
    with contextlib.ExitStack() as stack:
        truth = stack.enter_context(h5py.File(out / GROUND_TRUTH_NAME, "w")) if spec.ground_truth else None
        for day, session in enumerate(session_names(spec)):
            (out / session).mkdir()
            for split, name in SPLIT_FILES.items():
                if spec.trials()[split] == 0:
                    continue
                with h5py.File(out / session / name, "w") as f:
                    for i, t in enumerate(generate(day, split)):
                        labelled = split != "test"
                        g = write_trial(f, i, t.features, session=session, block=t.block, trial=t.trial,
                                        labels=t.labels if labelled else None,
                                        sentence=" ".join(t.words) if labelled else None)
                        if truth is not None:
                            parts = truth.create_group(f"{session}/{split}/{g.name.lstrip('/')}")
                            for part in TRUTH_PARTS:
                                parts.create_dataset(part, data=getattr(t.parts, part))
                        lengths.append(len(t.features))
                        label_lens.append(len(t.labels))
                        used.update(t.words)
    corpus_rng = _rng(spec.seed, 5)
    corpus = [sample_sentence(model, corpus_rng, spec.words) for _ in range(spec.corpus_sentences)]
    used.update(w for s in corpus for w in s)
    (out / "corpus.txt").write_text("".join(" ".join(s) + "\n" for s in corpus))
    (out / "lexicon.txt").write_text(
        "".join(f"{w} {' '.join(PHONEMES[p] for p in lexicon[w])}\n" for w in lexicon if w in used)
    )
    (out / SPEC_NAME).write_text(json.dumps(asdict(spec), indent=1) + "\n")
    return SynthSummary(
        trials=len(lengths),
        bins=(min(lengths), int(np.median(lengths)), max(lengths)),
        phonemes=(min(label_lens), max(label_lens)),
        words=len(used),
        bytes=sum(p.stat().st_size for p in out.rglob("*") if p.is_file()),
    )


def read_spec(out: Path) -> SynthSpec | None:
    """The spec a finished dataset in `out` was written with (None if `out` holds none)."""
    path = out / SPEC_NAME
    if not path.is_file():
        return None
    d = json.loads(path.read_text())
    return SynthSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


@click.command(cls=Command)
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--sessions", default=SynthSpec.sessions, show_default=True, help="Session directories (days).")
@click.option("--train-trials", default=SynthSpec.train_trials, show_default=True, help="Per session.")
@click.option("--val-trials", default=SynthSpec.val_trials, show_default=True, help="Per session (0: no file).")
@click.option("--test-trials", default=SynthSpec.test_trials, show_default=True, help="Per session (0: no file).")
@click.option("--seed", default=SynthSpec.seed, show_default=True)
@click.option("--words", nargs=2, type=int, default=SynthSpec.words, show_default=True, help="Words per sentence.")
@click.option("--bins-per-phoneme", nargs=2, type=int, default=SynthSpec.bins_per_phoneme, show_default=True,
              help="Bins each phoneme is held (longer trials: see the module docstring).")
@click.option("--rest-bins", nargs=2, type=int, default=SynthSpec.rest_bins, show_default=True,
              help="Rest bins before and after the sentence.")
@click.option("--noise-std", default=SynthSpec.noise_std, show_default=True, help="Higher is harder to decode.")
@click.option("--drift-std", default=SynthSpec.drift_std, show_default=True, help="Per-session channel mixing.")
@click.option("--offset-std", default=SynthSpec.offset_std, show_default=True, help="Per-session channel offset.")
@click.option("--corpus-sentences", default=SynthSpec.corpus_sentences, show_default=True)
@click.option(
    "--structured-noise-rank",
    default=SynthSpec.structured_noise_rank,
    metavar="K",
    show_default=True,
    help="Add a slowly drifting rank-K non-speech component to every trial (0: off), in a "
    "per-session channel subspace with per-trial loadings: something for a noise-separating "
    "model to estimate and subtract.",
)
@click.option(
    "--structured-noise-std",
    default=SynthSpec.structured_noise_std,
    metavar="S",
    show_default=True,
    help="Its std per bin and channel (the phoneme patterns have std 1, the white noise --noise-std).",
)
@click.option(
    "--structured-noise-timescale",
    default=SynthSpec.structured_noise_timescale,
    metavar="N",
    show_default=True,
    help="Its correlation time in bins (lag-1 autocorrelation exp(-1/N)): longer than a "
    "phoneme, so it is told apart by being slow.",
)
@click.option(
    "--preset",
    type=click.Choice(list(PRESETS)),
    default=SynthSpec.preset,
    show_default=True,
    help="realistic: low SNR, coarticulated overlapping phonemes, drift growing with the days between "
    "sessions, block offsets, non-speech with a part shared across trials (preprocess/synth_realistic.py); "
    "its defaults: --noise-std 0.5 --drift-std 0.1 --offset-std 0.1 --structured-noise-rank 4 "
    "(drift and offset per sqrt(day)); options given explicitly win.",
)
@click.option("--ground-truth", is_flag=True, help=f"Also write each trial's speech, offset and non-speech parts "
              f"to OUT/{GROUND_TRUTH_NAME} (docs/data-format.md); the rest of its features is white noise.")
@click.option(
    "--overwrite", is_flag=True, help="Replace an earlier b2t-synth dataset in OUT written with other options."
)
@click.pass_context
def main(ctx: click.Context, out: Path, overwrite: bool, **options: Any) -> None:
    """Write a synthetic Brain-to-Text dataset (session dirs of data_{train,val,test}.hdf5,
    lexicon.txt, corpus.txt) into OUT. Re-running with the same options does nothing."""
    for name, value in PRESETS[options["preset"]].items():
        if ctx.get_parameter_source(name) is click.core.ParameterSource.DEFAULT:
            options[name] = value
    try:
        spec = SynthSpec(**options)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    if out.exists() and any(out.iterdir()):
        previous = read_spec(out)
        if previous == spec:
            click.echo(f"{out}: already holds this synthetic dataset, nothing to do")
            return
        if previous is None or not overwrite:
            why = (
                "was written with other options (pass --overwrite)"
                if previous
                else "exists and is not a b2t-synth dataset"
            )
            raise click.UsageError(f"{out} {why}")
    # Write beside OUT and rename at the end, so OUT is either absent, old, or complete.
    partial = out.resolve().with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    summary = write_dataset(spec, partial)
    if out.exists():
        shutil.rmtree(out)
    partial.rename(out)
    click.echo(
        f"{out}: {spec.sessions} sessions, {summary.trials} trials "
        f"({spec.train_trials}/{spec.val_trials}/{spec.test_trials} train/val/test per session); "
        f"bins min/median/max {'/'.join(map(str, summary.bins))}; "
        f"phonemes per trial {summary.phonemes[0]}-{summary.phonemes[1]}; "
        f"{summary.words} words in lexicon.txt, {spec.corpus_sentences} sentences in corpus.txt; "
        f"{summary.bytes / 1e6:.1f} MB"
    )
