"""b2t-synth: the exact real layout, deterministic from the seed, labels that match the features."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, replace
from datetime import datetime
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from b2t.phonemes import PHONEME_IDS, SILENCE_ID
from preprocess.synth import draw_corpus, main, preset_spec, read_spec, split_sentences, write_dataset
from preprocess.synth_core import (
    LABEL_WIDTH,
    SPEC_NAME,
    SynthSpec,
    SynthTrial,
    build_word_model,
    generate_trials,
    load_lexicon,
    noise_subspace,
    phoneme_patterns,
    session_patterns,
    structured_noise,
    trial_parts,
)

SPEC = SynthSpec(sessions=3, train_trials=5, val_trials=2, test_trials=2, corpus_sentences=200)
LABELLED = {"seq_class_ids", "transcription"}
LABEL_ATTRS = {"seq_len", "sentence_label"}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same spec twice, and once with another seed."""
    base = tmp_path_factory.mktemp("synth")
    specs = {"a": SPEC, "b": SPEC, "other_seed": replace(SPEC, seed=1)}
    for name, spec in specs.items():
        write_dataset(spec, base / name)
    return {name: base / name for name in specs}


def hdf5_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.hdf5"))


def trial_content(path: Path) -> dict[str, tuple]:
    """Every dataset and attribute of every trial, as comparable Python values."""
    with h5py.File(path, "r") as f:
        return {
            name: (
                {k: g[k][()].tobytes() for k in g},
                {k: v.item() if isinstance(v, np.generic) else v for k, v in g.attrs.items()},
            )
            for name, g in f.items()
        }


def test_same_seed_is_byte_identical(datasets: dict[str, Path]) -> None:
    a, b = hdf5_files(datasets["a"]), hdf5_files(datasets["b"])
    assert [p.relative_to(datasets["a"]) for p in a] == [p.relative_to(datasets["b"]) for p in b]
    assert len(a) == 3 * SPEC.sessions
    for pa, pb in zip(a, b):
        assert trial_content(pa) == trial_content(pb)
        assert pa.read_bytes() == pb.read_bytes()
    for name in ("lexicon.txt", "corpus.txt"):
        assert (datasets["a"] / name).read_text() == (datasets["b"] / name).read_text()


def test_other_seed_differs(datasets: dict[str, Path]) -> None:
    a, c = hdf5_files(datasets["a"]), hdf5_files(datasets["other_seed"])
    assert all(trial_content(pa) != trial_content(pc) for pa, pc in zip(a, c))


def test_layout_is_exactly_the_real_one(datasets: dict[str, Path]) -> None:
    root = datasets["a"]
    sessions = sorted(p.name for p in root.iterdir() if p.is_dir())
    assert len(sessions) == SPEC.sessions
    dates = [datetime.strptime(s, "t15.%Y.%m.%d") for s in sessions]  # name order is date order
    assert dates == sorted(dates) and len(set(dates)) == len(dates)
    for session in sessions:
        for split, n in SPEC.trials().items():
            with h5py.File(root / session / f"data_{split}.hdf5", "r") as f:
                assert list(f) == [f"trial_{i:04d}" for i in range(n)]
                for g in f.values():
                    x = g["input_features"]
                    assert x.dtype == np.float32 and x.ndim == 2 and x.shape[1] == 512
                    a = g.attrs
                    assert a["n_time_steps"] == x.shape[0] and a["session"] == session
                    assert all(np.asarray(a[k]).dtype == np.int64 for k in ("n_time_steps", "block_num", "trial_num"))
                    if split == "test":
                        assert set(g) == {"input_features"} and not LABEL_ATTRS & set(a)
                        continue
                    assert set(g) == {"input_features"} | LABELLED
                    assert all(g[k].dtype == np.int32 and g[k].shape == (LABEL_WIDTH,) for k in LABELLED)
                    assert np.asarray(a["seq_len"]).dtype == np.int64 and isinstance(a["sentence_label"], str)


