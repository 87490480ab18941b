"""`b2t-report RUN [RUN ...]`: a PNG of runs' learning curves, from their metrics.jsonl.

Six panels (drawn by `b2t.report_figure`): CTC loss, train and validation, on a log scale;
validation PER overall and per session (the competition's aggregate, total edits over total
reference length); PER (and with `--eval`, b2t-eval's PER and WER) per session at the end;
the learning rates of the main and the day layers; steps/s; the gradient norm. x is the
step, with the run's own time (`elapsed_s`) as a second axis on top, and every resume is
marked. Several RUNs are overlaid, one colour each. matplotlib's Agg backend draws it, so
no display is needed; the PNG is written atomically (RUN/report.png unless -o says
otherwise).
"""

from __future__ import annotations

from pathlib import Path

import click

from b2t.atomic import atomic_write_bytes
from b2t.cli.rule import Command
from b2t.errors import UsageError
from b2t.paths import Place, refuse_clashes
from b2t.report import load_curves, load_eval
from b2t.report_figure import render
from b2t.run_dir import REPORT, RunDir


@click.command(cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run_dirs", metavar="RUN...", nargs=-1, required=True,
                type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, readable=False, path_type=Path), default=None,
              help=f"PNG to write [default: RUN/{REPORT} for one RUN; required for several].")
@click.option("--eval", "evals", multiple=True, metavar="DIR", type=click.Path(file_okay=False, path_type=Path),
              help="A b2t-eval --out directory of one RUN's checkpoint: its PER and WER per session are drawn "
                   "beside the validation PER (repeatable, e.g. once per split).")
def main(run_dirs: tuple[Path, ...], output: Path | None, evals: tuple[Path, ...]) -> None:
    """Plot the learning curves of RUN (losses, validation PER overall and per session,
    learning rates, steps/s, gradient norm) from RUN/metrics.jsonl into a PNG; several RUNs
    are overlaid for comparison."""
    if output is None:
        if len(run_dirs) > 1:
            raise UsageError(f"{len(run_dirs)} runs overlaid need -o FILE.png (which run's folder would it go in?)")
        output = RunDir(run_dirs[0]).report
    refuse_clashes([Place("-o", output)], [Place("RUN", RunDir(d).metrics) for d in run_dirs])
    runs = []
    for run_dir in run_dirs:
        run, note = load_curves(run_dir)
        if note:
            click.secho(f"warning: {note}: the report plots the other records", fg="yellow", err=True)
        runs.append((run_dir, run))
    for directory in evals:
        load_eval(directory, runs)
    atomic_write_bytes(output, render([run for _, run in runs]))
    click.echo(f"wrote {output}")
