"""Bad inputs a hostile user crafts (shards, HDF5 trees, configs, runs, reports, LMs, a full disk,
broken manifests), one test per kind, each refused by name or read as designed.

The shard cases play the hostile user of the issue: change a value inside a shard and
update the manifest's size and sha256 to match, so only the reader's own row checks can
see it. Everything runs eagerly on a two-session synthetic set built once per module.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from webdataset import TarWriter

from b2t.atomic import atomic_file
from b2t.cli import report
from b2t.cli.eval import eval_main
from b2t.cli.rule import os_error_line
from b2t.config import TINY_CONFIG, ConfigError, DataConfig, load_config, parse_yaml
from b2t.data.dataset import Dataset
from b2t.data.loader import StreamConfig, eval_batches
from b2t.data.manifest import MANIFEST_NAME, Manifest, ShardEntry, file_sha256
from b2t.data.mapped_tar import shard_samples
from b2t.data.sample import decode_sample, encode_sample
from b2t.engine.checkpoint import TrainState, save_checkpoint
from b2t.engine.optim import make_optimizer
from b2t.import_baseline import BaselineError, load_baseline
from b2t.run_dir import MetricsError, read_records
from b2t.train.loop import RunOptions, TrainingError, train
from b2t.train.metrics_log import MetricsLog
from b2t.train.resume import resume_state
from b2t.words.lexicon import LexiconError, load_lexicon
from b2t.words.ngram import check_arpa
from preprocess.hdf5_source import DataError, discover_sessions, scan_file, session_warnings
from preprocess.synth import SynthSpec, write_dataset
from preprocess.verify import verify
from preprocess.writer import LOCK_NAME, OutputDirError, prepare_dataset


@pytest.fixture(scope="module")
def small(tiny_dataset, tmp_path_factory) -> tuple[Path, Path]:
    """(an HDF5 tree of 2 sessions, the suite's tiny shards): the shards are shared with other tests."""
    root = tmp_path_factory.mktemp("round2")
    write_dataset(SynthSpec(sessions=2, train_trials=4, val_trials=2, test_trials=2, corpus_sentences=20, seed=2),
                  root / "hdf5")
    return root / "hdf5", tiny_dataset[1]


def _tampered(shards: Path, out: Path, change) -> Path:
    """A dataset in `out` holding one val shard whose first batch `change(tensors)` edited in place,
    with the manifest's size and sha256 updated to the new bytes: only row checks can tell."""
    manifest = Manifest.load(shards)
    entry = manifest.shards_of("val")[0]
    out.mkdir()
    with TarWriter(str(out / entry.name)) as tar:
        for i, sample in enumerate(shard_samples(str(shards / entry.name))):
            tensors, meta = decode_sample(sample)
            tensors = {k: v.clone() for k, v in tensors.items()}
            if i == 0:
                change(tensors)
            tar.write(encode_sample(sample["__key__"], tensors, meta))
    path = out / entry.name
    manifest.shards = [ShardEntry(**{**entry.__dict__, "bytes": path.stat().st_size, "sha256": file_sha256(path)})]
    manifest.splits = {"val": {**manifest.splits["val"], "n_batches": entry.n_batches}}  # the one shard listed
    manifest.save(out)
    return out


def _read_val(dataset: Path) -> None:
    list(eval_batches(dataset, Manifest.load(dataset), "val", StreamConfig()))


# --- a manifest path that leads outside the dataset --------------------------------------------

def test_01_a_manifest_cannot_point_the_reader_outside_its_directory(small, tmp_path):
    _, shards = small
    raw = json.loads((shards / MANIFEST_NAME).read_text())
    raw["shards"][0]["name"] = "../other-dataset/" + raw["shards"][0]["name"]
    (tmp_path / "dotdot").mkdir()
    (tmp_path / "dotdot" / MANIFEST_NAME).write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"dotdot/manifest.json is not a valid b2t manifest: shard name '\.\./other"):
        Manifest.load(tmp_path / "dotdot")
    assert not verify(tmp_path / "dotdot").ok

    linked = tmp_path / "linked"  # the same escape through a symlinked shard
    entry = Manifest.load(shards).shards_of("val")[0]
    linked.mkdir()
    shutil.copy(shards / MANIFEST_NAME, linked / MANIFEST_NAME)
    (linked / entry.name).symlink_to(shards / entry.name)
    with pytest.raises(ValueError, match="outside the dataset directory"):
        _read_val(linked)
    assert any("outside the dataset directory" in e for e in verify(linked).errors)


