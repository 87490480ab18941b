"""Shard writing: what comes back through plain WebDataset, resuming, refusing, verifying."""

from __future__ import annotations

import multiprocessing
import shutil
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import webdataset as wds

from b2t.config import Config, DataConfig, ModelConfig
from b2t.contract import FIELDS
from b2t.data.manifest import MANIFEST_NAME, Manifest
from b2t.data.sample import decode_sample
from b2t.workers import run_jobs
from preprocess import writer
from preprocess.synth import SynthSpec, write_dataset
from preprocess.trials import DataError
from preprocess.verify import batch_problems, verify
from preprocess.writer import LOCK_NAME, STATE_NAME, OutputDirError, one_torch_thread, prepare_dataset

CONFIG = Config(
    data=DataConfig(n_buckets=3, batch_size=8, token_budget=2048, row_multiple=2, label_multiple=8,
                    days_per_batch=2, epochs=2, batches_per_shard=3, seed=7),
    model=ModelConfig(patch_size=14, patch_stride=4),
)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("synth") / "hdf5_data_final"
    write_dataset(SynthSpec(sessions=3, train_trials=14, val_trials=5, test_trials=4, seed=3), src)
    return src


@pytest.fixture(scope="module")
def clean(source, tmp_path_factory) -> tuple[Path, writer.PrepareReport]:
    out = tmp_path_factory.mktemp("clean") / "shards"
    return out, prepare_dataset(source, out, CONFIG, progress=False)


def _copy(clean_out: Path, tmp_path: Path) -> Path:
    out = tmp_path / "shards"
    shutil.copytree(clean_out, out)
    return out


def _files(out: Path) -> dict[str, bytes]:
    """Every shard and the manifest, by name (the run state and lock are bookkeeping)."""
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())
            if p.suffix in (".tar", ".json") and p.name != STATE_NAME}


def _read_batches(out: Path, manifest: Manifest):
    urls = [str(out / s.name) for s in manifest.shards]
    for sample in wds.WebDataset(urls, shardshuffle=False):
        yield decode_sample(sample)


@pytest.fixture
def one_thread():
    """Small tensor ops are 20x slower when torch's threads fight the other tests for 2 cores."""
    with one_torch_thread():
        yield


def test_batches_read_back_exactly(source, clean, one_thread):
    out, report = clean
    manifest = Manifest.load(out)
    assert manifest.to_json() == report.manifest.to_json()
    assert manifest.sessions == sorted(p.name for p in source.iterdir() if p.is_dir())
    seen: Counter = Counter()
    sources = {p.relative_to(source).as_posix(): h5py.File(p, "r") for p in source.glob("*/*.hdf5")}
    for tensors, meta in _read_batches(out, manifest):
        shape = manifest.buckets[meta["bucket"]]
        assert shape in manifest.buckets and len(manifest.buckets) <= CONFIG.data.n_buckets
        for name, field in FIELDS.items():
            assert tensors[name].dtype == field.dtype and tuple(tensors[name].shape) == shape.field_shape(name)
        assert batch_problems(tensors, meta, shape, len(manifest.sessions)) == []
        for i, row in enumerate(meta["rows"]):
            if row is None:
                assert not tensors["valid"][i] and not tensors["features"][i].any()
                continue
            seen[(meta["split"], meta["epoch"], row["file"], row["group"])] += 1
            g = sources[row["file"]][row["group"]]
            x = torch.from_numpy(g["input_features"][()]).to(torch.bfloat16)  # (n, F)
            labels = g["seq_class_ids"][: g.attrs["seq_len"]] if "seq_len" in g.attrs else np.zeros(0)
            n = int(tensors["n_time_steps"][i])
            assert n == len(x) <= shape.T
            assert torch.equal(tensors["features"][i, :n].view(torch.int16), x.view(torch.int16))  # bit-exact
            assert not tensors["features"][i, n:].any()
            assert tensors["seq_class_ids"][i, : len(labels)].tolist() == labels.tolist()
            assert int(tensors["phone_seq_lens"][i]) == len(labels)
            assert manifest.sessions[int(tensors["day_indices"][i])] == row["session"]
    # every trial of the source: val/test once, train once per epoch
    for split, epochs in (("train", CONFIG.data.epochs), ("val", 1), ("test", 1)):
        n_source = sum(len(f) for name, f in sources.items() if name.endswith(f"data_{split}.hdf5"))
        for epoch in range(epochs):
            counts = [c for (s, e, _, _), c in seen.items() if (s, e) == (split, epoch)]
            assert len(counts) == n_source and set(counts) == {1}
    for f in sources.values():
        f.close()
    assert [s.name for s in manifest.shards][:2] == ["train-e000-00000.tar", "train-e000-00001.tar"]
    assert {s.name for s in manifest.shards} >= {"val-00000.tar", "test-00000.tar", "train-e001-00000.tar"}


