"""A run's metrics: `metrics.jsonl` (standard JSON lines) and TensorBoard event files beside it.

Every record is one JSON line, appended and flushed at once, so a killed run keeps what
it logged. The JSON is standard (`allow_nan=False`): a NaN or Inf value is written as
null, so any JSON reader can load the file. The same records go to TensorBoard through
`torch.utils.tensorboard.SummaryWriter` in RUN/tensorboard (rank 0 only):

    train records -> loss/train, train/grad_norm, lr/main, lr/day, train/steps_per_s, xla/compilations
    val records   -> loss/val, per/val, per_session/<session>

A resumed run first drops the records (and hides the TensorBoard events) after its
checkpoint's step, which it is about to log again, so a kill -9 and a rerun leave one
record per step.

Every record carries `time` (wall-clock, Unix seconds) and `elapsed_s`: seconds since the run
started, counting an earlier attempt's time up to the last record a resume kept (the time
between a kill and the resume is not counted), so it is the run's own time axis.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from b2t.atomic import atomic_write_text
from b2t.run_dir import TENSORBOARD, read_records

_TRAIN_SCALARS = {"loss": "loss/train", "grad_norm": "train/grad_norm", "lr": "lr/main", "lr_day": "lr/day",
                  "steps_per_s": "train/steps_per_s", "compilations": "xla/compilations"}
_VAL_SCALARS = {"loss": "loss/val", "per": "per/val"}


def finite_or_null(value: Any) -> Any:
    """`value` with every NaN/Inf float (at any depth) replaced by None: what JSON can hold."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(v) for v in value]
    return value


def scalars(kind: str, record: dict[str, Any]) -> dict[str, float]:
    """The TensorBoard scalars of one record (tag -> value; non-finite and missing ones left out)."""
    out: dict[str, Any] = {}
    if kind == "train":
        out = {tag: record.get(key) for key, tag in _TRAIN_SCALARS.items()}
    elif kind == "val":
        out = {tag: record.get(key) for key, tag in _VAL_SCALARS.items()}
        groups = (record.get("per_session") or {}).get("groups", {})
        out.update({f"per_session/{s}": g.get("rate") for s, g in groups.items()})
    return {tag: float(v) for tag, v in out.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class MetricsLog:
    """Appends records to `path` (JSON lines) and, with `tensorboard`, to event files in
    path.parent/tensorboard. resume_step: the checkpoint step a resumed run continues from
    (records after it are dropped); None starts the file afresh."""

    def __init__(self, path: Path, *, tensorboard: bool, resume_step: int | None = None):
        self.path = path
        self.started, self.offset = time.time(), 0.0
        if resume_step is None:
            path.unlink(missing_ok=True)
        elif path.exists():
            kept = [r for r in read_records(path) if r.get("step", 0) <= resume_step]
            atomic_write_text(path, "".join(self._line(r) for r in kept))
            self.offset = max((r["elapsed_s"] for r in kept if isinstance(r.get("elapsed_s"), (int, float))),
                              default=0.0)
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # events from a run this one replaces (after its checkpoint, or all of a fresh start) are hidden
            self._writer = SummaryWriter(str(path.parent / TENSORBOARD),
                                         purge_step=0 if resume_step is None else resume_step + 1)

    @staticmethod
    def _line(record: dict[str, Any]) -> str:
        return json.dumps(finite_or_null(record), allow_nan=False) + "\n"

    def elapsed(self) -> float:
        """The run's seconds so far (the `elapsed_s` the next record gets)."""
        return self.offset + time.time() - self.started

    def write(self, kind: str, **fields: Any) -> None:
        stamps = {"time": round(time.time(), 3), "elapsed_s": round(self.elapsed(), 3)}
        try:
            with self.path.open("a") as f:
                f.write(self._line({"kind": kind, **fields, **stamps}))
        except OSError as e:  # a write or close (a full disk) names no file by itself
            if e.filename is None:
                raise OSError(e.errno, e.strerror, str(self.path)) from e
            raise
        if self._writer is not None and "step" in fields:
            for tag, value in scalars(kind, fields).items():
                self._writer.add_scalar(tag, value, fields["step"])
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