def test_block_and_trial_numbers_are_unique_per_session(datasets: dict[str, Path]) -> None:
    for session_dir in (p for p in datasets["a"].iterdir() if p.is_dir()):
        ids = []
        for path in session_dir.glob("*.hdf5"):
            with h5py.File(path, "r") as f:
                ids += [(int(g.attrs["block_num"]), int(g.attrs["trial_num"])) for g in f.values()]
        assert len(ids) == len(set(ids)) == sum(SPEC.trials().values())


def read_lexicon(root: Path) -> dict[str, list[int]]:
    lines = (root / "lexicon.txt").read_text().splitlines()
    return {w: [PHONEME_IDS[p] for p in phones] for w, *phones in map(str.split, lines)}


def test_labels_follow_the_sentence_through_the_lexicon(datasets: dict[str, Path]) -> None:
    lexicon = read_lexicon(datasets["a"])
    for path in hdf5_files(datasets["a"]):
        if path.name == "data_test.hdf5":
            continue
        with h5py.File(path, "r") as f:
            for g in f.values():
                n = int(g.attrs["seq_len"])
                ids, sentence = g["seq_class_ids"][()], g.attrs["sentence_label"]
                assert not ids[n:].any() and np.all((ids[:n] >= 1) & (ids[:n] <= 40))
                assert ids[n - 1] == SILENCE_ID and np.count_nonzero(ids == SILENCE_ID) == len(sentence.split())
                expected = [p for w in sentence.split() for p in (*lexicon[w], SILENCE_ID)]
                assert ids[:n].tolist() == expected
                text = g["transcription"][()]
                assert bytes(text[: len(sentence)].astype(np.uint8)).decode() == sentence
                assert not text[len(sentence) :].any()


def test_lexicon_and_corpus(datasets: dict[str, Path]) -> None:
    lexicon = read_lexicon(datasets["a"])
    corpus = (datasets["a"] / "corpus.txt").read_text().splitlines()
    assert len(corpus) == SPEC.corpus_sentences
    used = {w for line in corpus for w in line.split()}
    lo, hi = SPEC.words
    assert all(lo <= len(line.split()) <= hi for line in corpus)
    for path in hdf5_files(datasets["a"]):
        if path.name != "data_test.hdf5":
            with h5py.File(path, "r") as f:
                used |= {w for g in f.values() for w in g.attrs["sentence_label"].split()}
    builtin = load_lexicon()  # lexicon.txt also holds the (unwritten) test sentences' words
    assert used <= set(lexicon) and all(builtin[w] == tuple(phones) for w, phones in lexicon.items())
    assert all(re.fullmatch(r"[a-z']+", w) for w in lexicon)


def test_builtin_vocabulary_covers_every_phoneme() -> None:
    lexicon = load_lexicon()
    assert 150 <= len(lexicon) <= 300
    assert {p for phones in lexicon.values() for p in phones} == set(range(1, SILENCE_ID))


@given(
    bins=st.tuples(st.integers(1, 12), st.integers(0, 20)).map(lambda t: (t[0], t[0] + t[1])),
    rest=st.tuples(st.integers(0, 30), st.integers(0, 30)).map(lambda t: (t[0], t[0] + t[1])),
    labels=st.lists(st.integers(1, 40), min_size=1, max_size=60),
    seed=st.integers(0, 2**32 - 1),
)
def test_trial_length_follows_the_spec(
    bins: tuple[int, int], rest: tuple[int, int], labels: list[int], seed: int
) -> None:
    spec = SynthSpec(bins_per_phoneme=bins, rest_bins=rest)
    x = trial_parts(labels, np.zeros((41, 512)), np.random.default_rng(seed), spec).total()
    assert x.dtype == np.float32 and x.shape[1] == 512
    assert 2 * rest[0] + bins[0] * len(labels) <= len(x) <= 2 * rest[1] + bins[1] * len(labels)


def session_trials(spec: SynthSpec, day: int) -> list[SynthTrial]:
    """One session's train trials, without writing them."""
    lexicon = load_lexicon()
    model = build_word_model(list(lexicon), np.random.default_rng(0))
    return list(generate_trials(spec, day, "train", model, lexicon, phoneme_patterns(np.random.default_rng(1))))