def test_rerun_does_no_work(source, clean, tmp_path):
    out = _copy(clean[0], tmp_path)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    report = prepare_dataset(source, out, CONFIG, progress=False)
    assert (report.written, report.reused) == (0, len(report.manifest.shards))
    unchanged = [STATE_NAME, LOCK_NAME]  # rewritten: the state, and the lock naming its latest holder
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name not in unchanged} == \
        {k: v for k, v in before.items() if k not in unchanged}


class Scanned(Exception):
    """Raised by a stand-in for scan_sources: the run went on to validate every trial."""


def test_a_rerun_of_a_finished_dataset_scans_nothing_until_a_source_changes(source, clean, tmp_path, monkeypatch):
    out, src = _copy(clean[0], tmp_path), tmp_path / "src"
    shutil.copytree(source, src)  # the manifest names its sources relative to SRC

    def scan(*args, **kwargs):
        raise Scanned

    monkeypatch.setattr(writer, "scan_sources", scan)
    report = prepare_dataset(src, out, CONFIG, progress=False)
    assert report.unchanged and (report.written, report.reused) == (0, len(report.manifest.shards))
    assert report.manifest.to_json() == clean[1].manifest.to_json()
    victim = next(src.rglob("data_val.hdf5"))
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes: only the sha256 can tell
    victim.write_bytes(bytes(data))
    with pytest.raises(Scanned):
        prepare_dataset(src, out, CONFIG, progress=False)
    victim.write_bytes(bytes(data[:-1]))  # another size
    with pytest.raises(Scanned):
        prepare_dataset(src, out, CONFIG, progress=False)


@pytest.mark.parametrize("damage", ["delete_shard", "stray_temp", "no_manifest", "corrupt_shard"])
def test_resume_completes_like_a_clean_run(source, clean, tmp_path, damage):
    out = _copy(clean[0], tmp_path)
    victim = out / "train-e000-00001.tar"
    if damage == "delete_shard":
        victim.unlink()
    elif damage == "stray_temp":  # what a killed writer leaves
        (out / ".train-e000-00001.tar.abc123.tmp").write_bytes(b"half a shard")
    elif damage == "no_manifest":  # killed after the last shard, before the manifest
        (out / MANIFEST_NAME).unlink()
    else:  # same size, other bytes: only the sha256 can tell
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0xFF
        victim.write_bytes(bytes(data))
    report = prepare_dataset(source, out, CONFIG, progress=False)
    assert report.written == (1 if damage in ("delete_shard", "corrupt_shard") else 0)
    assert _files(out) == _files(clean[0])
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    assert prepare_dataset(source, out, CONFIG, progress=False).written == 0


def test_crash_mid_run_leaves_no_manifest_and_resumes(source, clean, tmp_path, monkeypatch):
    out = tmp_path / "shards"
    calls = {"n": 0}
    real_read = writer.read_features

    def dying_read(refs):
        calls["n"] += 1
        if calls["n"] == 5:  # in the middle of the second shard
            raise KeyboardInterrupt
        return real_read(refs)

    monkeypatch.setattr(writer, "read_features", dying_read)
    with pytest.raises(KeyboardInterrupt):
        prepare_dataset(source, out, CONFIG, progress=False)
    monkeypatch.undo()
    assert not (out / MANIFEST_NAME).exists()
    assert sorted(p.name for p in out.glob("*.tar")) == ["train-e000-00000.tar"]
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    report = prepare_dataset(source, out, CONFIG, progress=False)
    assert report.reused == 1 and report.written == len(report.manifest.shards) - 1
    assert _files(out) == _files(clean[0])


_SLOW_CHILD = """
import sys, time
from pathlib import Path
from preprocess import writer
from tests.preprocess.test_writer import CONFIG
real_read = writer.read_features
writer.read_features = lambda refs: (time.sleep(0.2), real_read(refs))[1]
writer.Manifest.save = lambda self, out: time.sleep(120)  # the kill always lands before the manifest
writer.prepare_dataset(Path(sys.argv[1]), Path(sys.argv[2]), CONFIG, progress=False)
"""


