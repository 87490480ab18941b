"""The HDF5 reader: every bad input is an error naming file, trial group and problem."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import h5py
import numpy as np
import pytest

from preprocess import hdf5_source
from preprocess.hdf5_source import discover_sessions, file_fingerprint, read_features, scan_file
from preprocess.synth import SynthSpec, write_dataset, write_trial
from preprocess.trials import DataError

SESSION = "t15.2023.08.13"
N_TRIALS = 3


def make_file(path: Path, split: str = "train", n: int = N_TRIALS, session: str = SESSION) -> Path:
    """A valid split file of `n` small trials, for the tests to corrupt."""
    rng = np.random.default_rng(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        for i in range(n):
            features = rng.standard_normal((20 + i, 512)).astype(np.float32)
            labelled = split != "test"
            write_trial(
                f,
                i,
                features,
                session=session,
                block=1,
                trial=i,
                labels=[3, 40, 7, 40] if labelled else None,
                sentence="a b" if labelled else None,
            )
    return path


@pytest.fixture
def train_file(tmp_path: Path) -> Path:
    return make_file(tmp_path / SESSION / "data_train.hdf5")


def scan_error(path: Path, split: str = "train", trial: str | None = "trial_0001") -> DataError:
    """Scan `path` expecting a DataError that names the file and `trial`."""
    with pytest.raises(DataError) as info:
        scan_file(path, split, SESSION, 0, skip_bad=False)
    e = info.value
    assert str(path) in str(e) and e.trial == trial
    if trial:
        assert trial in str(e)
    return e


@contextmanager
def edit(path: Path, trial: str = "trial_0001") -> Iterator[h5py.Group]:
    """Open one trial group of `path` for corrupting it in place."""
    with h5py.File(path, "a") as f:
        yield f[trial]


def test_good_file_scans(train_file: Path) -> None:
    refs, excluded = scan_file(train_file, "train", SESSION, 3, skip_bad=False)
    assert excluded == [] and [r.group for r in refs] == ["trial_0000", "trial_0001", "trial_0002"]
    r = refs[1]
    assert (r.file, r.split, r.session, r.day_index, r.block, r.trial) == (str(train_file), "train", SESSION, 3, 1, 1)
    assert (r.n_time_steps, r.labels, r.sentence) == (21, (3, 40, 7, 40), "a b")


def test_test_file_has_no_labels(tmp_path: Path) -> None:
    path = make_file(tmp_path / SESSION / "data_test.hdf5", split="test")
    refs, _ = scan_file(path, "test", SESSION, 0, skip_bad=False)
    assert len(refs) == N_TRIALS and all(r.labels == () and r.sentence is None for r in refs)


@pytest.mark.parametrize("content", [b"", b"not an HDF5 file at all" * 100])
def test_not_hdf5(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "data_train.hdf5"
    path.write_bytes(content)
    assert "cannot be read as HDF5" in str(scan_error(path, trial=None))


def test_a_damaged_object_header_names_its_trial(train_file: Path) -> None:
    """h5py raises KeyError for a trial group whose header it cannot decode: it came out as an
    internal error (rc 70) rather than the file and trial."""
    with h5py.File(train_file, "r") as f:
        where = h5py.h5o.get_info(f["trial_0001"].id).addr
    data = bytearray(train_file.read_bytes())
    data[where:where + 16] = b"\xff" * 16
    train_file.write_bytes(bytes(data))
    assert "cannot be read: 'Unable to synchronously open object" in str(scan_error(train_file))


def test_two_groups_of_one_trial_number_are_refused(train_file: Path) -> None:
    """trial_01 beside trial_0001 (a hard link): the trial was read twice, its row twice in the CSV."""
    with h5py.File(train_file, "a") as f:
        f["trial_01"] = f["trial_0001"]
    assert "has the trial number of trial_0001" in str(scan_error(train_file, trial="trial_01"))


def test_truncated(train_file: Path) -> None:
    data = train_file.read_bytes()
    train_file.write_bytes(data[: len(data) // 2])
    assert "truncated" in str(scan_error(train_file, trial=None))


def test_missing_file(tmp_path: Path) -> None:
    scan_error(tmp_path / "data_train.hdf5", trial=None)


@pytest.mark.parametrize("name", ["input_features", "seq_class_ids", "transcription"])
def test_missing_dataset(train_file: Path, name: str) -> None:
    with edit(train_file) as g:
        del g[name]
    assert f"missing dataset {name!r}" in str(scan_error(train_file))


@pytest.mark.parametrize("name", ["n_time_steps", "session", "block_num", "trial_num", "seq_len", "sentence_label"])
def test_missing_attribute(train_file: Path, name: str) -> None:
    with edit(train_file) as g:
        del g.attrs[name]
    assert f"missing attribute {name!r}" in str(scan_error(train_file))


@pytest.mark.parametrize("shape", [(20, 511), (20, 513), (20 * 512,), (2, 10, 512)])
def test_wrong_feature_shape(train_file: Path, shape: tuple[int, ...]) -> None:
    with edit(train_file) as g:
        del g["input_features"]
        g["input_features"] = np.zeros(shape, np.float32)
    assert "expected float [n_time_steps, 512]" in str(scan_error(train_file))


def test_n_time_steps_differs_from_rows(train_file: Path) -> None:
    with edit(train_file) as g:
        g.attrs["n_time_steps"] = np.int64(22)
    assert "n_time_steps attribute is 22 but input_features has 21 rows" in str(scan_error(train_file))


def test_non_integer_attribute(train_file: Path) -> None:
    with edit(train_file) as g:
        g.attrs["block_num"] = "one"
    assert "'block_num'" in str(scan_error(train_file))


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_features(train_file: Path, monkeypatch: pytest.MonkeyPatch, value: float) -> None:
    monkeypatch.setattr(hdf5_source, "CHECK_ROWS", 4)  # the bad row lies in a later chunk
    with edit(train_file) as g:
        g["input_features"][9, 100] = value
    assert "NaN/Inf at row 9, channel 100" in str(scan_error(train_file))


@pytest.mark.parametrize("dtype, value", [(np.float64, 1e300), (np.float32, 3.4e38), (np.float32, -3.4e38)])
def test_features_that_overflow_bf16_are_refused(train_file: Path, monkeypatch: pytest.MonkeyPatch,
                                                 dtype: type, value: float) -> None:
    """Finite in the file but Inf once cast to the shards' bf16: refused, naming row and channel."""
    monkeypatch.setattr(hdf5_source, "CHECK_ROWS", 4)  # the bad row lies in a later chunk
    with edit(train_file) as g:
        x = g["input_features"][()].astype(dtype)
        x[9, 100] = value
        del g["input_features"]
        g["input_features"] = x
    message = str(scan_error(train_file))
    assert "row 9, channel 100" in message and "beyond the range of bfloat16" in message