def test_default_lengths_are_in_the_documented_range_and_ctc_feasible() -> None:
    trials = [t for day in range(2) for t in session_trials(SynthSpec(), day)]
    lengths = np.array([len(t.features) for t in trials])
    assert 50 <= lengths.min() and lengths.max() <= 450 and 120 <= np.median(lengths) <= 260
    for t in trials:  # patch_size 14, stride 4: CTC needs a frame per label plus one per repeat
        repeats = sum(a == b for a, b in zip(t.labels, t.labels[1:]))
        assert (len(t.features) - 14) // 4 + 1 >= len(t.labels) + repeats + 5
    x = np.concatenate([t.features for t in trials])
    assert abs(x.mean()) < 0.5 and 0.8 < x.std() < 1.5  # roughly unit scale


def test_features_carry_the_labels_and_sessions_differ() -> None:
    """Nearest session pattern per bin, runs merged, rest dropped, gives back the labels."""
    spec = SynthSpec()
    patterns = phoneme_patterns(np.random.default_rng(1))
    day0, day1 = (session_patterns(patterns, np.random.default_rng(d), spec) for d in (0, 1))
    labels = [16, 11, 25, 40, 36, 12, 21, 9, 40]  # HH EH OW | W ER L D |
    x = trial_parts(labels, day0, np.random.default_rng(2), spec).total()
    nearest = np.argmin(((x[:, None, :] - day0[None]) ** 2).sum(-1), axis=1)  # (T,)
    runs = [int(k) for i, k in enumerate(nearest) if i == 0 or k != nearest[i - 1]]
    assert [k for k in runs if k != 0] == labels
    drift = np.linalg.norm(day1 - day0, axis=1)[1:] / np.linalg.norm(day0[1:], axis=1)
    assert np.all(drift > 0.3)  # a session's view of a phoneme moves by a third or more


def test_spec_rejects_bad_ranges() -> None:
    with pytest.raises(ValueError, match="bins_per_phoneme"):
        SynthSpec(bins_per_phoneme=(9, 5))
    with pytest.raises(ValueError, match="start at 1"):
        SynthSpec(words=(0, 3))


def test_cli_writes_once_and_guards_out(tmp_path: Path) -> None:
    out = tmp_path / "synth"
    args = [
        str(out),
        "--sessions",
        "2",
        "--train-trials",
        "2",
        "--val-trials",
        "0",
        "--test-trials",
        "1",
        "--corpus-sentences",
        "5",
    ]
    runner = CliRunner()
    first = runner.invoke(main, args)
    assert first.exit_code == 0, first.output
    assert "2 sessions, 6 trials" in first.output and (out / SPEC_NAME).is_file()
    assert sorted(p.name for p in next(p for p in out.iterdir() if p.is_dir()).iterdir()) == [
        "data_test.hdf5",
        "data_train.hdf5",
    ]  # no val file when there are no val trials
    assert "nothing to do" in runner.invoke(main, args).output
    changed = runner.invoke(main, [*args, "--seed", "3"])
    assert changed.exit_code == 2 and "--overwrite" in changed.output
    assert runner.invoke(main, [*args, "--seed", "3", "--overwrite"]).exit_code == 0
    assert '"seed": 3' in (out / SPEC_NAME).read_text()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    refused = runner.invoke(main, [str(foreign), "--overwrite"])
    assert refused.exit_code == 2 and "not a b2t-synth dataset" in refused.output
    assert (foreign / "keep.txt").read_text() == "mine"
    bad = runner.invoke(main, [*args, "--words", "5", "2"])
    assert bad.exit_code == 2 and "words must be a range" in bad.output


# sha256 of every trial's input_features of SPEC's dataset, in path order, as written before
# the structured noise existed: off (the default) it must not change a byte.
SPEC_FEATURES_SHA256 = "e38c655236fee1b5b9a5b3dac864e7e0f663ca2330fd687572fd88635ed3e4e2"


