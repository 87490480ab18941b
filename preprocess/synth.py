"""`b2t-synth`: a synthetic dataset in exactly the Brain-to-Text '25 HDF5 layout.

No machine here can download the real data, yet the preprocessor, the trainer, the demo and
the tests need files in its exact layout (docs/data-format.md) holding structure a
decoder can learn: sentences come from a seeded word bigram model over a built-in vocabulary
(so an n-gram LM has something to learn too; `--text topics` gives them long-range structure
that a 3-gram misses and a neural LM does not, `preprocess.synth_text`), each phoneme has its own 512-channel pattern
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
from collections.abc import Callable, Iterator
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import click
import h5py
import numpy as np

from b2t.cli.rule import Command
from b2t.errors import UsageError
from b2t.phonemes import PHONEMES
from preprocess.hdf5_source import SPLIT_FILES
from preprocess.synth_core import (
    GROUND_TRUTH_NAME,
    PRESETS,
    SPEC_NAME,
    TEXTS,
    TRUTH_PARTS,
    SynthSpec,
    SynthSummary,
    SynthTrial,
    TextModel,
    _rng,
    build_word_model,
    generate_trials,
    load_lexicon,
    phoneme_patterns,
    preset_spec,
    session_days,
    session_names,
    write_trial,
)
from preprocess.synth_text import build_text_model

__all__ = [
    "build_text_model",
    "build_word_model",
    "draw_corpus",
    "GROUND_TRUTH_NAME",
    "load_lexicon",
    "main",
    "preset_spec",
    "read_spec",
    "session_days",
    "split_sentences",
    "SPEC_NAME",
    "SynthSpec",
    "TRUTH_PARTS",
    "write_dataset",
    "write_trial",
]
"""What callers import from here; the generators' parts live in `preprocess.synth_core`."""


def write_dataset(spec: SynthSpec, out: Path) -> SynthSummary:
    """Write the whole dataset into `out` (absent or empty); returns summary figures.

    lexicon.txt lists the words of every sentence drawn, the test trials' (whose text is not
    written) and corpus.txt's included, so a decoder's lexicon covers the test set.
    """
    lexicon = load_lexicon()
    model = build_text_model(spec, list(lexicon))
    generate = _trial_generator(spec, model, lexicon)
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
    corpus = draw_corpus(spec, model)
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


def _trial_generator(spec: SynthSpec, model: TextModel,
                     lexicon: dict[str, tuple[int, ...]]) -> Callable[[int, str], Iterator[SynthTrial]]:
    """(day, split) -> that split's trials of that session, as the spec's preset makes them."""
    if spec.preset == "realistic":
        from preprocess import synth_realistic  # it builds on this module's helpers

        tables = synth_realistic.speech_tables(_rng(spec.seed, 1))
        return partial(synth_realistic.generate_trials, spec, model=model, lexicon=lexicon, tables=tables)
    return partial(generate_trials, spec, model=model, lexicon=lexicon, patterns=phoneme_patterns(_rng(spec.seed, 1)))


def draw_corpus(spec: SynthSpec, model: TextModel | None = None, n: int | None = None) -> list[tuple[str, ...]]:
    """corpus.txt's sentences (`n` of them; default spec.corpus_sentences), from the spec's text
    model: a larger `n` draws the same sentences first, then more (an LM that has read more text)."""
    if model is None:
        model = build_text_model(spec, list(load_lexicon()))
    rng = _rng(spec.seed, 5)
    return [model.sample(rng, spec.words) for _ in range(spec.corpus_sentences if n is None else n)]


def split_sentences(spec: SynthSpec, split: str) -> dict[tuple[str, int, int], str]:
    """(session, block, trial) -> sentence of every trial of `split`, drawn again from the spec.

    The test files carry no sentences, as the competition's; this is how a submission on
    synthetic data is scored all the same (the trials are regenerated, features and all).
    """
    lexicon = load_lexicon()
    generate = _trial_generator(spec, build_text_model(spec, list(lexicon)), lexicon)
    return {(session, t.block, t.trial): " ".join(t.words)
            for day, session in enumerate(session_names(spec)) for t in generate(day, split)}