def test_features_at_the_bf16_limit_pass(train_file: Path) -> None:
    with edit(train_file) as g:
        g["input_features"][9, 100] = 3.3e38  # rounds to bf16's largest finite value
    scan_file(train_file, "train", SESSION, 0, skip_bad=False)


@pytest.mark.parametrize("seq_len", [0, -1, 501])
def test_seq_len_out_of_range(train_file: Path, seq_len: int) -> None:
    with edit(train_file) as g:
        g.attrs["seq_len"] = np.int64(seq_len)
    assert f"seq_len {seq_len} is outside 1..500" in str(scan_error(train_file))


@pytest.mark.parametrize("label", [0, 41, -3])
def test_label_outside_phoneme_ids(train_file: Path, label: int) -> None:
    with edit(train_file) as g:
        g["seq_class_ids"][2] = label
    assert f"seq_class_ids[2] is {label}, outside the phoneme ids 1..40" in str(scan_error(train_file))


def test_labels_beyond_seq_len_are_padding(train_file: Path) -> None:
    with edit(train_file) as g:
        g.attrs["seq_len"] = np.int64(2)
    refs, _ = scan_file(train_file, "train", SESSION, 0, skip_bad=False)
    assert refs[1].labels == (3, 40)


def test_session_attribute_names_other_session(train_file: Path) -> None:
    with edit(train_file) as g:
        g.attrs["session"] = "t15.2024.01.01"
    assert "session attribute is 't15.2024.01.01'" in str(scan_error(train_file))


def test_unexpected_top_level_object(train_file: Path) -> None:
    with h5py.File(train_file, "a") as f:
        f["notes"] = np.zeros(3)
    scan_error(train_file, trial="notes")


def test_empty_split(tmp_path: Path) -> None:
    path = make_file(tmp_path / "data_val.hdf5", split="val", n=0)
    assert "empty val split: has no trial groups" in str(scan_error(path, "val", trial=None))


def test_skip_bad_records_exclusion_and_keeps_the_rest(train_file: Path) -> None:
    with edit(train_file) as g:
        g["input_features"][0, 0] = np.nan
    refs, excluded = scan_file(train_file, "train", SESSION, 0, skip_bad=True)
    assert [r.group for r in refs] == ["trial_0000", "trial_0002"]
    assert [(e.file, e.trial) for e in excluded] == [(str(train_file), "trial_0001")]
    assert "NaN/Inf at row 0, channel 0" in excluded[0].reason


