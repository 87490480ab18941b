"""`b2t-report RUN`: a PNG of the learning curves and per-session PER, from metrics.jsonl."""

from __future__ import annotations

from click.testing import CliRunner

from b2t.report import curves, main
from b2t.train.metrics_log import MetricsLog, read_records

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _val(step: int, per: float) -> dict:
    return {"step": step, "per": per, "loss": 2.0 * per, "n_trials": 4,
            "per_session": {"all": {"rate": per}, "groups": {"t15.a": {"rate": per - 0.1}, "t15.b": {"rate": None}}}}


def _run(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl", tensorboard=False)
    log.write("layout", world=1)
    for step in (10, 20, 30):
        log.write("train", step=step, loss=3.0 / step, grad_norm=1.0, lr=0.01, steps_per_s=2.0, compilations=3)
    log.write("val", **_val(20, 0.5))
    log.write("train", step=30, loss=0.05, grad_norm=1.0, lr=0.01, steps_per_s=2.0)  # a resumed rerun of step 30
    log.write("val", **_val(30, 0.4))
    return tmp_path


def test_curves_hold_one_point_per_step_and_every_session(tmp_path):
    panels = curves(list(read_records(_run(tmp_path) / "metrics.jsonl")))
    assert panels["CTC loss"]["train"] == [(10, 0.3), (20, 0.15), (30, 0.05)]
    assert panels["validation PER"]["all sessions"] == [(20, 0.5), (30, 0.4)]
    assert [(s, round(p, 6)) for s, p in panels["validation PER"]["t15.a"]] == [(20, 0.4), (30, 0.3)]
    assert "t15.b" not in panels["validation PER"], "no rate, no point"


def test_report_writes_a_png(tmp_path):
    run = _run(tmp_path)
    result = CliRunner().invoke(main, [str(run)])
    assert result.exit_code == 0, result.output
    assert (run / "report.png").read_bytes().startswith(PNG_MAGIC)
    result = CliRunner().invoke(main, [str(run), "-o", str(tmp_path / "elsewhere.png")])
    assert result.exit_code == 0 and (tmp_path / "elsewhere.png").read_bytes().startswith(PNG_MAGIC)


def test_report_errors_are_one_line(tmp_path):
    result = CliRunner().invoke(main, [str(tmp_path)])
    assert result.exit_code == 2 and "metrics.jsonl not found" in result.output
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "run").mkdir()
    run = _run(tmp_path / "run")
    result = CliRunner().invoke(main, [str(run), "-o", str(tmp_path / "a_file" / "r.png")])
    assert result.exit_code == 2 and "Traceback" not in result.output and "a_file" in result.output