def foreign_entries(out: Path, spec: SynthSpec) -> list[str]:
    """What `out` holds beyond the dataset `write_dataset(spec, out)` wrote (paths relative to it):
    the user's own files, which `--overwrite` must not delete with the dataset."""
    ours = {"corpus.txt", "lexicon.txt", SPEC_NAME, GROUND_TRUTH_NAME}
    sessions = set(session_names(spec))
    found = []
    for entry in sorted(out.iterdir()):
        if entry.name in sessions and entry.is_dir() and not entry.is_symlink():
            found += [f"{entry.name}/{p.name}" for p in sorted(entry.iterdir()) if p.name not in SPLIT_FILES.values()]
        elif entry.name not in ours:
            found.append(entry.name)
    return found


def read_spec(out: Path) -> SynthSpec | None:
    """The spec a finished dataset in `out` was written with (None if `out` holds none, or a
    spec file no b2t-synth wrote: damaged, or from another version)."""
    path = out / SPEC_NAME
    if not path.is_file():
        return None
    try:
        return SynthSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(path.read_bytes()).items()})
    except (ValueError, TypeError, AttributeError):  # not JSON, not an object, unknown or bad fields
        return None


@click.command(cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--sessions", default=SynthSpec.sessions, show_default=True, help="Session directories (days).")
@click.option("--train-trials", default=SynthSpec.train_trials, show_default=True, help="Per session.")
@click.option("--val-trials", default=SynthSpec.val_trials, show_default=True, help="Per session (0: no file).")
@click.option("--test-trials", default=SynthSpec.test_trials, show_default=True, help="Per session (0: no file).")
@click.option("--seed", type=click.IntRange(min=0), default=SynthSpec.seed, show_default=True)
@click.option("--words", nargs=2, type=int, default=SynthSpec.words, show_default=True, help="Words per sentence.")
@click.option("--bins-per-phoneme", nargs=2, type=int, default=SynthSpec.bins_per_phoneme, show_default=True,
              help="Bins each phoneme is held (longer trials: see the module docstring).")
@click.option("--rest-bins", nargs=2, type=int, default=SynthSpec.rest_bins, show_default=True,
              help="Rest bins before and after the sentence.")
@click.option("--noise-std", default=SynthSpec.noise_std, show_default=True, help="Higher is harder to decode.")
@click.option("--drift-std", default=SynthSpec.drift_std, show_default=True, help="Per-session channel mixing.")
@click.option("--offset-std", default=SynthSpec.offset_std, show_default=True, help="Per-session channel offset.")
@click.option("--corpus-sentences", default=SynthSpec.corpus_sentences, show_default=True,
              help="Sentences of corpus.txt, the text `b2t-lm build` makes an n-gram LM of (0: an empty corpus.txt, "
                   "for data decoded without one).")
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
@click.option(
    "--text",
    type=click.Choice(list(TEXTS)),
    default=SynthSpec.text,
    show_default=True,
    help="The sentences' text model. bigram: a word bigram, which a 3-gram LM of corpus.txt captures whole. "
    "topics: each sentence about one of 8 topics, its content words 3 apart with function words between, "
    "so a 3-gram never sees the topic and a neural LM of the sentence does (preprocess/synth_text.py).",
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
    except UsageError as e:
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
        if foreign := foreign_entries(out, previous):
            shown = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
            entries = f"{len(foreign)} {'entry' if len(foreign) == 1 else 'entries'}"
            raise click.UsageError(f"{out} holds {entries} b2t-synth did not write ({shown}): "
                                   "--overwrite replaces only its own dataset; move them out of OUT, or choose another OUT")
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