def features_sha256(root: Path) -> str:
    h = hashlib.sha256()
    for path in hdf5_files(root):
        with h5py.File(path, "r") as f:
            for g in f.values():
                h.update(g["input_features"][()].tobytes())
    return h.hexdigest()


def test_structured_noise_off_leaves_the_features_as_they_were(datasets: dict[str, Path], tmp_path: Path) -> None:
    assert SPEC.structured_noise_rank == 0 and features_sha256(datasets["a"]) == SPEC_FEATURES_SHA256
    off = replace(SPEC, sessions=1, structured_noise_std=3.0, structured_noise_timescale=7.0)
    write_dataset(off, tmp_path / "off")  # its other settings mean nothing while it is off
    first = sorted(p for p in datasets["a"].iterdir() if p.is_dir())[0]
    assert [trial_content(p) for p in hdf5_files(tmp_path / "off")] == [trial_content(p) for p in hdf5_files(first)]


def test_structured_noise_adds_a_rank_k_slow_component_in_a_session_subspace() -> None:
    """On, the sentences and every other draw stay; the difference has rank K per trial and
    per session (one subspace a day), the requested std and a slow drift."""
    off = replace(SPEC, train_trials=12)
    on = replace(off, structured_noise_rank=3, structured_noise_std=1.5, structured_noise_timescale=20.0)
    diffs = {}
    for day in (0, 1):
        a, b = session_trials(off, day), session_trials(on, day)
        assert [(t.words, t.labels, len(t.features)) for t in a] == [(t.words, t.labels, len(t.features)) for t in b]
        diffs[day] = [tb.features - ta.features for ta, tb in zip(a, b)]
    for d in diffs[0]:
        s = np.linalg.svd(d, compute_uv=False)
        assert np.all(s[:3] > 1e-3 * s[0]) and np.all(s[3:] < 1e-5 * s[0])
    for day in (0, 1):
        s = np.linalg.svd(np.concatenate(diffs[day][:4]), compute_uv=False)
        assert s[3] < 1e-5 * s[0]  # the trials of a session share one subspace
    s = np.linalg.svd(np.concatenate([diffs[0][0], diffs[1][0]]), compute_uv=False)
    assert s[5] > 1e-3 * s[0]  # each session has its own
    pooled = np.concatenate(diffs[0])
    assert 0.8 < pooled.std() / 1.5 < 1.2
    near = np.mean([np.sum(d[1:] * d[:-1]) / np.sum(d * d) for d in diffs[0]])
    assert near > 0.9  # exp(-1/20) = 0.95, minus each short trial's bias


@given(
    rank=st.integers(1, 16),
    std=st.floats(0.1, 4.0),
    timescale=st.floats(2.0, 20.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_structured_noise_has_the_requested_rank_std_and_timescale(
    rank: int, std: float, timescale: float, seed: int
) -> None:
    spec = SynthSpec(structured_noise_rank=rank, structured_noise_std=std, structured_noise_timescale=timescale)
    subspace = noise_subspace(np.random.default_rng([seed, 0]), spec)
    assert np.allclose(subspace @ subspace.T, np.eye(rank))
    x = structured_noise(6000, subspace, np.random.default_rng([seed, 1]), spec)
    assert x.dtype == np.float32 and x.shape == (6000, 512)
    basis = subspace.astype(np.float32)
    within = x @ basis.T  # (T, K): x lies in the subspace and fills all K of its directions
    assert np.abs(x - within @ basis).max() < 1e-4 * np.abs(x).max()
    w = within.astype(np.float64)  # x's singular values, std and autocorrelation, computed in K dimensions
    power = np.linalg.eigvalsh(w.T @ w)  # ascending: the squared singular values
    assert power[0] > 0.01 * power[-1]
    assert 0.8 < np.sqrt(np.mean(w**2) * rank / 512) / std < 1.2  # ~5 sd of the estimate at timescale 20

    def autocorrelation(lag: int) -> float:
        return float(np.sum(w[lag:] * w[:-lag]) / np.sum(w * w))

    phi = np.exp(-1 / timescale)
    assert abs(autocorrelation(1) - phi) < 5 * np.sqrt((1 - phi**2) / len(w))  # 5 sd of the estimate
    assert abs(autocorrelation(int(5 * timescale))) < 0.3  # e^-5: far bins are nearly independent


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--structured-noise-rank", "-1"], "structured_noise_rank must be 0 (off) to 512, got -1"),
        (["--structured-noise-rank", "513"], "structured_noise_rank must be 0 (off) to 512, got 513"),
        (["--structured-noise-std", "-0.5"], "structured_noise_std must be finite and >= 0"),
        (["--structured-noise-timescale", "0"], "structured_noise_timescale finite and > 0 (bins)"),
        (["--structured-noise-rank", "two"], "'two' is not a valid integer"),
        (["--seed", "-1"], "-1 is not in the range x>=0"),  # numpy's ValueError, exit 70
    ],
)
def test_cli_rejects_bad_structured_noise_in_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, [str(tmp_path / "synth"), *args])
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert result.exit_code == 2 and len(errors) == 1 and message in errors[0], result.output
    assert not (tmp_path / "synth").exists()