# --- values inside a shard that fit its shape and dtype ----------------------------------

def _set(name: str, index: tuple, value: int):
    def change(tensors: dict[str, torch.Tensor]) -> None:
        tensors[name][index] = value
    return change


@pytest.mark.parametrize("name, index, value, message", [
    ("seq_class_ids", (0, 0), 99, r"row 0: seq_class_ids\[0\] is 99, expected a phoneme id 1\.\.40"),  # case 2
    ("n_time_steps", (0,), 532676675, r"row 0: n_time_steps 532676675 outside 1\.\."),  # case 12
    ("phone_seq_lens", (0,), 60, r"row 0: phone_seq_lens 60 outside 0\.\."),
    ("day_indices", (0,), 9, r"row 0: day index 9 outside 0\.\.4"),
])
def test_02_12_row_values_are_checked_when_a_batch_is_read(small, tmp_path, name, index, value, message):
    _, shards = small
    dataset = _tampered(shards, tmp_path / "ds", _set(name, index, value))
    with pytest.raises(ValueError, match=rf"val-00000.tar: sample .*{message}"):
        _read_val(dataset)
    assert any(__import__("re").search(message, e) for e in verify(dataset).errors)


def test_02_labels_ctc_cannot_align_are_refused(small, tmp_path):
    def too_many(tensors: dict[str, torch.Tensor]) -> None:  # every label slot filled, in a 1-patch row
        tensors["n_time_steps"][0] = 14
        tensors["seq_class_ids"][0] = 5
        tensors["phone_seq_lens"][0] = tensors["seq_class_ids"].shape[1]
        tensors["features"][0, 14:] = 0

    dataset = _tampered(small[1], tmp_path / "ds", too_many)
    with pytest.raises(ValueError, match=r"row 0: \d+ labels \(\d+ repeats\) need \d+ CTC frames, its 14 bins make 1 "):
        _read_val(dataset)


# --- the HDF5 tree --------------------------------------------------------------------------

@pytest.fixture
def tree(small, tmp_path) -> Path:
    root = tmp_path / "hdf5"
    shutil.copytree(small[0], root)
    return root


def test_03_a_symlinked_session_folder_is_followed(tree, tmp_path):
    session = sorted(p for p in tree.iterdir() if p.is_dir())[0]
    shutil.move(session, tmp_path / "elsewhere")
    session.symlink_to(tmp_path / "elsewhere")
    assert len(discover_sessions(tree)) == 2
    (tree / "loop").symlink_to(tree)  # a link back up: an error, not an endless walk
    with pytest.raises(DataError, match="already reached"):
        discover_sessions(tree)


def test_04_a_session_without_train_or_val_data_is_warned_about(tree):
    session = sorted(p for p in tree.iterdir() if p.is_dir())[0]
    (session / "data_train.hdf5").unlink()
    (session / "data_val.hdf5").unlink()
    warnings = session_warnings(tree, discover_sessions(tree))
    assert [w for w in warnings if w.startswith(session.name)] == [
        f"{session.name}: no data_train.hdf5 and no data_val.hdf5 (only data_test.hdf5): kept, but no trial "
        "trains or validates its day layer"]


def test_a_folder_named_like_a_session_file_is_refused(tree):
    """It was taken for an empty session folder: the session lost its train split, warned about
    only as an empty folder."""
    path = sorted(tree.glob("*/data_train.hdf5"))[0]
    path.unlink()
    path.mkdir()
    with pytest.raises(DataError, match=r"data_train.hdf5: is a folder: expected an HDF5 file"):
        discover_sessions(tree)


def _first_trial(tree: Path) -> tuple[Path, str, str]:
    path = sorted(tree.glob("*/data_train.hdf5"))[0]
    with h5py.File(path, "r") as f:
        return path, sorted(f)[0], path.parent.name


def test_05_an_empty_sentence_label_is_a_bad_trial(tree):
    path, group, session = _first_trial(tree)
    with h5py.File(path, "r+") as f:
        f[group].attrs["sentence_label"] = "  "
    with pytest.raises(DataError, match=rf"{group}: sentence_label '  ' has no words"):
        scan_file(path, "train", session, 0, skip_bad=False)
    _, excluded = scan_file(path, "train", session, 0, skip_bad=True)
    assert [e.trial for e in excluded] == [group]


