"""Where a command may write and what it may read: one rule for every b2t command line.

An output is refused, before anything is read or written, when it would destroy or mix
with an input:
- it is an input file (the same path once links are resolved, or a hard link to it):
  `b2t-eval CKPT ... --csv CKPT` made the model a CSV, `b2t-lm build c.txt -o c.txt` the
  corpus an LM;
- it lies inside an input tree (SRC, DATASET): `b2t-preprocess SRC SRC/shards` read its
  own output folder as a session folder;
- it would replace a file of another kind that holds work (a checkpoint, an HDF5 session
  file, a shard, a manifest, a metrics log, b2t-eval's outputs): `b2t-report RUN -o
  RUN/best.safetensors`, or `-o EVAL/summary.json`; and a run's own checkpoints only b2t-train
  replaces (`b2t-import-baseline -o RUN/last.safetensors` replaced the run's resumable state).
An output replaces a file of its own kind as asked (a new LM over an old one).

Inputs named on a command line are regular files (or folders where a folder is asked
for): a FIFO blocked the reader forever, a device read as endless data (`RegularFile`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from b2t.errors import UsageError

WORK_SUFFIXES = {".safetensors": "a checkpoint", ".hdf5": "an HDF5 data file", ".h5": "an HDF5 data file",
                 ".tar": "a shard", ".arpa": "an n-gram LM"}
MANIFEST_NAME, METRICS_NAME = "manifest.json", "metrics.jsonl"
"""A dataset's manifest (`b2t.data.manifest`) and a run's metrics log (`b2t.run_dir`)."""
LAST_NAME, BEST_NAME = "last.safetensors", "best.safetensors"
"""A run's resumable and best checkpoints (`b2t.run_dir`): only b2t-train writes them."""
TRIALS_NAME, DECODED_NAME, SUMMARY_NAME, WEIGHTS_NAME = "trials.jsonl", "decoded.txt", "summary.json", "weights.json"
"""What `b2t-eval --out DIR` writes (`b2t.eval_output`; `--tune` the weights), and `b2t-report --eval DIR` reads."""
WORK_NAMES = {MANIFEST_NAME: "a dataset manifest", METRICS_NAME: "a run's metrics log",
              LAST_NAME: "a run's resumable checkpoint", BEST_NAME: "a run's best checkpoint",
              TRIALS_NAME: "b2t-eval's trials", DECODED_NAME: "b2t-eval's decoded trials",
              SUMMARY_NAME: "b2t-eval's summary", WEIGHTS_NAME: "b2t-eval --tune's weights"}
"""Files that hold work (by suffix, by name), which only an output of the same kind may replace."""


@dataclass(frozen=True)
class Place:
    """A path a command reads or writes, named as the user gave it (`role`: "--csv", "DATASET").

    kind: for an output, the work it writes in `WORK_SUFFIXES`/`WORK_NAMES` words ("a
    checkpoint"), None for anything else (a CSV, a PNG, an LM)."""

    role: str
    path: Path
    tree: bool = False  # a folder read or written as a whole (SRC, DATASET, OUT, RUN_DIR)
    kind: str | None = None

    @property
    def resolved(self) -> Path:
        return Path(os.path.realpath(self.path))

    def describe(self) -> str:
        return f"{self.role} {self.path}"


def work_kind(path: Path) -> str | None:
    """The work a file holds, judged by its name ("a checkpoint"), or None."""
    return WORK_NAMES.get(path.name) or WORK_SUFFIXES.get(path.suffix.lower())


def _same_file(a: Path, b: Path) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)  # a hard link
    except OSError:  # one of them does not exist yet
        return False


def clash(output: Place, source: Place) -> str | None:
    """Why `output` may not be written while `source` is read (None when it may)."""
    if source.tree:
        if output.resolved.is_relative_to(source.resolved):
            where = "is" if output.resolved == source.resolved else "is inside"
            return (f"{output.describe()} {where} {source.describe()}: the output would mix with what it reads; "
                    f"choose {output.role} outside {source.path}")
        return None
    if not output.tree and _same_file(output.path, source.path):
        return (f"{output.describe()} is {source.describe()}: writing it would destroy that input; "
                f"choose another {output.role}")
    return None


def replaced_work(output: Place) -> str | None:
    """Why `output` may not replace the file already there (None when it may): that file
    holds work of another kind than the output writes."""
    if output.tree or not output.path.is_file():
        return None
    theirs = work_kind(output.path)
    if theirs is None or theirs == output.kind:
        return None
    return (f"{output.describe()} exists and is {theirs}, which this command does not write: "
            f"choose another {output.role}")


def refuse_clashes(outputs: Iterable[Place], inputs: Iterable[Place]) -> None:
    """UsageError naming the first output that is, or lies inside, an input, that would
    replace a file holding another kind of work, or that is another output's file."""
    inputs, outputs = list(inputs), list(outputs)
    files = [o for o in outputs if not o.tree]
    for i, a in enumerate(files):
        for b in files[i + 1:]:
            if a.resolved == b.resolved:
                raise UsageError(f"{a.describe()} is {b.describe()}: one would write over the other; "
                                 f"choose another {a.role}")
    for output in outputs:
        for why in (*(clash(output, source) for source in inputs), replaced_work(output)):
            if why is not None:
                raise UsageError(why)


def file_kind(path: str | os.PathLike) -> str:
    """What is at `path`, in words: 'a regular file', 'a folder', 'a FIFO', ..."""
    mode = os.stat(path).st_mode
    for test, what in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


def not_regular(path: str | os.PathLike) -> str | None:
    """Why `path` (links followed) is not a regular file to read, or None when it is; reading a
    FIFO blocks until some other process writes it, a device never ends."""
    try:
        kind = file_kind(path)
    except OSError:
        return None  # missing: the caller's own check says so
    return None if kind == "a regular file" else f"{path} is {kind}, not a regular file"


class RegularFile(click.Path):
    """click's existing-path type that also refuses anything but a regular file (or, with
    `dir_okay`, a folder): a FIFO named like an input would block the command forever."""

    def __init__(self, dir_okay: bool = False) -> None:
        super().__init__(exists=True, dir_okay=dir_okay, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = super().convert(value, param, ctx)
        if not (self.dir_okay and os.path.isdir(path)) and (why := not_regular(path)) is not None:
            self.fail(why, param, ctx)
        return path
