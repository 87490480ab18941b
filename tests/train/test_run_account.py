"""What a run tells a person about its time: honest steps/s (the warm-up, validations and
checkpoints timed apart), timestamps on every record, a record per resume, an end summary
with the next commands, a finished run re-run doing nothing, and the report of a 2-step run
and of a resumed run drawn from the real records."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from b2t.cli.report import main as report_main
from b2t.cli.train import train_main
from b2t.config import TINY_CONFIG
from b2t.report import load_curves
from b2t.report_figure import figure
from b2t.train import loop
from b2t.train.rates import StepClock

SETS = ["train.log_every=1", "train.val_every=1", "train.checkpoint_every=1"]


def _train(shards, run_dir, steps: int, *extra: str) -> str:
    args = [str(shards), str(run_dir), "--config", str(TINY_CONFIG), "--backend", "eager", "--no-progress",
            "--set", f"train.steps={steps}", *(a for s in SETS for a in ("--set", s)), *extra]
    result = CliRunner().invoke(train_main, args)
    assert result.exit_code == 0, result.output
    return result.output


def _records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tiny_dataset, tmp_path_factory):
    """A 2-step run, and a run of 2 steps resumed to 3: (shards, two, resumed, their outputs)."""
    _, shards = tiny_dataset
    root = tmp_path_factory.mktemp("account")
    two = _train(shards, root / "two", 2)
    shutil.copytree(root / "two", root / "resumed")  # the same 2 steps, then resumed to 3
    resumed = _train(shards, root / "resumed", 3, "--resume")
    return shards, root / "two", root / "resumed", two, resumed


def test_every_record_is_timestamped_and_the_warm_up_is_timed_apart(runs):
    _, two, _, _, _ = runs
    records = _records(two)
    assert all(isinstance(r["time"], float) and isinstance(r["elapsed_s"], float) for r in records)
    assert [r["elapsed_s"] for r in records] == sorted(r["elapsed_s"] for r in records)
    pieces = [r for r in records if r["kind"] == "compiled"]
    assert [r["index"] for r in pieces] == list(range(1, len(pieces) + 1)) and pieces[0]["of"] == len(pieces)
    warm = next(r for r in records if r["kind"] == "compile")
    first = next(r for r in records if r["kind"] == "train")
    assert warm["seconds"] > 0
    # the first window's time is its own step only: not the warm-up (nor the data start-up) before it
    assert first["seconds"] <= first["elapsed_s"] - warm["elapsed_s"] + 1e-3
    assert first["steps_per_s"] == pytest.approx(1 / first["seconds"], rel=1e-2)
    summary = records[-1]
    times = summary["times"]
    assert summary["kind"] == "summary" and times["windows"] == 2
    assert times["warm_up"] == pytest.approx(warm["seconds"], abs=1e-3)
    parts = times["warm_up"] + times["training"] + times["validation"] + times["other"]
    assert parts == pytest.approx(times["wall"], abs=1e-2)


def test_the_end_summary_names_times_checkpoints_and_the_next_commands(runs):
    shards, two, _, output, _ = runs
    done = output[output.index("done: "):]
    assert done.startswith("done: 2 steps; run time ") and "warm-up " in done and "training " in done
    assert "speed: median " in done and " s/step (" in done
    assert "best val PER " in done and f"at step 2: {two / 'best.safetensors'}" in done
    assert f"last checkpoint (step 2, resumable): {two / 'last.safetensors'}" in done
    assert f"b2t-report {two}" in done
    assert f"b2t-eval {two / 'best.safetensors'} {shards} --split val" in done


def test_a_resume_is_recorded_and_its_time_goes_on(runs):
    _, _, resumed, _, output = runs
    records = _records(resumed)
    resumes = [r for r in records if r["kind"] == "resume"]
    assert [r["step"] for r in resumes] == [2]
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3]
    assert [r["elapsed_s"] for r in records] == sorted(r["elapsed_s"] for r in records), "the run's own clock"
    assert len([r for r in records if r["kind"] == "compile"]) == 2, "each attempt's warm-up has its record"
    assert "done: 3 steps; " in output


def test_a_finished_run_rerun_compiles_and_writes_nothing(runs, monkeypatch):
    shards, _, resumed, _, output = runs
    before = (resumed / "metrics.jsonl").read_bytes()

    def refuse(*args, **kwargs):
        raise AssertionError("a finished run must not build a backend or warm up")

    monkeypatch.setattr(loop, "make_backend", refuse)
    monkeypatch.setattr(loop.Run, "warm_up", refuse)
    again = _train(shards, resumed, 3, "--resume")
    assert "done: 3 steps (already finished: nothing to do)" in again
    assert (resumed / "metrics.jsonl").read_bytes() == before
    assert again.splitlines()[1:] == output[output.index("done: "):].splitlines()[1:], "the same summary"


@pytest.mark.parametrize("which", ["two", "resumed"])
def test_the_report_of_a_real_run_is_drawn(runs, which):
    run_dir = runs[1] if which == "two" else runs[2]
    result = CliRunner().invoke(report_main, [str(run_dir)])
    assert result.exit_code == 0, result.output
    assert (run_dir / "report.png").read_bytes().startswith(b"\x89PNG")
    curves, _ = load_curves(run_dir)
    axes = figure([curves]).axes
    steps = 2 if which == "two" else 3
    assert list(axes[0].lines[0].get_xdata()) == list(range(1, steps + 1)), "train loss at every step"
    assert curves.resumes == ([] if which == "two" else [2])
    marks = [ln for ln in axes[0].lines if list(ln.get_xdata()) == [2, 2]]
    assert bool(marks) == (which == "resumed"), "a resume is marked where it happened"
    assert len(curves.sessions) == 5 and len(axes[2].patches) == 5, "PER per session at the end"


def test_the_step_clock_counts_stepping_time_only(monkeypatch):
    import b2t.train.rates as rates

    now = [0.0]
    monkeypatch.setattr(rates.time, "perf_counter", lambda: now[0])
    clock = StepClock()
    now[0] = 5.0  # setup
    clock.start("warm-up")
    now[0] = 65.0
    clock.start("training")
    for _ in range(3):
        now[0] += 0.5
        clock.stepped()
    with clock.apart("validation"):
        now[0] += 10.0
    now[0] += 0.5
    clock.stepped()
    assert clock.window() == (4, 2.0)
    now[0] += 1.0
    clock.stepped()
    assert clock.window() == (1, 1.0)
    assert clock.seconds() == {"setup": 5.0, "warm-up": 60.0, "training": 3.0, "validation": 10.0}


def test_the_next_commands_of_a_run_without_validation_name_no_val_split(tmp_path):
    """A dataset with no val split: the end suggested `b2t-eval ... --split val`, a split it lacks."""
    from b2t.train.summary import format_summary

    times = {"wall": 1.0, "warm_up": 0.5, "training": 0.5, "validation": 0.0, "other": 0.0, "median_step_s": None,
             "windows": 0}
    text = format_summary({"run_dir": str(tmp_path / "run"), "dataset": str(tmp_path / "ds"), "times": times,
                           "steps": 2, "best_per": None, "final": {}, "xla": False})
    assert "no validation (the dataset has no val split)" in text and "--split val" not in text
    assert f"b2t-eval {tmp_path / 'run' / 'last.safetensors'} {tmp_path / 'ds'} --split SPLIT" in text
