"""One writer per folder, and no writer under a reader (`b2t.run_lock`): issue 35, cases 7 and 8.

Locks are flock(2) locks, which conflict between two open files even in one process, so a
test holds a lock itself and plays the other process; one test uses a real second process to
show that a lock dies with its holder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from b2t import run_lock
from b2t.cli.train import train_main
from b2t.config import TINY_CONFIG, load_config
from b2t.run_lock import DATASET_LOCK, RUN_LOCK, LockedError, exclusive, reading_dataset, shared
from b2t.train.loop import RunOptions, train
from preprocess.writer import prepare_dataset

CFG = load_config(TINY_CONFIG, ["train.backend=eager", "train.steps=1"])
OPTS = RunOptions(progress=False, device="cpu")


def test_07_a_second_trainer_in_one_run_directory_is_refused(tiny_dataset, tmp_path):
    """Both ran to exit 0 before: every step logged twice, last.safetensors whichever came last."""
    run = tmp_path / "run"
    run.mkdir()
    with exclusive(run, RUN_LOCK, "b2t-train"):  # the first trainer
        result = CliRunner().invoke(train_main, [str(tiny_dataset[1]), str(run), "--config", str(TINY_CONFIG),
                                                 "--backend", "eager", "--device", "cpu", "--set", "train.steps=1"])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert f"{run} is in use by another b2t-train (pid {os.getpid()} on " in result.output
        assert sorted(p.name for p in run.iterdir()) == [RUN_LOCK], "the refused run wrote nothing"
    train(tiny_dataset[1], run, CFG, OPTS)  # free again


def test_08_preprocess_overwrite_refuses_a_dataset_a_run_reads(tiny_dataset, tmp_path):
    """The run finished (exit 0) on a mix of old and new shards."""
    hdf5, shards = tiny_dataset
    before = {p.name: p.stat().st_mtime_ns for p in shards.iterdir()}
    with reading_dataset(shards):  # a b2t-train or b2t-eval reading it
        with pytest.raises(LockedError, match=rf"{shards} is being read by a b2t-train or b2t-eval: wait until it "
                                              "finishes, or write to another folder"):
            prepare_dataset(hdf5, shards, load_config(TINY_CONFIG, ["data.seed=3"]), overwrite=True, progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in shards.iterdir()} == before


def test_08_a_run_refuses_a_dataset_being_written(tiny_dataset, tmp_path):
    shards = tiny_dataset[1]
    with exclusive(shards, DATASET_LOCK, "b2t-preprocess"):
        with pytest.raises(LockedError, match=rf"{shards} is being written by a b2t-preprocess \(pid {os.getpid()}"):
            train(shards, tmp_path / "run", CFG, OPTS)
    assert not (tmp_path / "run").exists(), "refused before it made RUN_DIR"
    with reading_dataset(shards), reading_dataset(shards):  # readers share it
        pass


def test_a_lock_dies_with_its_holder(tmp_path):
    """flock: the OS frees the lock of a killed process, so a kill -9 never leaves a folder locked."""
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from b2t.run_lock import exclusive
        with exclusive(Path({str(tmp_path)!r}), "x.lock", "b2t-train"):
            print("held", flush=True)
            time.sleep(600)
    """)
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockedError, match=rf"in use by another b2t-train \(pid {holder.pid} on "):
            with exclusive(tmp_path, "x.lock", "b2t-train"):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with exclusive(tmp_path, "x.lock", "b2t-train"):
        pass


def test_a_read_only_dataset_without_a_lock_file_is_read_unlocked(tmp_path, monkeypatch):
    def read_only(path, mode="r", *args, **kwargs):
        if "a" in mode:
            raise PermissionError(13, "Permission denied", str(path))
        return open(path, mode, *args, **kwargs)

    monkeypatch.setattr(run_lock, "open", read_only, raising=False)
    with shared(tmp_path, DATASET_LOCK, "a b2t-preprocess"):  # no lock file, none can be made: no lock
        pass
    (tmp_path / DATASET_LOCK).touch()
    with shared(tmp_path, DATASET_LOCK, "a b2t-preprocess"):  # an existing one is opened read-only
        pass