def test_skip_bad_still_fails_when_nothing_is_left(train_file: Path) -> None:
    with h5py.File(train_file, "a") as f:
        for g in f.values():
            del g.attrs["seq_len"]
    with pytest.raises(DataError, match="empty train split: all 3 trials are bad") as info:
        scan_file(train_file, "train", SESSION, 0, skip_bad=True)
    assert str(train_file) in str(info.value)


def test_skip_bad_does_not_skip_unreadable_files(tmp_path: Path) -> None:
    path = tmp_path / "data_train.hdf5"
    path.write_bytes(b"junk")
    with pytest.raises(DataError, match="cannot be read as HDF5"):
        scan_file(path, "train", SESSION, 0, skip_bad=True)


def test_discover_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="is not a directory"):
        discover_sessions(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no session found") as info:
        discover_sessions(tmp_path / "empty")
    assert str(tmp_path / "empty") in str(info.value)
    make_file(tmp_path / "odd" / SESSION / "data_extra.hdf5")
    with pytest.raises(DataError, match="unexpected file name") as info:
        discover_sessions(tmp_path / "odd")
    assert "data_extra.hdf5" in str(info.value)


def test_duplicate_session_names(tmp_path: Path) -> None:
    make_file(tmp_path / SESSION / "data_train.hdf5")
    make_file(tmp_path / "older" / SESSION / "data_val.hdf5", split="val")
    with pytest.raises(DataError, match=f"duplicate session name '{SESSION}'") as info:
        discover_sessions(tmp_path)
    assert str(tmp_path / SESSION) in str(info.value) and str(tmp_path / "older" / SESSION) in str(info.value)


def test_root_may_be_a_session(tmp_path: Path) -> None:
    path = make_file(tmp_path / SESSION / "data_train.hdf5")
    assert discover_sessions(tmp_path / SESSION) == [hdf5_source.SessionFiles(SESSION, {"train": path})]


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("synth") / "data"
    write_dataset(SynthSpec(sessions=3, train_trials=4, val_trials=2, test_trials=2, corpus_sentences=10), root)
    return root


def test_synth_scans_cleanly_in_day_order(synth_root: Path) -> None:
    sessions = discover_sessions(synth_root)
    names = [s.session for s in sessions]
    assert names == sorted(names) and len(names) == 3
    for day, s in enumerate(sessions):
        assert list(s.files) == ["train", "val", "test"]
        for split, path in s.files.items():
            refs, excluded = scan_file(path, split, s.session, day, skip_bad=False)
            assert excluded == [] and len(refs) == {"train": 4, "val": 2, "test": 2}[split]
            assert all(r.day_index == day and r.session == s.session for r in refs)
            assert all((r.labels == ()) == (split == "test") for r in refs)


def test_read_features_in_order_one_open_per_file(synth_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    refs = []
    for day, s in enumerate(discover_sessions(synth_root)):
        refs += scan_file(s.files["train"], "train", s.session, day, skip_bad=False)[0]
    batch = [refs[5], refs[0], refs[9], refs[1]]  # across files, out of order
    opened = []
    real_file = h5py.File
    monkeypatch.setattr(hdf5_source.h5py, "File", lambda path, mode: opened.append(path) or real_file(path, mode))
    features = read_features(batch)
    assert sorted(map(str, opened)) == sorted({r.file for r in batch})
    for ref, x in zip(batch, features):
        with real_file(ref.file, "r") as f:
            np.testing.assert_array_equal(x, f[ref.group]["input_features"][()])
        assert x.dtype == np.float32 and x.shape == (ref.n_time_steps, 512)


def test_read_features_notices_a_changed_file(train_file: Path) -> None:
    refs, _ = scan_file(train_file, "train", SESSION, 0, skip_bad=False)
    with edit(train_file) as g:
        del g["input_features"]
        g["input_features"] = np.zeros((5, 512), np.float32)
    with pytest.raises(DataError, match="the file changed") as info:
        read_features(refs)
    assert str(train_file) in str(info.value) and "trial_0001" in str(info.value)


def test_file_fingerprint(train_file: Path) -> None:
    data = train_file.read_bytes()
    assert file_fingerprint(train_file) == {
        "path": str(train_file),
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def test_a_fifo_named_like_a_session_file_is_refused_not_opened(tmp_path: Path) -> None:
    """Issue 35 case 16: a FIFO named data_val.hdf5 blocked b2t-preprocess for ever."""
    import os

    make_file(tmp_path / SESSION / "data_train.hdf5")
    os.mkfifo(tmp_path / SESSION / "data_val.hdf5")
    with pytest.raises(DataError, match=r"data_val.hdf5: is a FIFO \(named pipe\), not a regular file: expected an "
                                        r"HDF5 file"):
        discover_sessions(tmp_path)
