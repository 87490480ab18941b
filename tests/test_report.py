"""`b2t-report RUN [RUN ...]`: a PNG of the learning curves and per-session PER, from metrics.jsonl,
readable from a 2-step run to a 120k-step one. (The reports of real runs, a 2-step one and a
resumed one, are drawn in tests/train/test_run_account.py.)"""

from __future__ import annotations

import json
import math
import random

from click.testing import CliRunner

from b2t.cli.report import main
from b2t.report import curves, load_curves, load_eval
from b2t.report_figure import figure
from b2t.run_dir import read_records
from b2t.train.metrics_log import MetricsLog

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LOSS, PER, SESSIONS, LR, RATE, NORM = range(6)


def _val(step: int, per: float) -> dict:
    return {"step": step, "per": per, "loss": 2.0 * per, "n_trials": 4, "seconds": 1.0,
            "per_session": {"all": {"rate": per}, "groups": {"t15.a": {"rate": per - 0.1}, "t15.b": {"rate": None}}}}


def _run(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl", tensorboard=False)
    log.write("layout", world=1)
    for step in (10, 20, 30):
        log.write("train", step=step, loss=3.0 / step, grad_norm=1.0, lr=0.01, steps_per_s=2.0, compilations=3)
    log.write("val", **_val(20, 0.5))
    log.write("resume", step=20)
    log.write("train", step=30, loss=0.05, grad_norm=1.0, lr=0.01, steps_per_s=2.0)  # a resumed rerun of step 30
    log.write("val", **_val(30, 0.4))
    return tmp_path


def synthetic_log(path, steps: int, log_every: int, val_every: int, sessions: int, resume_at: int | None = None):
    """A metrics.jsonl as a run of `steps` steps would write it (times advancing 0.4 s a step),
    with a resume at `resume_at` (its warm-up 160 s)."""
    rnd, t, lines = random.Random(0), 0.0, []
    names = [f"t15.2023.{8 + i // 28:02d}.{1 + i % 28:02d}" for i in range(sessions)]

    def rec(kind, **fields):
        lines.append(json.dumps({"kind": kind, **fields, "time": 1.7e9 + t, "elapsed_s": round(t, 3)}))

    t += 170
    rec("compile", phase="warm-up", seconds=170.0, compilations=10, fallbacks={})
    for step in range(log_every, steps + 1, log_every):
        if resume_at is not None and step - log_every == resume_at:
            rec("resume", step=resume_at)
            t += 160
            rec("compile", phase="warm-up", seconds=160.0, compilations=10, fallbacks={})
        t += log_every * 0.4
        frac = step / steps
        lr = 0.01 * min(1.0, step / 20) * 0.5 * (1 + math.cos(math.pi * frac))
        rec("train", step=step, loss=100 * math.exp(-4 * frac) + rnd.random(), lr=lr, lr_day=lr / 2,
            grad_norm=5 + 40 * rnd.random() * math.exp(-3 * frac), steps_per_s=2.5 + 0.2 * rnd.random(),
            seconds=log_every * 0.4, compilations=10)
        if step % val_every == 0 or step == steps:
            per = 0.1 + 0.9 * math.exp(-5 * frac)
            t += 5
            rec("val", step=step, loss=90 * math.exp(-3.5 * frac) + 2, per=per, seconds=5.0,
                per_session={"all": {"rate": per}, "groups": {n: {"rate": min(1.0, per * (0.7 + 0.6 * rnd.random()))}
                                                              for n in names}})
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return path


def test_curves_hold_one_point_per_step_every_session_and_the_resume(tmp_path):
    run = curves(list(read_records(_run(tmp_path) / "metrics.jsonl")))
    assert run.series["loss/train"] == [(10, 0.3), (20, 0.15), (30, 0.05)]
    assert run.series["per"] == [(20, 0.5), (30, 0.4)]
    assert [(s, round(p, 6)) for s, p in run.sessions["t15.a"]] == [(20, 0.4), (30, 0.3)]
    assert "t15.b" not in run.sessions, "no rate, no point"
    assert run.resumes == [20]
    steps, times = zip(*run.clock)
    assert steps == (10, 20, 30) and list(times) == sorted(times)


def test_report_writes_a_png(tmp_path):
    run = _run(tmp_path)
    result = CliRunner().invoke(main, [str(run)])
    assert result.exit_code == 0, result.output
    assert (run / "report.png").read_bytes().startswith(PNG_MAGIC)
    result = CliRunner().invoke(main, [str(run), "-o", str(tmp_path / "elsewhere.png")])
    assert result.exit_code == 0 and (tmp_path / "elsewhere.png").read_bytes().startswith(PNG_MAGIC)


def test_a_120k_step_run_with_45_sessions_stays_readable(tmp_path):
    run, _ = load_curves(synthetic_log(tmp_path / "long", 120_000, 500, 2000, 45, resume_at=60_000))
    fig = figure([run])
    fig.canvas.draw()  # tick labels are made when drawn
    axes = fig.axes
    assert axes[LOSS].get_yscale() == "log", "a loss falling 50x stays readable after the first steps"
    assert axes[LOSS].get_xlim()[0] == 0 and axes[LOSS].get_xlim()[1] >= 120_000
    ticks = [t.get_text() for t in axes[LOSS].get_xticklabels()]
    assert "120k" in ticks or "100k" in ticks, ticks
    legend = [t.get_text() for t in axes[PER].get_legend().get_texts()]
    assert legend == ["45 sessions", "all sessions"], "one legend entry for many sessions"
    assert len(axes[SESSIONS].patches) == 45, "a bar per session at the end"
    assert {t.get_text() for t in axes[LR].get_legend().get_texts()} == {"main", "day layers"}
    assert axes[RATE].get_ylim()[0] == 0 and axes[RATE].get_ylim()[1] > 2.7, "steps/s on its own axis, from 0"
    assert axes[NORM].get_yscale() == "linear" and axes[NORM].get_ylim()[1] < 60, "the norm on its own axis"
    resume_lines = [ln for ln in axes[RATE].lines if list(ln.get_xdata()) == [60_000, 60_000]]
    assert resume_lines, "the resume is marked"
    top = [c for c in axes[LOSS].child_axes]
    assert top and "run time (h:mm)" in top[0].get_xlabel()


def test_a_two_step_run_has_markers_and_an_integer_step_axis(tmp_path):
    run, _ = load_curves(synthetic_log(tmp_path / "two", 2, 1, 1, 5))
    axes = figure([run]).axes
    line = axes[LOSS].lines[0]
    assert line.get_marker() == "o" and list(line.get_xdata()) == [1, 2]
    assert axes[LOSS].get_xlim()[0] == 0
    assert all(float(t).is_integer() for t in axes[LOSS].get_xticks() if 0 <= t <= 2)
    assert axes[LR].get_legend() is not None


def test_several_runs_are_overlaid_and_need_an_output(tmp_path):
    a, b = synthetic_log(tmp_path / "a", 200, 20, 100, 3), synthetic_log(tmp_path / "b", 100, 20, 50, 3)
    result = CliRunner().invoke(main, [str(a), str(b)])
    assert result.exit_code == 2 and "need -o" in result.output
    result = CliRunner().invoke(main, [str(a), str(b), "-o", str(tmp_path / "both.png")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "both.png").read_bytes().startswith(PNG_MAGIC)
    runs = [load_curves(a)[0], load_curves(b)[0]]
    legend = [t.get_text() for t in figure(runs).axes[PER].get_legend().get_texts()]
    assert legend == [f"{a}: all sessions", f"{b}: all sessions"]


def test_an_eval_summary_adds_its_per_and_wer_per_session(tmp_path):
    run = synthetic_log(tmp_path / "run", 200, 20, 100, 3)
    (tmp_path / "ev").mkdir()
    groups = {f"t15.2023.08.0{i}": {"rate": 0.1 * i} for i in (1, 2, 3)}
    (tmp_path / "ev" / "summary.json").write_text(json.dumps({
        "checkpoints": [str(run / "best.safetensors")], "split": "val", "per_session": {"groups": groups},
        "wer_session": {"groups": groups}}))
    result = CliRunner().invoke(main, [str(run), "--eval", str(tmp_path / "ev")])
    assert result.exit_code == 0, result.output
    curves_ = load_curves(run)[0]
    load_eval(tmp_path / "ev", [(run, curves_)])
    bars = figure([curves_]).axes[SESSIONS]
    assert [t.get_text() for t in bars.get_legend().get_texts()] == ["val PER, step 200", "b2t-eval val PER",
                                                                      "b2t-eval val WER"]
    assert len(bars.patches) == 9
    summary = (tmp_path / "ev" / "summary.json").read_bytes()
    result = CliRunner().invoke(main, [str(run), "--eval", str(tmp_path / "ev"), "-o", str(tmp_path / "ev" / "summary.json")])
    assert result.exit_code == 2 and "is b2t-eval's summary" in result.output, result.output
    assert (tmp_path / "ev" / "summary.json").read_bytes() == summary, "b2t-eval's output is kept"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "summary.json").write_text(json.dumps({"checkpoints": ["/elsewhere/best.safetensors"]}))
    result = CliRunner().invoke(main, [str(run), "--eval", str(tmp_path / "other")])
    assert result.exit_code == 2 and "a checkpoint of none of the runs given" in result.output
    (tmp_path / "other" / "summary.json").write_text(json.dumps({"checkpoints": [str(run / "best.safetensors"),
                                                                                 "/elsewhere/best.safetensors"]}))
    result = CliRunner().invoke(main, [str(run), "--eval", str(tmp_path / "other")])
    assert result.exit_code == 2 and "an ensemble of checkpoints from 2 run folders" in result.output


def test_report_errors_are_one_line(tmp_path):
    result = CliRunner().invoke(main, [str(tmp_path)])
    assert result.exit_code == 2 and "metrics.jsonl not found" in result.output
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "run").mkdir()
    run = _run(tmp_path / "run")
    result = CliRunner().invoke(main, [str(run), "-o", str(tmp_path / "a_file" / "r.png")])
    assert result.exit_code == 2 and "Traceback" not in result.output and "a_file" in result.output


