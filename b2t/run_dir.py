"""A b2t-train run directory: the one definition of the files in it, and how its records are read.

RUN holds `last.safetensors` (resumable: weights, optimizer, schedule, data position),
`best.safetensors` (the lowest validation PER), `metrics.jsonl` (one JSON record per line,
`b2t.train.metrics_log` writes it; torchrun's other ranks write `metrics.rank<r>.jsonl`),
`tensorboard/`, and `report.png` once `b2t-report` drew it. The loop, the report, the
evaluation's next commands and the tools all name these files through `RunDir`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from b2t.atomic import is_temp_name
from b2t.errors import B2tError
from b2t.paths import BEST_NAME, LAST_NAME, METRICS_NAME
from b2t.run_lock import RUN_LOCK

LAST, BEST, METRICS, REPORT, TENSORBOARD = LAST_NAME, BEST_NAME, METRICS_NAME, "report.png", "tensorboard"
_RANK_FILE = re.compile(r"metrics\.rank\d+\.jsonl|" + re.escape(RUN_LOCK.removesuffix(".lock")) + r"\.rank\d+\.lock")


@dataclass(frozen=True)
class RunDir:
    """The files of the run directory at `path`."""

    path: Path

    @property
    def last(self) -> Path:
        return self.path / LAST

    @property
    def best(self) -> Path:
        return self.path / BEST

    @property
    def metrics(self) -> Path:
        return self.path / METRICS

    @property
    def report(self) -> Path:
        return self.path / REPORT

    @property
    def tensorboard(self) -> Path:
        return self.path / TENSORBOARD

    def metrics_of(self, rank: int) -> Path:
        """The metrics log of one torchrun process (rank 0 writes the main one)."""
        return self.metrics if rank == 0 else self.path / f"metrics.rank{rank}.jsonl"

    def foreign(self) -> list[str]:
        """The sorted names in the directory that no b2t-train (nor b2t-report) writes: a new run
        starts only where this is empty, so a mistyped RUN_DIR (the HDF5 folder, `.`) is refused
        before the run's metrics.jsonl or checkpoints replace a file of the same name there."""
        ours = {LAST, BEST, METRICS, REPORT, TENSORBOARD, RUN_LOCK}
        return sorted(p.name for p in self.path.iterdir()
                      if p.name not in ours and not _RANK_FILE.fullmatch(p.name) and not is_temp_name(p.name))

    def records(self, rank: int = 0) -> list[dict[str, Any]]:
        """The run's records (`read_records`: a last line cut short is dropped, any other bad line refused)."""
        return read_records(self.metrics_of(rank))

    def scan(self) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
        """(well-formed records, (line, why) of every other line) of the main metrics log (`scan_records`)."""
        return scan_records(self.metrics)


class MetricsError(B2tError, ValueError):
    """A metrics.jsonl line that is not a well-formed record; the message names the file and line."""


_NUMBERS = {"train": ("loss", "grad_norm", "lr", "lr_day", "steps_per_s"), "val": ("loss", "per")}
"""The fields each kind's readers plot: a number, or null for a non-finite value."""


def _is_number(value: Any) -> bool:
    """null, or a finite number a plot can hold (metrics_log writes null for NaN/inf; 10**400 overflowed)."""
    if isinstance(value, bool):
        return False
    return value is None or (isinstance(value, int) and abs(value) < 2**63) or (
        isinstance(value, float) and math.isfinite(value))


def session_rates_problem(value: Any) -> str | None:
    """Why a `per_session` (or `wer_session`) table, `{"groups": {session: {"rate": x}}}` or null,
    is not one (None when it is): the shape the loop and b2t-eval write and the report reads."""
    groups = (value.get("groups") or {}) if isinstance(value, dict) else value or {}
    if not isinstance(groups, dict) or not all(isinstance(g, dict) and _is_number(g.get("rate"))
                                               for g in groups.values()):
        return "not a mapping of sessions to rates"
    return None


def record_problem(record: Any) -> str | None:
    """Why a parsed line is not a well-formed record (None when it is): a JSON object with a
    string `kind`; train and val records also an integer step and numbers (or null) where
    their readers expect them."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    kind = record.get("kind")
    if not isinstance(kind, str):
        return f"kind is {kind!r}, not a string"
    if kind == "summary":
        times = record.get("times") or {}
        if not isinstance(times, dict) or not all(map(_is_number, times.values())) or (
                times.get("median_step_s") is not None and not times["median_step_s"] > 0):
            return "a summary whose times are not a mapping of finite numbers (median_step_s > 0)"
    if kind not in _NUMBERS:
        return None
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 2**63:
        return f"a {kind} record whose step is {step!r}, not an integer >= 0"
    for key in _NUMBERS[kind]:
        if not _is_number(record.get(key)):
            return f"{key} is {record[key]!r}, not a number"
    problem = session_rates_problem(record.get("per_session"))
    return f"per_session is {problem}" if problem else None


def scan_records(path: Path) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    """(well-formed records, (line number, why) for every other line) of a metrics.jsonl. A last
    line cut short by a kill (an unterminated JSON prefix) is listed as such."""
    lines = path.read_bytes().split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    records, skipped = [], []
    for n, raw in enumerate([*lines, tail] if tail else lines, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            skipped.append((n, f"not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1})"))
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            cut = raw is tail and text.isascii() and text.startswith("{")
            skipped.append((n, "cut short (a run killed mid-write)" if cut else f"not JSON ({e.msg})"))
            continue
        problem = record_problem(record)
        if problem is None:
            records.append(record)
        else:
            skipped.append((n, problem))
    return records, skipped


def skipped_summary(path: Path, skipped: list[tuple[int, str]]) -> str:
    """`N lines of PATH skipped (line 3: why; ...)`, the first three named."""
    shown = "; ".join(f"line {n}: {why}" for n, why in skipped[:3]) + ("; ..." if len(skipped) > 3 else "")
    return f"{len(skipped)} line{'s' if len(skipped) != 1 else ''} of {path} skipped ({shown})"


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a run's own metrics.jsonl ([] when there is none). A last line cut short
    by a kill is dropped; any other malformed line raises MetricsError naming it, since a
    resumed run rewrites the file from these records."""
    if not path.exists():
        return []
    records, skipped = scan_records(path)
    bad = [(n, why) for n, why in skipped if not why.startswith("cut short")]
    if bad:
        raise MetricsError(f"{skipped_summary(path, bad)}: it is not a b2t metrics log as written; move it aside "
                           "(a resumed run starts a new one) or delete those lines, then run again")
    return records
