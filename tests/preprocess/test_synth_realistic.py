"""b2t-synth --preset realistic: the parts it is made of, and the ground truth it writes beside the data."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from preprocess import synth_realistic as realistic
from preprocess.hdf5_source import discover_sessions, empty_folders
from preprocess.synth import (
    GROUND_TRUTH_NAME,
    TRUTH_PARTS,
    SynthSpec,
    build_word_model,
    load_lexicon,
    main,
    preset_spec,
    read_spec,
    session_days,
    write_dataset,
)

SPEC = preset_spec("realistic", sessions=2, train_trials=3, val_trials=2, test_trials=1, corpus_sentences=0, words=(1, 3),
                   trials_per_block=2, ground_truth=True)


def trials(spec: SynthSpec, day: int, split: str = "train") -> list:
    lexicon = load_lexicon()
    model = build_word_model(list(lexicon), np.random.default_rng([spec.seed, 0]))
    tables = realistic.speech_tables(np.random.default_rng([spec.seed, 1]))
    return list(realistic.generate_trials(spec, day, split, model, lexicon, tables))


def test_ground_truth_parts_and_the_noise_add_up_to_the_features_written(tmp_path: Path) -> None:
    """Every trial of every split has its parts in ground_truth.hdf5; features minus them is
    the trial's white noise (as generated: std --noise-std), and the folder still reads as
    the competition layout (no extra session, no empty-folder warning)."""
    write_dataset(SPEC, tmp_path / "d")
    n = 0
    with h5py.File(tmp_path / "d" / GROUND_TRUTH_NAME) as truth:
        for day, session in enumerate(sorted(p.name for p in (tmp_path / "d").glob("t15.*"))):
            for split in ("train", "val", "test"):
                generated = trials(SPEC, day, split)
                with h5py.File(tmp_path / "d" / session / f"data_{split}.hdf5") as f:
                    assert len(f) == len(generated)
                    for (name, g), t in zip(f.items(), generated):
                        parts = truth[f"{session}/{split}/{name}"]
                        assert set(parts) == set(TRUTH_PARTS)
                        x = g["input_features"][()]
                        rest = x - parts["speech"][()] - parts["offset"][()] - parts["nonspeech"][()]
                        np.testing.assert_allclose(rest, t.parts.noise, atol=1e-5)
                        assert np.array_equal(x, t.parts.total())
                        n += 1
    assert n == SPEC.sessions * sum(SPEC.trials().values())
    noise = np.concatenate([t.parts.noise for t in trials(SPEC, 0)])
    assert noise.std() == pytest.approx(SPEC.noise_std, rel=0.02)
    assert len(discover_sessions(tmp_path / "d")) == SPEC.sessions and not empty_folders(tmp_path / "d")


def test_drift_grows_with_the_days_between_sessions() -> None:
    """|M_i - M_j|_F^2 = drift^2 * F * days apart, in expectation (a random walk over days)."""
    spec = replace(SPEC, sessions=4, seed=3)
    days = session_days(spec)
    mixing = [realistic.session_drift(spec, d)[0] for d in range(spec.sessions)]
    for i in range(spec.sessions):
        for j in range(i + 1, spec.sessions):
            ratio = ((mixing[i] - mixing[j]) ** 2).sum() / (spec.drift_std**2 * 512 * (days[j] - days[i]))
            assert ratio == pytest.approx(1.0, abs=0.05), (i, j)


def test_a_phoneme_changes_with_its_neighbours_and_overlaps_them() -> None:
    tables = realistic.speech_tables(np.random.default_rng(0))
    durations = np.array([8, 8, 8])
    mid = 10 + 8 + 4  # the middle bin of the second phoneme
    a, b = (realistic.speech(labels, durations, 10, 50, tables) for labels in ([5, 7, 9], [12, 7, 30]))
    assert np.abs(a[mid] - b[mid]).mean() > 0.1 * np.abs(a[mid]).mean(), "its context changes the middle"
    only_first = realistic.SpeechTables(*(np.where(np.arange(41)[:, None] == 5, t, 0.0) for t in
                                          (tables.onset, tables.offset, np.zeros_like(tables.onset),
                                           np.zeros_like(tables.onset))))
    x = realistic.speech([5, 7, 9], durations, 10, 50, only_first)
    reach = int(realistic.OVERLAP * 8)
    assert np.abs(x[18 : 18 + reach]).sum(1).min() > 0, "the first phoneme reaches into the second"
    assert np.abs(x[18 + reach :]).sum() == 0 and np.abs(x[: 10 - reach]).sum() == 0


def test_blocks_share_an_offset_and_sessions_share_a_non_speech_part() -> None:
    train = trials(SPEC, 0)
    assert SPEC.trials_per_block == 2 and train[0].block == train[1].block != train[2].block
    assert np.array_equal(train[0].parts.offset, train[1].parts.offset)
    assert np.abs(train[0].parts.offset - train[2].parts.offset).mean() > 0.5 * realistic.BLOCK_OFFSET_STD
    shared = realistic.shared_noise(80, SPEC, 0)
    assert np.array_equal(realistic.shared_noise(50, SPEC, 0), shared[:50])
    assert not np.allclose(realistic.shared_noise(50, SPEC, 1), shared[:50])
    off = trials(replace(SPEC, structured_noise_rank=0), 0)
    assert all(not t.parts.nonspeech.any() for t in off)
    assert [t.labels for t in off] == [t.labels for t in train]


def test_cli_preset_defaults_yield_to_explicit_options(tmp_path: Path) -> None:
    args = [str(tmp_path / "d"), "--preset", "realistic", "--sessions", "1", "--train-trials", "1", "--val-trials",
            "0", "--test-trials", "0", "--corpus-sentences", "0", "--noise-std", "0.7"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    spec = read_spec(tmp_path / "d")
    assert spec == preset_spec("realistic", sessions=1, train_trials=1, val_trials=0, test_trials=0,
                               corpus_sentences=0, noise_std=0.7)
    assert (spec.drift_std, spec.structured_noise_rank) == (0.1, 4) and not (tmp_path / "d" / GROUND_TRUTH_NAME).exists()
    bad = CliRunner().invoke(main, [str(tmp_path / "e"), "--preset", "lifelike"])
    assert bad.exit_code == 2 and "lifelike" in bad.output
