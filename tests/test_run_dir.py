"""What a run directory may hold when b2t-train starts or resumes there (`b2t.train.resume`):
issue 35, cases 1 and 9. Eager, tiny config, in-process: each run is a few steps."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from b2t.config import TINY_CONFIG, load_config
from b2t.run_lock import RUN_LOCK
from b2t.train.loop import RunOptions, train
from b2t.train.resume import RunDirError

SETS = ["train.backend=eager", "train.log_every=1", "train.val_every=2", "train.checkpoint_every=2",
        "train.num_workers=0"]
OPTS = RunOptions(progress=False, device="cpu")


def _cfg(*extra: str):
    return load_config(TINY_CONFIG, [*SETS, *extra])


def _snapshot(run: Path) -> dict[str, bytes]:
    """The run's files (its lock aside, which names its latest holder)."""
    return {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != RUN_LOCK}


@pytest.fixture(scope="module")
def finished(tiny_dataset, tmp_path_factory) -> tuple[Path, dict]:
    """A 4-step run (checkpoints at 2 and 4) and its summary."""
    run = tmp_path_factory.mktemp("finished") / "run"
    return run, train(tiny_dataset[1], run, _cfg("train.steps=4"), OPTS)


def _copy(run: Path, tmp_path: Path) -> Path:
    import shutil

    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


def test_01_a_run_whose_last_checkpoint_was_deleted_is_not_overwritten(finished, tiny_dataset, tmp_path):
    """Exit 0 and nothing said: metrics.jsonl truncated, best.safetensors overwritten by a worse model."""
    run = _copy(finished[0], tmp_path)
    (run / "last.safetensors").unlink()
    before = _snapshot(run)
    with pytest.raises(RunDirError, match=r"holds an earlier run's metrics.jsonl \(steps up to 4\) and "
                                          r"best.safetensors but no last.safetensors: a new run here would overwrite"):
        train(tiny_dataset[1], run, _cfg("train.steps=4"), OPTS)
    with pytest.raises(RunDirError, match=r"although a checkpoint was due by step 2: it was deleted or moved"):
        train(tiny_dataset[1], run, _cfg("train.steps=4"), replace(OPTS, resume=True))
    assert _snapshot(run) == before


def test_a_best_checkpoint_alone_is_kept_too(finished, tiny_dataset, tmp_path):
    run = _copy(finished[0], tmp_path)
    (run / "last.safetensors").unlink()
    (run / "metrics.jsonl").unlink()
    with pytest.raises(RunDirError, match=r"holds an earlier run's best.safetensors but no last.safetensors"):
        train(tiny_dataset[1], run, _cfg("train.steps=4"), OPTS)


@pytest.mark.parametrize("resume", [False, True])
def test_a_new_run_refuses_a_folder_of_other_files_and_leaves_it_as_it_was(tiny_dataset, tmp_path, resume):
    """RUN_DIR mistyped as a folder of the user's (the HDF5 sessions, `.`): exit 0 before, with
    last.safetensors, tensorboard/ and a metrics.jsonl written among them, a file of that name replaced."""
    folder = tmp_path / "hdf5"
    folder.mkdir()
    (folder / "t15.2023.08.11.hdf5").write_bytes(b"sessions")
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match=r"hdf5 is not empty and holds no b2t-train run \(notes.txt, "
                                          r"t15.2023.08.11.hdf5\): .* choose a new or empty directory"):
        train(tiny_dataset[1], folder, _cfg("train.steps=2"), replace(OPTS, resume=resume))
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt", "t15.2023.08.11.hdf5"]


def test_a_run_stopped_before_its_first_step_starts_again(finished, tiny_dataset, tmp_path):
    """Only start-up records (a kill during the warm-up): nothing to lose, so no refusal either way."""
    run = tmp_path / "run"
    run.mkdir()
    records = [r for r in map(json.loads, (finished[0] / "metrics.jsonl").read_text().splitlines())
               if r["kind"] in ("layout", "compile")]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert train(tiny_dataset[1], run, _cfg("train.steps=4"), OPTS)["weights_sha256"] == finished[1]["weights_sha256"]


def test_resume_before_the_first_checkpoint_was_due_starts_from_scratch(finished, tiny_dataset, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    first = [r for r in map(json.loads, (finished[0] / "metrics.jsonl").read_text().splitlines())
             if r["kind"] != "summary" and r.get("step", 0) < 2]  # killed -9 after step 1, before step 2's checkpoint
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in first))
    with pytest.raises(RunDirError, match="metrics.jsonl \\(steps up to 1\\)"):
        train(tiny_dataset[1], run, _cfg("train.steps=4"), OPTS)
    done = train(tiny_dataset[1], run, _cfg("train.steps=4"), replace(OPTS, resume=True))
    assert "starting from scratch" in capsys.readouterr().out
    assert done["weights_sha256"] == finished[1]["weights_sha256"]


# --- 9: settings that change the data order on --resume -----------------------------------------------

@pytest.mark.parametrize("setting, value", [("seed", 5), ("shuffle_buffer", 2), ("grad_accum", 2)])
def test_09_resume_refuses_a_setting_that_changes_the_data_order(finished, tiny_dataset, tmp_path, setting, value):
    run = _copy(finished[0], tmp_path)
    before = _snapshot(run)
    with pytest.raises(RunDirError, match=rf"cannot continue exactly with train.{setting}={value} \(trained with "):
        train(tiny_dataset[1], run, _cfg("train.steps=6", f"train.{setting}={value}"), replace(OPTS, resume=True))
    assert _snapshot(run) == before


def test_09_resume_keeps_the_loader_workers_it_was_trained_with(finished, tiny_dataset, tmp_path, capsys):
    """Other loader workers interleave the shards in another order: the checkpoint's count is kept."""
    unbroken = train(tiny_dataset[1], tmp_path / "unbroken", _cfg("train.steps=6"), OPTS)
    run = _copy(finished[0], tmp_path)
    resumed = train(tiny_dataset[1], run, _cfg("train.steps=6", "train.num_workers=2"), replace(OPTS, resume=True))
    assert "note: train.num_workers=2 ignored" in capsys.readouterr().out
    assert resumed["weights_sha256"] == unbroken["weights_sha256"]
    layouts = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "layout"]
    assert len(layouts) == 2


def test_09_resume_on_another_backend_says_it_is_not_bit_identical(finished, tiny_dataset, tmp_path, capsys):
    run = _copy(finished[0], tmp_path)
    train(tiny_dataset[1], run, _cfg("train.steps=5", "train.compute_dtype=bf16"), replace(OPTS, resume=True))
    assert "train.compute_dtype='auto', this run uses 'bf16': training goes on, but not bit-identical" in \
        capsys.readouterr().out
