"""Fixtures several test files share: a test module that needs them declares
`pytest_plugins = ["tests.fixtures"]` (and imports from here only under TYPE_CHECKING, so
pytest can still rewrite this module's asserts).

`trained_run` trains the tiny model once per pytest session on an easy synthetic dataset
(few sessions, little per-session drift) so evaluation tests have a checkpoint that
decodes well above chance within a CI-sized run. It lives here rather than in the
suite-wide conftest because only the evaluation tests need it; loaded as a plugin it is
one fixture for the whole session, so the training happens once. `second_checkpoint` (the
same recipe with another seed, an ensemble's second member) and `causal_lm` (a tiny GPT-2
trained on the synthetic corpus, saved as `b2t-eval --rescore` reads it) build on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from b2t.cli.lm import main as lm_main
from b2t.config import TINY_CONFIG, load_config
from b2t.train.loop import RunOptions, train
from preprocess.cli import main as preprocess_main
from preprocess.synth import main as synth_main

SYNTH_ARGS = ("--sessions", "2", "--train-trials", "40", "--val-trials", "10", "--test-trials", "10",
              "--words", "2", "5", "--rest-bins", "5", "10", "--noise-std", "0.3", "--drift-std", "0.1",
              "--offset-std", "0.1", "--seed", "3")
TRAIN_STEPS = 50
DATA_OVERRIDES = ("data.batch_size=8", "data.epochs=1")
TRAIN_OVERRIDES = ("train.backend=eager", f"train.steps={TRAIN_STEPS}", f"train.val_every={TRAIN_STEPS}",
                   f"train.checkpoint_every={TRAIN_STEPS}", "train.log_every=10", "optim.warmup_steps=10",
                   f"optim.decay_steps={TRAIN_STEPS}", "optim.lr=0.02", "optim.lr_day=0.02")
"""Tiny with 8-row batches and a short, hot schedule: about 0.1-0.2 val PER after 50 steps."""


@dataclass(frozen=True)
class TrainedRun:
    hdf5: Path  # the b2t-synth tree (session folders, lexicon.txt, corpus.txt)
    shards: Path  # its b2t-preprocess output
    checkpoint: Path  # best.safetensors after TRAIN_STEPS steps
    lexicon: Path
    lm: Path  # a 3-gram KenLM binary model of corpus.txt (as `make demo` builds)
    summary: dict  # what `train` returned (best_per, compilations, ...)


def _invoke(command, *args: object) -> str:
    result = CliRunner().invoke(command, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


def build_trained_run(root: Path) -> TrainedRun:
    hdf5, shards = root / "hdf5_data_final", root / "shards"
    _invoke(synth_main, hdf5, *SYNTH_ARGS)
    _invoke(preprocess_main, hdf5, shards, "--config", TINY_CONFIG, *(a for o in DATA_OVERRIDES for a in ("--set", o)),
            "--no-progress")
    _invoke(lm_main, "build", hdf5 / "corpus.txt", "-o", root / "lm.bin")
    cfg = load_config(TINY_CONFIG, DATA_OVERRIDES + TRAIN_OVERRIDES)
    summary = train(shards, root / "run", cfg, RunOptions(progress=False))
    return TrainedRun(hdf5=hdf5, shards=shards, checkpoint=root / "run" / "best.safetensors",
                      lexicon=hdf5 / "lexicon.txt", lm=root / "lm.bin", summary=summary)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> TrainedRun:
    return build_trained_run(tmp_path_factory.mktemp("trained_run"))


@pytest.fixture(scope="session")
def second_checkpoint(trained_run: TrainedRun, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same recipe on the same shards with another train.seed: an ensemble's second member."""
    cfg = load_config(TINY_CONFIG, DATA_OVERRIDES + TRAIN_OVERRIDES + ("train.seed=1",))
    run = tmp_path_factory.mktemp("second_run") / "run"
    train(trained_run.shards, run, cfg, RunOptions(progress=False))
    return run / "best.safetensors"


CAUSAL_LM_STEPS = 150
"""Enough for the tiny GPT-2 to prefer the corpus's word pairs (a few seconds on one core)."""


@pytest.fixture(scope="session")
def causal_lm(trained_run: TrainedRun, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer GPT-2 with a word-level tokenizer trained on the synthetic corpus, saved with
    save_pretrained: what `b2t-eval --rescore DIR` loads."""
    from tests.tiny_causal_lm import train_causal_lm

    sentences = (trained_run.hdf5 / "corpus.txt").read_text().splitlines()
    return train_causal_lm(sentences, tmp_path_factory.mktemp("causal_lm") / "lm", steps=CAUSAL_LM_STEPS)
