"""`b2t-preprocess` end to end on a `b2t-synth` tree, its help, and its clean errors."""

from __future__ import annotations

import shutil
from collections import defaultdict
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import webdataset as wds
from click.testing import CliRunner

from b2t.config import TINY_CONFIG, load_config
from b2t.data.manifest import Manifest
from b2t.data.sample import decode_sample
from preprocess.cli import main
from preprocess.synth import main as synth_main
from preprocess.synth import write_trial


def _run(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def synth_tree(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("synth") / "hdf5_data_final"
    result = CliRunner().invoke(synth_main, [str(src), "--sessions", "5", "--train-trials", "10",
                                             "--val-trials", "3", "--test-trials", "3", "--seed", "5"])
    assert result.exit_code == 0, result.output
    return src


def test_end_to_end_shapes_dtypes_and_verify(synth_tree, tmp_path):
    out = tmp_path / "shards"
    code, output = _run(synth_tree, out, "--config", TINY_CONFIG, "--epochs", "2", "--workers", "2", "--no-progress")
    assert code == 0, output
    assert "buckets (T x B, L labels):" in output and "exclusions: 0" in output
    manifest = Manifest.load(out)
    assert len(manifest.sessions) == 5
    k = load_config(TINY_CONFIG).data.n_buckets
    shapes = defaultdict(set)
    for sample in wds.WebDataset([str(out / s.name) for s in manifest.shards], shardshuffle=False):
        tensors, meta = decode_sample(sample)
        assert tensors["features"].dtype == torch.bfloat16
        shapes[meta["split"]].add((tuple(tensors["features"].shape), tuple(tensors["seq_class_ids"].shape)))
    assert set(shapes) == {"train", "val", "test"}
    assert all(1 <= len(s) <= k for s in shapes.values())
    assert set().union(*shapes.values()) <= {((b.B, b.T, 512), (b.B, b.L)) for b in manifest.buckets}

    code, output = _run("verify", out)
    assert code == 0 and "OK" in output, output
    victim = out / manifest.shards_of("train", epoch=1)[0].name
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x10
    victim.write_bytes(bytes(data))
    code, output = _run("verify", out)
    assert code == 1 and f"error: {victim.name}: sha256" in output, output


def test_help_explains_both_commands():
    code, output = _run("--help")
    assert code == 0 and "b2t-preprocess SRC OUT" in output and "b2t-preprocess verify DIR" in output
    code, output = _run("build", "--help")
    assert code == 0 and all(opt in output for opt in ("--config", "--set", "--workers", "--skip-bad", "--splits"))
    code, output = _run("verify", "--help")
    assert code == 0 and "manifest.json" in output and "--no-decode" in output


def test_bad_config_key_is_one_clean_line(synth_tree, tmp_path):
    code, output = _run(synth_tree, tmp_path / "out", "--config", TINY_CONFIG, "--set", "data.batchsize=8")
    assert code == 2 and "unknown key in section 'data' 'batchsize'; did you mean 'batch_size'?" in output
    bad = tmp_path / "bad.yaml"
    bad.write_text("data:\n  n_bucket: 3\n")
    code, output = _run(synth_tree, tmp_path / "out", "--config", bad)
    assert code == 2 and "did you mean 'n_buckets'?" in output
    code, output = _run(synth_tree, tmp_path / "out", "--splits", "train,dev")
    assert code == 2 and "comma-separated subset of train,val,test" in output


def test_bad_trial_fails_naming_it_or_is_excluded(synth_tree, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(synth_tree, src)
    session = sorted(p.name for p in src.iterdir() if p.is_dir())[2]
    with h5py.File(src / session / "data_val.hdf5", "r+") as f:
        x = f["trial_0001"]["input_features"]
        row = np.array(x[4])
        row[7] = np.nan
        x[4] = row
        # valid data, but too short for the model: batching must exclude it, not the reader
        write_trial(f, len(f), np.zeros((10, 512), np.float32), session=session, block=9, trial=0,
                    labels=[5, 6], sentence="hi")
    code, output = _run(src, tmp_path / "out", "--config", TINY_CONFIG, "--splits", "val,test", "--no-progress")
    assert code == 2
    assert f"{session}/data_val.hdf5: trial_0001: input_features has NaN/Inf at row 4, channel 7" in output
    code, output = _run(src, tmp_path / "out", "--config", TINY_CONFIG, "--splits", "val,test", "--skip-bad", "--no-progress")
    assert code == 0 and "exclusions: 2 (listed in" in output, output
    bad, short = Manifest.load(tmp_path / "out").exclusions
    assert (bad.file, bad.trial) == (f"{session}/data_val.hdf5", "trial_0001") and "NaN" in bad.reason
    assert (short.file, short.trial) == (f"{session}/data_val.hdf5", "trial_0003")
    assert short.reason == "10 time bins are shorter than one patch of 14 bins"
    assert set(Manifest.load(tmp_path / "out").splits) == {"val", "test"}


def test_refuses_a_foreign_output_directory(synth_tree, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "thesis.pdf").write_bytes(b"%PDF")
    code, output = _run(synth_tree, out, "--config", TINY_CONFIG, "--no-progress")
    assert code == 2 and "is not empty and holds no b2t-preprocess run" in output
    assert (out / "thesis.pdf").exists()


def test_an_empty_session_folder_is_warned_about_and_recorded(synth_tree, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(synth_tree, src)
    (src / "t15.2099.01.01").mkdir()  # a day whose files never arrived
    result = CliRunner().invoke(main, [str(src), str(tmp_path / "out"), "--config", str(TINY_CONFIG),
                                       "--splits", "val,test", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "warning: t15.2099.01.01: empty folder" in result.stderr
    manifest = Manifest.load(tmp_path / "out")
    assert len(manifest.sessions) == 5 and "t15.2099.01.01" not in manifest.sessions
    assert [w.split(":")[0] for w in manifest.warnings] == ["t15.2099.01.01"]
