"""The end of a run in a few lines: where its time went, its best validation, its checkpoints,
and the commands to run next.

The times are the whole run's, every attempt of a resumed run included, taken from its
metrics records (`b2t.train.metrics_log`): `elapsed_s` of the last record is the run's
time; warm-up records, train windows and validations hold their own seconds; the rest
(start-up, data loading, checkpoints) is `other`. A re-run of a finished run prints the
same summary from the record its end wrote.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from b2t.progress import duration
from b2t.run_dir import RunDir


def _numbers(records: Iterable[Mapping[str, Any]], kind: str, key: str, **where: Any) -> list[float]:
    return [float(r[key]) for r in records if r.get("kind") == kind and isinstance(r.get(key), (int, float))
            and not isinstance(r.get(key), bool) and all(r.get(k) == v for k, v in where.items())]


def run_times(records: list[Mapping[str, Any]], elapsed: float) -> dict[str, Any]:
    """The run's seconds per phase (`wall`: `elapsed`, the run's time so far), and the median
    seconds per step over its logged windows (None before the first)."""
    warm = sum(_numbers(records, "compile", "seconds", phase="warm-up"))
    training = sum(_numbers(records, "train", "seconds"))
    validation = sum(_numbers(records, "val", "seconds"))
    per_step = [1 / r for r in _numbers(records, "train", "steps_per_s") if r > 0]
    return {"wall": round(elapsed, 3), "warm_up": round(warm, 3), "training": round(training, 3),
            "validation": round(validation, 3), "other": round(max(elapsed - warm - training - validation, 0.0), 3),
            "median_step_s": statistics.median(per_step) if per_step else None, "windows": len(per_step)}


def format_summary(summary: Mapping[str, Any]) -> str:
    """The lines `b2t-train` ends with (see the module docstring), from `Run.finish`'s summary."""
    run, dataset = RunDir(Path(summary["run_dir"])), Path(summary["dataset"])
    t = summary["times"]
    again = " (already finished: nothing to do)" if summary.get("already_finished") else ""
    lines = [f"done: {summary['steps']} steps{again}; run time {duration(t['wall'])}: warm-up {duration(t['warm_up'])}, "
             f"training {duration(t['training'])}, validation {duration(t['validation'])}, "
             f"other {duration(t['other'])}"]
    if t["median_step_s"] is not None:
        lines.append(f"speed: median {t['median_step_s']:.3f} s/step ({1 / t['median_step_s']:.2f} steps/s) over "
                     f"{t['windows']} logged windows, the warm-up, validations and checkpoints left out")
    best = summary["best_per"]
    if best is not None and math.isfinite(best):
        lines.append(f"best val PER {best:.4f} at step {summary['best_step']}: {run.best}")
    else:
        lines.append(f"no validation (the dataset has no val split): no {run.best.name}")
    lines.append(f"last checkpoint (step {summary['steps']}, resumable): {run.last}")
    final = summary["final"]
    if summary.get("xla"):
        after = final["compilations"] - summary["warm_up"]["compilations"]
        fallbacks = json.dumps(final["fallbacks"]) if final["fallbacks"] else "none"
        lines.append(f"XLA compilations: {final['compilations']} ({summary['buckets']} buckets), "
                     f"{'none' if after == 0 else after} after the warm-up; host fallbacks: {fallbacks}")
    validated = best is not None and math.isfinite(best)
    checkpoint, split = (run.best, "val") if validated else (run.last, "SPLIT")
    lines += ["next:",
              f"  b2t-report {run.path}    # the learning curves: {run.report}",
              f"  b2t-eval {checkpoint} {dataset} --split {split} --out {run.path / f'eval_{split.lower()}'}    "
              f"# {'PER per session' if validated else 'a split this dataset has (no val)'}; "
              "add --lexicon FILE --lm FILE for words and WER"]
    return "\n".join(lines)


def finished_summary(records: list[Mapping[str, Any]], step: int) -> dict[str, Any] | None:
    """The summary record a run's end wrote at `step` (None when its end was never reached)."""
    done = [r for r in records if r.get("kind") == "summary" and r.get("steps") == step]
    return {**done[-1], "already_finished": True} if done else None
