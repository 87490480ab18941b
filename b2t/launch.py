"""Where every console script starts: the stop policy first, then the command's imports.

Importing torch, torch_xla and the rest takes seconds, most of a short command's start-up, and
Python's own SIGTERM handler ended a command stopped there with no line (exit -15). Each script
of pyproject.toml enters through one of these functions, which installs `b2t.signals`' policy
(a stop at once, one line, exit 128 + the signal) before importing the command's module (the
command's own `installed` block keeps it), and once the command has returned, holds the signals
until the process has exited (`signals.hold`).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

from b2t import signals

SCRIPTS = {
    "b2t-synth": "preprocess.synth:main",
    "b2t-preprocess": "preprocess.cli:main",
    "b2t-train": "b2t.cli.train:train_main",
    "b2t-plan": "b2t.cli.plan:plan_main",
    "b2t-lm": "b2t.cli.lm:main",
    "b2t-eval": "b2t.cli.eval:eval_main",
    "b2t-import-baseline": "b2t.cli.import_baseline:import_main",
    "b2t-report": "b2t.cli.report:main",
    "b2t-separation": "b2t.cli.separation:separation_main",
}
"""Each console script's click command, as `module:attribute`."""


def command(name: str) -> Callable[[], object]:
    """The click command of the console script `name` (its module imported now)."""
    module, attribute = SCRIPTS[name].split(":")
    return getattr(importlib.import_module(module), attribute)


def _launch(name: str) -> None:
    signals.install(name)
    try:
        command(name)()
    except OSError as e:  # outside the command's rule: click writing --help or a usage error to a full stdout
        _unwritable_output(name, e)
    finally:
        signals.hold()  # the command is done: nothing is left to stop while the process exits


def _unwritable_output(name: str, e: OSError) -> None:
    """One line and exit 2 for `b2t-x --help > /dev/full` (a traceback, then another at exit)."""
    sys.stderr.write(f"error: {name}: cannot write its output: {e.strerror or e} (free space on that disk, or "
                     "send the output elsewhere)\n")
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush writes to nowhere
    sys.exit(2)


def synth() -> None:
    _launch("b2t-synth")


def preprocess() -> None:
    _launch("b2t-preprocess")


def train() -> None:
    _launch("b2t-train")


def plan() -> None:
    _launch("b2t-plan")


def lm() -> None:
    _launch("b2t-lm")


def evaluate() -> None:
    _launch("b2t-eval")


def import_baseline() -> None:
    _launch("b2t-import-baseline")


def report() -> None:
    _launch("b2t-report")


def separation() -> None:
    _launch("b2t-separation")