def test_cli_records_structured_noise_and_guards_a_change(tmp_path: Path) -> None:
    out = tmp_path / "synth"
    args = [str(out), "--sessions", "1", "--train-trials", "2", "--val-trials", "0", "--test-trials", "0"]
    args += ["--corpus-sentences", "5", "--structured-noise-rank", "2", "--structured-noise-timescale", "30"]
    runner = CliRunner()
    assert runner.invoke(main, args).exit_code == 0
    spec = read_spec(out)
    assert spec is not None and (spec.structured_noise_rank, spec.structured_noise_timescale) == (2, 30.0)
    assert "nothing to do" in runner.invoke(main, args).output
    changed = runner.invoke(main, [*args, "--structured-noise-std", "2"])
    assert changed.exit_code == 2 and "--overwrite" in changed.output
    help_text = " ".join(runner.invoke(main, ["--help"]).output.split())
    assert "--structured-noise-rank" in help_text and "noise-separating model" in help_text


def test_a_spec_written_before_structured_noise_reads_as_off(tmp_path: Path) -> None:
    old = {k: v for k, v in asdict(SPEC).items() if not k.startswith("structured_noise")}
    (tmp_path / SPEC_NAME).write_text(json.dumps(old))
    assert read_spec(tmp_path) == SPEC  # so rerunning b2t-synth over an old dataset does nothing


@pytest.mark.parametrize("preset", ["basic", "realistic"])
def test_split_sentences_are_the_sentences_written(preset: str, datasets: dict[str, Path], tmp_path: Path) -> None:
    """Drawn again from the spec: the val files' sentence labels, and one per test trial (whose files have none)."""
    if preset == "basic":
        spec, root = SPEC, datasets["a"]
    else:
        spec, root = preset_spec("realistic", sessions=2, train_trials=2, val_trials=2, test_trials=3), tmp_path / "r"
        write_dataset(spec, root)
    for split in ("val", "test"):
        written = {}
        for path in sorted(root.glob(f"*/data_{split}.hdf5")):
            with h5py.File(path, "r") as f:
                written.update({(path.parent.name, int(g.attrs["block_num"]), int(g.attrs["trial_num"])):
                                g.attrs.get("sentence_label") for g in f.values()})
        drawn = split_sentences(spec, split)
        assert drawn.keys() == written.keys() and all(drawn.values())
        if split == "val":
            assert drawn == written


def test_a_larger_corpus_starts_with_corpus_txt(datasets: dict[str, Path]) -> None:
    written = (datasets["a"] / "corpus.txt").read_text().splitlines()
    larger = [" ".join(s) for s in draw_corpus(SPEC, n=3 * SPEC.corpus_sentences)]
    assert larger[:len(written)] == written and len(larger) == 3 * len(written)
