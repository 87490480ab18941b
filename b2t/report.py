"""`b2t-report RUN`: a PNG of a run's learning curves and per-session PER, from metrics.jsonl.

Four panels: train and validation CTC loss, validation PER overall and per session (the
competition's aggregate, total edits over total reference length), the learning rates,
and steps/s with the gradient norm. matplotlib's Agg backend draws it, so no display is
needed; the PNG is written atomically (RUN/report.png unless -o says otherwise). Where a
resumed run logged a step twice, the later record counts. Only well-formed records are
plotted (`b2t.train.metrics_log.record_problem`); the lines skipped are counted and named.
"""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path
from typing import Any

import click

from b2t.atomic import atomic_write_bytes
from b2t.cli_errors import Command, UserError
from b2t.paths import Place, refuse_clashes
from b2t.train.metrics_log import scan_records, skipped_summary

METRICS, REPORT = "metrics.jsonl", "report.png"


def curves(records: list[dict[str, Any]]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """panel -> series name -> (step, value) points, sorted by step, one per step (the last logged)."""
    by_step: dict[tuple[str, int], dict[str, Any]] = {}
    for r in records:
        if r.get("kind") in ("train", "val") and isinstance(r.get("step"), int):
            by_step[(r["kind"], r["step"])] = r
    out: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))

    def put(panel: str, name: str, step: int, value: Any) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[panel][name][step] = float(value)

    for (kind, step), r in by_step.items():
        if kind == "train":
            put("CTC loss", "train", step, r.get("loss"))
            put("learning rate", "main", step, r.get("lr"))
            put("learning rate", "day layers", step, r.get("lr_day"))
            put("steps/s and grad norm", "steps/s", step, r.get("steps_per_s"))
            put("steps/s and grad norm", "grad norm", step, r.get("grad_norm"))
        else:
            put("CTC loss", "val", step, r.get("loss"))
            put("validation PER", "all sessions", step, r.get("per"))
            for session, g in ((r.get("per_session") or {}).get("groups") or {}).items():
                put("validation PER", session, step, g.get("rate"))
    return {panel: {name: sorted(points.items()) for name, points in series.items()}
            for panel, series in out.items()}


def load_curves(run_dir: Path) -> tuple[dict[str, dict[str, list[tuple[int, float]]]], str | None]:
    """(`curves` of the well-formed records of RUN/metrics.jsonl, a note on the lines skipped or None)."""
    path = run_dir / METRICS
    if not path.is_file():
        what = "is not a file" if path.exists() else "not found"
        raise UserError(f"{path} {what}: RUN must be a b2t-train run directory")
    records, skipped = scan_records(path)
    note = skipped_summary(path, skipped) if skipped else None
    panels = curves(records)
    if not panels:
        raise UserError(f"{path} holds no well-formed train or val records: nothing to plot"
                        + (f"; {note}" if note else ""))
    return panels, note


def render(run_dir: Path, panels: dict[str, dict[str, list[tuple[int, float]]]]) -> bytes:
    """The report PNG of `run_dir`'s curves (from `load_curves`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["CTC loss", "validation PER", "learning rate", "steps/s and grad norm"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), constrained_layout=True)
    for ax, panel in zip(axes.flat, names):
        series = panels.get(panel, {})
        for name, points in series.items():
            steps, values = zip(*points)
            overall = name in ("all sessions", "train", "main", "steps/s")
            ax.plot(steps, values, marker="o" if len(points) < 30 else None, markersize=3,
                    linewidth=2.0 if overall else 0.8, alpha=1.0 if overall else 0.7, label=name)
        ax.set_title(panel if series else f"{panel} (not logged)")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=7, ncol=2 if len(series) > 8 else 1)
    fig.suptitle(str(run_dir))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


@click.command(cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run_dir", metavar="RUN", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help=f"PNG to write [default: RUN/{REPORT}].")
def main(run_dir: Path, output: Path | None) -> None:
    """Plot RUN's learning curves (losses, validation PER overall and per session, learning
    rates, steps/s and gradient norm) from RUN/metrics.jsonl into a PNG."""
    output = output or run_dir / REPORT
    refuse_clashes([Place("-o", output)], [Place("RUN", run_dir / METRICS)])
    panels, note = load_curves(run_dir)
    if note:
        click.secho(f"warning: {note}: the report plots the other records", fg="yellow", err=True)
    atomic_write_bytes(output, render(run_dir, panels))
    click.echo(f"wrote {output}")