def test_06_a_non_utf8_sentence_label_is_a_bad_trial(tree):
    path, group, session = _first_trial(tree)
    with h5py.File(path, "r+") as f:
        f[group].attrs.create("sentence_label", b"caf\xe9 au lait", dtype=h5py.string_dtype("utf-8"))
    with pytest.raises(DataError, match=rf"{group}: attribute 'sentence_label' is not UTF-8 text"):
        scan_file(path, "train", session, 0, skip_bad=False)


# --- configs -----------------------------------------------------------------------------

def test_07_an_empty_config_file_is_refused(tmp_path):
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    with pytest.raises(ConfigError, match=r"empty.yaml: the file is empty"):
        load_config(tmp_path / "empty.yaml")


def test_14_malformed_yaml_names_file_and_line(tmp_path):
    (tmp_path / "bad.yaml").write_text("optim:\n  lr: 0.1\n  eps: [0.1\ntrain:\n  steps: 3\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:\d+: not valid YAML"):
        load_config(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match=r"override 'optim.lr=\[':1: not valid YAML"):
        load_config(None, ["optim.lr=["])


def test_a_key_given_twice_is_refused(tmp_path):
    """PyYAML keeps the last of two equal keys and says nothing: one of the two values trained unseen."""
    (tmp_path / "c.yaml").write_text("optim:\n  lr: 0.1\n  lr: 0.2\n")
    with pytest.raises(ConfigError, match=r"c.yaml:3: not valid YAML \(key 'lr' given twice\)"):
        load_config(tmp_path / "c.yaml")
    merged = parse_yaml("a: &x {k: 1, j: 1}\nb:\n  <<: *x\n  k: 2\n", "t")  # a merge's keys may be overridden
    assert merged == {"a": {"k": 1, "j": 1}, "b": {"k": 2, "j": 1}}


def test_17_numbers_in_every_common_spelling(tmp_path):
    (tmp_path / "c.yaml").write_text("optim:\n  lr: 1e-3\n  lr_day: .5\n  eps: 1E-4\n  grad_clip: 1.5e1\n")
    cfg = load_config(tmp_path / "c.yaml", ["optim.lr_min=1e-6", "optim.beta1=+5e-1"])
    o = cfg.optim
    assert (o.lr, o.lr_day, o.eps, o.grad_clip, o.lr_min, o.beta1) == (1e-3, 0.5, 1e-4, 15.0, 1e-6, 0.5)
    assert parse_yaml("-1E-4", "x") == -1e-4  # no optim value may be negative, a number still may
    with pytest.raises(ConfigError, match="expected a number"):  # a word is still not a number
        load_config(None, ["optim.lr=1e"])


# --- runs, and an empty RUN dir ------------------------------------------------------------

def test_08_resume_refuses_a_checkpoint_of_other_data(small, tmp_path):
    _, shards = small
    manifest = Manifest.load(shards)
    cfg = load_config(TINY_CONFIG, ["train.backend=eager"])
    from b2t.model.registry import build_model

    model = build_model(cfg.model, len(manifest.sessions))
    optimizer = make_optimizer(model, cfg.optim)
    state = TrainState(sessions=manifest.sessions, config=cfg.to_dict(),
                       dataset={"path": "/data/seed1", "identity": "ab" * 32})
    save_checkpoint(tmp_path / "last.safetensors", model, optimizer, state)
    with pytest.raises(TrainingError, match=rf"trained on the dataset at /data/seed1 \(identity abababababab\), "
                                            rf"{shards} holds other data"):
        resume_state(tmp_path / "last.safetensors", model, optimizer, Dataset(shards, manifest), cfg)
    state.dataset["identity"] = manifest.identity()
    save_checkpoint(tmp_path / "last.safetensors", model, optimizer, state)
    assert resume_state(tmp_path / "last.safetensors", model, optimizer, Dataset(shards, manifest), cfg).sessions


def test_09_resume_with_init_from_is_refused(small, tmp_path):
    cfg = load_config(TINY_CONFIG, ["train.backend=eager"])
    with pytest.raises(TrainingError, match="--resume continues .* --init-from .* pass one of them"):
        train(small[1], tmp_path / "run", cfg, RunOptions(resume=True, init_from=tmp_path / "x.safetensors"))
    assert not (tmp_path / "run").exists()