def test_sigkill_mid_run_resumes(source, clean, tmp_path):
    out = tmp_path / "shards"
    child = subprocess.Popen([sys.executable, "-c", _SLOW_CHILD, str(source), str(out)],
                             cwd=Path(__file__).resolve().parents[2])
    deadline = time.monotonic() + 60
    # two shards on disk: the first one's run-state record is written (shards finish one by one)
    while len(list(out.glob("*.tar"))) < 2 and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    child.kill()  # SIGKILL: no cleanup handler runs
    child.wait()
    assert len(list(clean[0].glob("*.tar"))) > 2, "the test needs a dataset of several shards"
    assert len(list(out.glob("*.tar"))) >= 2 and not (out / MANIFEST_NAME).exists()
    report = prepare_dataset(source, out, CONFIG, progress=False)
    assert report.reused >= 1
    assert _files(out) == _files(clean[0])
    assert verify(out).ok


def test_other_config_refuses_then_overwrites(source, clean, tmp_path):
    out = _copy(clean[0], tmp_path)
    other = replace(CONFIG, data=replace(CONFIG.data, seed=8))
    with pytest.raises(OutputDirError, match=r"data\.seed: 7 then, 8 now.*--overwrite"):
        prepare_dataset(source, out, other, progress=False)
    assert _files(out) == _files(clean[0])  # refused before touching anything
    report = prepare_dataset(source, out, other, overwrite=True, progress=False)
    assert report.written == len(report.manifest.shards)
    assert Manifest.load(out).config["data"]["seed"] == 8
    assert verify(out).ok


def test_only_the_shard_shaping_keys_make_an_output_another_configs(source, clean, tmp_path):
    """A config differing in model size, optimizer or training keys continues the dataset (the
    shards do not depend on them); one differing in patch_size is refused, naming the key."""
    out = _copy(clean[0], tmp_path)
    other = replace(CONFIG, model=replace(CONFIG.model, gru=replace(CONFIG.model.gru, n_units=96)),
                    optim=replace(CONFIG.optim, lr=1e-3), train=replace(CONFIG.train, steps=7))
    report = prepare_dataset(source, out, other, progress=False)
    assert report.written == 0 and _files(out) == _files(clean[0])
    patched = replace(CONFIG, model=replace(CONFIG.model, patch_size=CONFIG.model.patch_size + 1))
    with pytest.raises(OutputDirError, match=rf"model\.patch_size: {CONFIG.model.patch_size} then, "
                                             rf"{CONFIG.model.patch_size + 1} now.*--overwrite"):
        prepare_dataset(source, out, patched, progress=False)
    assert _files(out) == _files(clean[0])


def test_foreign_directory_refuses(source, tmp_path):
    out = tmp_path / "shards"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputDirError, match="not empty"):
        prepare_dataset(source, out, CONFIG, progress=False)


def test_verify_names_the_flipped_shard(clean, tmp_path):
    out = _copy(clean[0], tmp_path)
    report = verify(out)
    assert report.ok and report.batches == sum(s.n_batches for s in Manifest.load(out).shards), report.summary()
    victim = out / "val-00000.tar"
    data = bytearray(victim.read_bytes())
    data[len(data) // 3] ^= 0x01
    victim.write_bytes(bytes(data))
    shutil.copy(out / "test-00000.tar", out / "test-00099.tar")
    report = verify(out)
    assert not report.ok
    assert len(report.errors) == 1 and report.errors[0].startswith("val-00000.tar: sha256")
    assert report.warnings and "test-00099.tar" in report.warnings[0]


def _failing_job(job: str) -> str:
    raise DataError(f"{job}/data_train.hdf5", "trial_0003", "input_features has NaN/Inf at row 2, channel 9")


def test_worker_data_errors_arrive_whole():
    # DataError cannot be unpickled as such; run_jobs carries its parts across the process boundary
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        with pytest.raises(DataError) as info:
            list(run_jobs(pool, _failing_job, ["t15.2023.08.11"]))
    assert (info.value.file, info.value.trial) == ("t15.2023.08.11/data_train.hdf5", "trial_0003")
    assert "NaN/Inf at row 2" in str(info.value)