def test_parseable_records_no_b2t_run_writes_are_skipped_with_the_note(tmp_path):
    """Each was a traceback (exit 70): ZeroDivisionError, AttributeError, OverflowError, matplotlib's
    'Axis limits cannot be NaN or Inf'."""
    run = synthetic_log(tmp_path / "run", 200, 20, 100, 3)
    bad = ['{"kind": "summary", "times": {"median_step_s": 0}}', '{"kind": "summary", "times": [1]}',
           '{"kind": "summary", "times": {"wall": Infinity}}', '{"kind": "val", "step": 50, "per": Infinity}',
           '{"kind": "train", "step": 50, "steps_per_s": Infinity}', '{"kind": "train", "step": 1' + "0" * 400 + "}"]
    with (run / "metrics.jsonl").open("a") as f:
        f.write("\n".join(bad) + "\n")
    result = CliRunner().invoke(main, [str(run), "-o", str(tmp_path / "r.png")])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert "6 lines of" in result.output and "skipped" in result.output, result.output
    assert (tmp_path / "r.png").read_bytes().startswith(PNG_MAGIC)


def test_an_eval_summary_whose_tables_are_not_tables_is_refused(tmp_path):
    run = synthetic_log(tmp_path / "run", 200, 20, 100, 3)
    (tmp_path / "ev").mkdir()
    for table in ([1], {"groups": [1]}, {"groups": {"t15.a": {"rate": "x"}}}):  # AttributeError, exit 70
        (tmp_path / "ev" / "summary.json").write_text(json.dumps({
            "checkpoints": [str(run / "best.safetensors")], "split": "val", "per_session": table}))
        result = CliRunner().invoke(main, [str(run), "--eval", str(tmp_path / "ev")])
        assert result.exit_code == 2, result.output
        assert "not a b2t-eval summary (per_session is not a mapping of sessions to rates)" in result.output