def test_10_data_settings_that_differ_from_the_shards_are_noted(small):
    manifest = Manifest.load(small[1])
    made = DataConfig(**manifest.config["data"])
    assert manifest.config_differences(made) == []
    note = manifest.config_differences(DataConfig(**{**manifest.config["data"], "n_buckets": 2, "batch_size": 8}))
    assert note == ["the shards were made with data.n_buckets=3, data.batch_size=16; the config says 2, 8: the "
                    "shards' values are the ones that train (the data section only steers b2t-preprocess; re-run "
                    "it to change them)"]


def test_a_failed_init_from_leaves_no_run_directory(small, tmp_path):
    (tmp_path / "broken.safetensors").write_bytes(b"not a checkpoint")
    cfg = load_config(TINY_CONFIG, ["train.backend=eager", "train.steps=1"])
    with pytest.raises(ValueError, match="broken.safetensors is not a readable b2t checkpoint"):
        train(small[1], tmp_path / "run", cfg, RunOptions(progress=False, device="cpu",
                                                          init_from=tmp_path / "broken.safetensors"))
    assert not (tmp_path / "run").exists()


def test_a_refused_preprocess_leaves_no_lock_file(small, tmp_path):
    (tmp_path / "mine.txt").write_text("the user's own file")
    with pytest.raises(OutputDirError, match="not empty and holds no b2t-preprocess run"):
        prepare_dataset(small[0], tmp_path, load_config(TINY_CONFIG), progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]
    assert LOCK_NAME not in os.listdir(tmp_path)


# --- b2t-report -------------------------------------------------------------------------

@pytest.fixture
def no_plot(monkeypatch):
    """b2t-report without matplotlib (seconds per figure): these tests are about what it reads."""
    monkeypatch.setattr(report, "render", lambda runs: json.dumps([run.series for run in runs]).encode())


def _report(run: Path) -> tuple[int, str]:
    result = CliRunner().invoke(report.main, [str(run), "-o", str(run / "r.png")])
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    return result.exit_code, result.output


def test_11_report_skips_malformed_lines_and_says_so(tmp_path, no_plot):
    good = [{"kind": "train", "step": s, "loss": 1.0 / s} for s in (1, 2, 3)]
    lines = [json.dumps(good[0]), "garbage {", json.dumps(good[1]), json.dumps({"kind": "val", "step": 3, "per": "abc"}),
             json.dumps(good[2])]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    code, output = _report(tmp_path)
    assert code == 0 and [step for step, _ in json.loads((tmp_path / "r.png").read_text())[0]["loss/train"]] == [1, 2, 3]
    assert "2 lines of" in output and "line 2: not JSON" in output and "line 4: per is 'abc', not a number" in output


def test_16_report_on_a_binary_file(tmp_path, no_plot):
    (tmp_path / "metrics.jsonl").write_bytes(bytes(range(256)) * 4)
    code, output = _report(tmp_path)
    assert code == 2 and "holds no well-formed train or val records" in output and "not UTF-8 text" in output


def test_report_on_a_metrics_folder_says_so(tmp_path, no_plot):
    """It said "not found" of a path that is there."""
    (tmp_path / "metrics.jsonl").mkdir()
    code, output = _report(tmp_path)
    assert code != 0 and "metrics.jsonl is not a file: RUN must be a b2t-train run directory" in output


def test_21_report_with_every_step_null(tmp_path, no_plot):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"kind": "train", "step": None, "loss": 1.0}) + "\n"
                                                    for _ in range(3)))
    code, output = _report(tmp_path)
    assert code == 2 and "3 lines of" in output and "a train record whose step is None, not an integer" in output


# --- LMs, lexicons, metrics on resume --------------------------------------------------------

def test_15_19_an_lm_that_is_not_arpa_is_named(small, tmp_path):
    (tmp_path / "notes.txt").write_text("hello world\n")
    (tmp_path / "lm.bin").write_bytes(bytes(range(128, 256)) * 8)
    with pytest.raises(ValueError, match=r"notes.txt: its first line is 'hello world': expected an ARPA"):
        check_arpa(tmp_path / "notes.txt")
    with pytest.raises(ValueError, match=r"lm.bin: not UTF-8 text .*expected an ARPA"):
        check_arpa(tmp_path / "lm.bin")
    (tmp_path / "ckpt").write_bytes(b"x")
    lexicon = small[0] / "lexicon.txt"
    result = CliRunner().invoke(eval_main, [str(tmp_path / "ckpt"), str(small[1]), "--split", "val",
                                            "--lexicon", str(lexicon), "--lm", str(tmp_path / "notes.txt")])
    assert result.exit_code == 2 and "notes.txt: its first line is 'hello world'" in result.output


