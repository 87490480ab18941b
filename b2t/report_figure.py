"""The report's figure (`b2t-report`): six panels of one or more runs' curves, readable from a
2-step run (markers, integer steps from 0) to a 120k-step one (lines, `120k` ticks, 45
sessions as thin lines and sorted bars), drawn with matplotlib's Agg backend.

    loss (log y; train, val)           | validation PER (overall; each session thin)
    per session at the end (bars)      | learning rates (main solid, day layers dashed)
    steps/s                            | gradient norm (log y when it spans decades)

Every step panel has the run's own time on a second x axis on top (the first run's, from
`elapsed_s`) and a dotted line at each resume.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from b2t.progress import duration

Points = list[tuple[int, float]]


@dataclass
class RunCurves:
    """What the report draws of one run (from `b2t.report.curves`): each series as (step, value) points
    sorted by step, one per step (the last logged)."""

    name: str
    series: dict[str, Points] = field(default_factory=dict)  # loss/train, loss/val, per, lr, lr_day, steps_per_s, grad_norm
    sessions: dict[str, Points] = field(default_factory=dict)  # validation PER per session
    resumes: list[int] = field(default_factory=list)  # steps a resume continued from
    clock: Points = field(default_factory=list)  # (step, elapsed_s): the run's time at each step
    summary: dict[str, Any] | None = None  # the end's summary record, if it ended
    evals: list[dict[str, Any]] = field(default_factory=list)  # b2t-eval summaries of its checkpoints (--eval)

    @property
    def empty(self) -> bool:
        return not any(self.series.values())


MARKERS_BELOW = 40
"""Series with fewer points than this get markers: a 2-step run shows its two points."""
SESSION_LEGEND_MAX = 8
"""More sessions than this get one legend entry, not one each."""


def _steps_formatter(value: float, _pos: int) -> str:
    v = abs(value)
    if v >= 1e6:
        return f"{value / 1e6:g}M"
    if v >= 1e3:
        return f"{value / 1e3:g}k"
    return f"{value:g}"


def _plot(ax: Any, points: Points, **style: Any) -> None:
    if not points:
        return
    steps, values = zip(*points)
    if len(points) < MARKERS_BELOW:
        style.setdefault("marker", "o")
        style.setdefault("markersize", 4)
    ax.plot(steps, values, **style)


def _time_axis(ax: Any, clock: Points, locator: Any) -> None:
    """The run's time at the step ticks, on top: `m:ss`, or `h:mm` past an hour (the time
    through `clock`; a resume's warm-up is a jump at its step, so times are labels at the
    step ticks rather than an axis of their own)."""
    from matplotlib.ticker import FuncFormatter

    if len(clock) < 2 or clock[-1][1] <= clock[0][1]:
        return
    steps = np.array([s for s, _ in clock], dtype=float)
    seconds = np.array([t for _, t in clock], dtype=float)
    hours = seconds[-1] >= 3600

    def label(x: float, _pos: int) -> str:
        if x < steps[0] - 0.5 or x > steps[-1] + 0.5:
            return ""
        t = int(round(float(np.interp(x, steps, seconds))))
        return f"{t // 3600}:{t % 3600 // 60:02d}" if hours else f"{t // 60}:{t % 60:02d}"

    top = ax.secondary_xaxis("top")
    top.xaxis.set_major_locator(locator)
    top.xaxis.set_major_formatter(FuncFormatter(label))
    top.set_xlabel(f"run time ({'h:mm' if hours else 'm:ss'})", fontsize=8)
    top.tick_params(labelsize=7)


def _steps_axes(ax: Any, runs: list[RunCurves], last_step: int) -> None:
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    ax.set_xlim(0, max(last_step, 1) * 1.02)
    locator = MaxNLocator(nbins=8, integer=True)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(FuncFormatter(_steps_formatter))
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    for k, run in enumerate(runs):
        for step in run.resumes:
            ax.axvline(step, color=f"C{k}", linestyle=":", linewidth=1.2, alpha=0.8)
    _time_axis(ax, runs[0].clock, locator)


def _log_scale(ax: Any) -> None:
    """A log y axis labelled in plain numbers (`6`, `20`, `100`), minor ticks too on a short range."""
    from matplotlib.ticker import LogFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))
    ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1.5, 0.6)))


def _log_if_wide(ax: Any, values: list[float]) -> None:
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 20:
        _log_scale(ax)


def _label(run: RunCurves, what: str, several: bool) -> str:
    return f"{run.name}: {what}" if several else what


def _loss(ax: Any, runs: list[RunCurves], several: bool) -> None:
    for k, run in enumerate(runs):
        _plot(ax, run.series.get("loss/train", []), color=f"C{k}", linewidth=1.2, label=_label(run, "train", several))
        _plot(ax, run.series.get("loss/val", []), color=f"C{k}", linewidth=2.0, linestyle="--",
              marker="s", markersize=4, label=_label(run, "validation", several))
    values = [v for run in runs for key in ("loss/train", "loss/val") for _, v in run.series.get(key, [])]
    if values and min(values) > 0:
        _log_scale(ax)
    ax.set_title("CTC loss (log scale)", fontsize=10)


def _per(ax: Any, runs: list[RunCurves], several: bool) -> None:
    for k, run in enumerate(runs):
        if not several:
            many = len(run.sessions) > SESSION_LEGEND_MAX
            for i, (session, points) in enumerate(run.sessions.items()):
                label = (f"{len(run.sessions)} sessions" if i == 0 else None) if many else _short(session)
                _plot(ax, points, linewidth=0.8, alpha=0.45, color="0.45" if many else f"C{i + 1}",
                      markersize=2, label=label)
        _plot(ax, run.series.get("per", []), color=f"C{k}", linewidth=2.4, label=_label(run, "all sessions", several))
    ax.set_ylim(0, max(1.0, max((v for run in runs for _, v in run.series.get("per", [])), default=1.0)) * 1.02)
    ax.set_title("validation PER (greedy)", fontsize=10)


def _short(session: str) -> str:
    return session.removeprefix("t15.")


def _sessions_at_end(ax: Any, runs: list[RunCurves]) -> None:
    """Bars per session: the last validation PER of each run, and each --eval summary's PER and WER."""
    bars: list[tuple[str, dict[str, float]]] = []
    for k, run in enumerate(runs):
        last = {s: points[-1][1] for s, points in run.sessions.items() if points}
        if last:
            step = max(points[-1][0] for points in run.sessions.values() if points)
            bars.append((_label(run, f"val PER, step {step}", len(runs) > 1), last))
        for ev in run.evals:
            split = ev.get("split", "?")
            for key, name in (("per_session", "PER"), ("wer_session", "WER")):
                rates = {s: g["rate"] for s, g in ((ev.get(key) or {}).get("groups") or {}).items()
                         if isinstance(g, dict) and isinstance(g.get("rate"), (int, float))}
                if rates:
                    bars.append((_label(run, f"b2t-eval {split} {name}", len(runs) > 1), rates))
    sessions = sorted({s for _, rates in bars for s in rates})
    if not sessions:
        ax.text(0.5, 0.5, "no per-session validation logged", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    width = 0.8 / len(bars)
    x = np.arange(len(sessions))
    for j, (name, rates) in enumerate(bars):
        ax.bar(x + (j - (len(bars) - 1) / 2) * width, [rates.get(s, np.nan) for s in sessions], width,
               label=name, color=f"C{j}")
    ax.set_xticks(x)
    ax.set_xticklabels([_short(s) for s in sessions], rotation=90 if len(sessions) > 6 else 0,
                       fontsize=7 if len(sessions) <= 20 else 5)
    ax.set_xlim(-0.6, len(sessions) - 0.4)
    ax.set_ylim(0, 1.0)
    ax.grid(alpha=0.3, axis="y")
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title("per session at the end (error rate)", fontsize=10)


def _learning_rates(ax: Any, runs: list[RunCurves], several: bool) -> None:
    from matplotlib.ticker import FormatStrFormatter

    for k, run in enumerate(runs):
        main, day = run.series.get("lr", []), run.series.get("lr_day", [])
        same = bool(day) and [v for _, v in main] == [v for _, v in day]
        _plot(ax, main, color=f"C{k}", linewidth=1.6, label=_label(run, "main", several))
        # dashed and drawn on top in another colour, so a day rate equal to the main one still shows
        _plot(ax, day, color=f"C{k + 3}" if not several else f"C{k}", linewidth=1.6, linestyle=(0, (4, 3)),
              marker="x" if len(day) < MARKERS_BELOW else None,
              label=_label(run, "day layers" + (" (= main)" if same else ""), several))
    ax.set_title("learning rate", fontsize=10)
    ax.yaxis.set_major_formatter(FormatStrFormatter("%.2g"))


def _series_panel(key: str, title: str) -> Callable[[Any, list[RunCurves], bool], None]:
    def draw(ax: Any, runs: list[RunCurves], several: bool) -> None:
        for k, run in enumerate(runs):
            _plot(ax, run.series.get(key, []), color=f"C{k}", linewidth=1.4, label=run.name if several else None)
        values = [v for run in runs for _, v in run.series.get(key, [])]
        if key == "grad_norm":
            _log_if_wide(ax, values)
        elif values:
            ax.set_ylim(0, max(values) * 1.15)
        ax.set_title(title, fontsize=10)
    return draw


def _headline(runs: list[RunCurves]) -> str:
    lines = []
    for run in runs:
        s = run.summary
        if s is None:
            lines.append(f"{run.name}: not finished (last step {max((p[-1][0] for p in run.series.values() if p), default=0)})")
            continue
        best = s.get("best_per")
        times = s.get("times") or {}
        parts = [f"{run.name}: {s.get('steps')} steps"]
        if isinstance(best, (int, float)):
            parts.append(f"best val PER {best:.4f} at step {s.get('best_step')}")
        if isinstance(times.get("median_step_s"), (int, float)):
            parts.append(f"median {1 / times['median_step_s']:.2f} steps/s")
        if isinstance(times.get("wall"), (int, float)) and isinstance(times.get("warm_up"), (int, float)):
            parts.append(f"run time {duration(times['wall'])} (warm-up {duration(times['warm_up'])})")
        if run.resumes:
            parts.append(f"resumed at step {', '.join(map(str, run.resumes))}")
        lines.append(", ".join(parts))
    return "\n".join(lines)


def render(runs: list[RunCurves]) -> bytes:
    """The report PNG of `runs` (from `b2t.report.load_curves`), overlaid when there are several."""
    import matplotlib.pyplot as plt

    fig = figure(runs)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def figure(runs: list[RunCurves]) -> Any:
    """The report's matplotlib Figure (Agg); `fig.axes[:6]` in reading order: loss, validation PER,
    per session, learning rate, steps/s, gradient norm (the run-time axes on top follow)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    several = len(runs) > 1
    last_step = max((p[-1][0] for run in runs for p in [*run.series.values(), *run.sessions.values()] if p), default=1)
    fig, axes = plt.subplots(3, 2, figsize=(14, 13), constrained_layout=True)
    step_panels = [(axes[0, 0], _loss), (axes[0, 1], _per), (axes[1, 1], _learning_rates),
                   (axes[2, 0], _series_panel("steps_per_s", "steps/s (stepping time only)")),
                   (axes[2, 1], _series_panel("grad_norm", "gradient norm (before clipping)"))]
    for ax, draw in step_panels:
        draw(ax, runs, several)
        drawn = bool(ax.lines)
        _steps_axes(ax, runs, last_step)
        if not drawn:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="0.5")
        elif ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    _sessions_at_end(axes[1, 0], runs)
    if axes[1, 0].get_legend_handles_labels()[0]:
        axes[1, 0].legend(fontsize=7, loc="upper right")
    if any(run.resumes for run in runs):
        axes[0, 0].plot([], [], color="0.3", linestyle=":", label="resumed here")
        axes[0, 0].legend(fontsize=7, loc="best")
    fig.suptitle(_headline(runs), fontsize=10)
    return fig
