"""A report's data: the learning curves of runs (from their metrics.jsonl) and b2t-eval summaries.

Where a resumed run logged a step twice, the later record counts. Only well-formed records are
plotted (`b2t.run_dir.record_problem`); the lines skipped are counted and named.
`b2t.report_figure` draws them; `b2t-report` (`b2t.cli.report`) is the command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from b2t.errors import InputFileError, MissingInput
from b2t.paths import SUMMARY_NAME
from b2t.report_figure import Points, RunCurves
from b2t.run_dir import RunDir, session_rates_problem, skipped_summary

_TRAIN = {"loss/train": "loss", "lr": "lr", "lr_day": "lr_day", "steps_per_s": "steps_per_s", "grad_norm": "grad_norm"}
_VAL = {"loss/val": "loss", "per": "per"}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def curves(records: list[dict[str, Any]], name: str = "") -> RunCurves:
    """The report's view of a run's records, in the order they were logged."""
    out = RunCurves(name)
    points: dict[str, dict[int, float]] = {}
    sessions: dict[str, dict[int, float]] = {}
    clock: dict[int, float] = {}
    step = 0  # the step the run is at, for records without one (a warm-up's end)
    for r in records:
        kind = r.get("kind")
        if _number(r.get("step")):
            step = int(r["step"])
        if kind == "resume":
            out.resumes.append(step)
        if kind == "summary":
            out.summary = r
        if kind in ("train", "val") or (kind == "compile" and r.get("phase") == "warm-up"):
            if _number(r.get("elapsed_s")):
                clock[step] = float(r["elapsed_s"])  # the last record of a step: after its warm-up, its log
        if kind not in ("train", "val"):
            continue
        for name_, key in (_TRAIN if kind == "train" else _VAL).items():
            if _number(r.get(key)):
                points.setdefault(name_, {})[step] = float(r[key])
        if kind == "val":
            for session, g in ((r.get("per_session") or {}).get("groups") or {}).items():
                if _number(g.get("rate")):
                    sessions.setdefault(session, {})[step] = float(g["rate"])
    out.series = {k: sorted(v.items()) for k, v in points.items()}
    out.sessions = {k: sorted(v.items()) for k, v in sorted(sessions.items())}
    out.clock = _increasing(sorted(clock.items()))
    out.resumes = sorted(set(out.resumes))
    return out


def _increasing(points: Points) -> Points:
    """`points` with each time at least the one before (a resume's kept records end before its restart)."""
    out: Points = []
    for step, t in points:
        out.append((step, max(t, out[-1][1]) if out else t))
    return out


def load_curves(run_dir: Path) -> tuple[RunCurves, str | None]:
    """(`curves` of the well-formed records of RUN/metrics.jsonl, a note on the lines skipped or None)."""
    path = RunDir(run_dir).metrics
    if not path.is_file():
        what = "is not a file" if path.exists() else "not found"
        raise InputFileError(f"{path} {what}: RUN must be a b2t-train run directory")
    records, skipped = RunDir(run_dir).scan()
    note = skipped_summary(path, skipped) if skipped else None
    run = curves(records, str(run_dir))
    if run.empty:
        raise InputFileError(f"{path} holds no well-formed train or val records: nothing to plot"
                             + (f"; {note}" if note else ""))
    return run, note


def load_eval(directory: Path, runs: list[tuple[Path, RunCurves]]) -> None:
    """Attach DIR/summary.json (a `b2t-eval --out DIR`) to the run whose checkpoint it evaluated."""
    path = directory / SUMMARY_NAME
    try:
        summary = json.loads(path.read_text())
    except FileNotFoundError:
        raise MissingInput(f"{path} not found: --eval takes a b2t-eval --out directory") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputFileError(f"{path}: not a b2t-eval summary ({e})") from None
    checkpoints = summary.get("checkpoints") if isinstance(summary, dict) else None
    if not (isinstance(checkpoints, list) and checkpoints and all(isinstance(c, str) for c in checkpoints)):
        raise InputFileError(f"{path}: not a b2t-eval summary (no checkpoints named)")
    for key in ("per_session", "wer_session"):
        if (problem := session_rates_problem(summary.get(key))) is not None:
            raise InputFileError(f"{path}: not a b2t-eval summary ({key} is {problem})")
    folders = {Path(c).resolve().parent for c in checkpoints}
    if len(folders) > 1:
        raise InputFileError(f"{path} evaluated an ensemble of checkpoints from {len(folders)} run folders: "
                             "--eval draws one run's evaluation (evaluate its own checkpoint)")
    for run_dir, run in runs:
        if folders == {run_dir.resolve()}:
            run.evals.append({**summary, "from": str(directory)})
            return
    raise InputFileError(f"{path} evaluated {', '.join(checkpoints)}, a checkpoint of none of the runs given "
                         f"({', '.join(str(r) for r, _ in runs)})")