def test_19_a_non_utf8_lexicon_names_file_and_line(tmp_path):
    (tmp_path / "lex.txt").write_bytes(b"hello HH AH L OW\ncaf\xe9 K AE F EY\n")
    with pytest.raises(LexiconError, match=r"lex.txt:2: not UTF-8 text"):
        load_lexicon(tmp_path / "lex.txt")


def test_19_resume_on_a_binary_metrics_log_names_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"kind": "layout", "world": 1}\n\xff\xfe binary\n{"kind": "train", "step": 2}\n')
    with pytest.raises(MetricsError, match=r"1 line of .*metrics.jsonl skipped \(line 2: not UTF-8 text"):
        read_records(path)
    with pytest.raises(MetricsError):
        MetricsLog(path, tensorboard=False, resume_step=2)
    path.write_bytes(b'{"kind": "layout", "world": 1}\n{"kind": "train", "st')  # cut by a kill: fine
    assert read_records(path) == [{"kind": "layout", "world": 1}]


# --- disk full -----------------------------------------------------------------------------------

def test_18_a_full_disk_names_the_file(tmp_path):
    with pytest.raises(OSError) as caught, atomic_file(tmp_path / "last.safetensors") as f:
        f.write(b"weights")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # what a write to a full disk raises: no file name
    assert os_error_line(caught.value).startswith(f"{tmp_path / 'last.safetensors'}: No space left on device")
    assert list(tmp_path.iterdir()) == [], "no temp file is left behind"
    if os.path.exists("/dev/full"):  # the metrics log, on a device that is always full
        log = MetricsLog(tmp_path / "metrics.jsonl", tensorboard=False)
        (tmp_path / "metrics.jsonl").symlink_to("/dev/full")
        with pytest.raises(OSError) as caught:
            log.write("train", step=1, loss=1.0)
        assert os_error_line(caught.value).startswith(f"{tmp_path / 'metrics.jsonl'}: No space left on device")


# --- broken manifests and pickles --------------------------------------------------------------

def test_13_a_manifest_that_is_a_json_list(tmp_path):
    (tmp_path / MANIFEST_NAME).write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"manifest.json is not a valid b2t manifest: the top level is a JSON list"):
        Manifest.load(tmp_path)
    assert verify(tmp_path).errors[0].endswith("the top level is a JSON list, expected an object")


def test_13_a_manifest_whose_sessions_is_a_string(small, tmp_path):
    """Read as a list of letters: sessions 't', '1', '5' ... (and "not distinct" at best)."""
    raw = json.loads((small[1] / MANIFEST_NAME).read_text())
    raw["sessions"] = "t15.2023.08.11"
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"not a valid b2t manifest: sessions is a JSON str, expected a list"):
        Manifest.load(tmp_path)


class NotAState:
    pass


def test_20_a_pickle_that_is_not_a_checkpoint(tmp_path):
    torch.save({"model": NotAState(), "weights": torch.zeros(2)}, tmp_path / "other.pt")
    np.save(tmp_path / "array.npy", np.zeros(3))
    for name in ("other.pt", "array.npy"):
        with pytest.raises(BaselineError) as caught:
            load_baseline(tmp_path / name)
        message = str(caught.value)
        assert message.startswith(f"{tmp_path / name}: not a baseline checkpoint")
        assert "weights_only=False" not in message and "issue" not in message
    assert "NotAState object" in str(pytest.raises(BaselineError, load_baseline, tmp_path / "other.pt").value)


def test_a_malformed_baseline_args_yaml_is_one_line(tmp_path):
    from b2t.import_baseline import read_args

    (tmp_path / "args.yaml").write_text("model: [\n")
    with pytest.raises(BaselineError, match=r"args.yaml:2: not valid YAML .*expected the baseline's args.yaml") as caught:
        read_args(tmp_path / "args.yaml")
    assert "\n" not in str(caught.value)
