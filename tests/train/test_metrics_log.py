"""metrics.jsonl stays standard JSON and TensorBoard's own reader finds the same scalars."""

from __future__ import annotations

import json

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from b2t.run_dir import TENSORBOARD, read_records
from b2t.train.metrics_log import MetricsLog, finite_or_null


def _strict(line: str) -> dict:
    def refuse(name: str) -> None:
        raise ValueError(f"not standard JSON: {name}")
    return json.loads(line, parse_constant=refuse)


def _val(step: int, per: float) -> dict:
    return {"step": step, "per": per, "loss": 2.0, "n_trials": 4,
            "per_session": {"all": {"rate": per}, "groups": {"t15.a": {"rate": per}, "t15.b": {"rate": None}}}}


def test_non_finite_values_are_written_as_null(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl", tensorboard=False)
    log.write("train", step=1, loss=float("nan"), grad_norm=float("inf"), extra=[1.0, float("-inf")])
    log.write("summary", best_per=float("inf"), nested={"x": float("nan")})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    records = [{k: v for k, v in _strict(line).items() if k not in ("time", "elapsed_s")} for line in lines]
    assert records[0] == {"kind": "train", "step": 1, "loss": None, "grad_norm": None, "extra": [1.0, None]}
    assert records[1] == {"kind": "summary", "best_per": None, "nested": {"x": None}}
    assert finite_or_null({"a": (0.5, float("nan"))}) == {"a": [0.5, None]}


def test_tensorboard_reader_finds_the_scalars(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl", tensorboard=True)
    for step in (10, 20):
        log.write("train", step=step, loss=3.0 / step, grad_norm=1.5, lr=0.01, lr_day=0.02, steps_per_s=4.0,
                  compilations=7, fallbacks={})
    log.write("val", **_val(20, 0.4))
    log.close()
    events = EventAccumulator(str(tmp_path / TENSORBOARD))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"loss/train", "train/grad_norm", "lr/main", "lr/day", "train/steps_per_s", "xla/compilations",
            "loss/val", "per/val", "per_session/t15.a"} <= tags
    assert "per_session/t15.b" not in tags, "a session without a rate has no point"
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("loss/train")] == [(10, 0.3), (20, 0.15)]
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("per_session/t15.a")] == [(20, 0.4)]


def test_a_resumed_log_drops_what_comes_after_its_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path, tensorboard=False)
    log.write("layout", world=1)
    for step in (2, 4, 6):
        log.write("train", step=step, loss=1.0)
    with path.open("a") as f:
        f.write('{"kind": "train", "st')  # a line cut short by kill -9
    MetricsLog(path, tensorboard=False, resume_step=4).write("train", step=6, loss=0.5)
    assert [(r["kind"], r.get("step"), r.get("loss")) for r in read_records(path)] == [
        ("layout", None, None), ("train", 2, 1.0), ("train", 4, 1.0), ("train", 6, 0.5)]
    MetricsLog(path, tensorboard=False)  # a fresh start: nothing of the replaced run is kept
    assert not path.exists()


def test_every_record_has_a_wall_clock_time_and_the_runs_own_time_across_a_resume(tmp_path, monkeypatch):
    """elapsed_s goes on from the last record a resume kept: the run's time, without the time between
    a kill and the restart; `time` is the wall clock."""
    import b2t.train.metrics_log as metrics_log

    now = [1000.0]
    monkeypatch.setattr(metrics_log.time, "time", lambda: now[0])
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path, tensorboard=False)
    for step in (2, 4, 6):
        now[0] += 10
        log.write("train", step=step, loss=1.0)
    now[0] += 3600  # killed after step 6, restarted an hour later from the checkpoint at step 4
    resumed = MetricsLog(path, tensorboard=False, resume_step=4)
    now[0] += 5
    resumed.write("resume", step=4)
    assert [(r["step"], r["time"], r["elapsed_s"]) for r in read_records(path)] == [
        (2, 1010.0, 10.0), (4, 1020.0, 20.0), (4, 4635.0, 25.0)]
