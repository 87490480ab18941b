"""Where a run's wall time goes, so steps/s means stepping.

A run spends its time setting up, warming up (compiling), stepping, validating and writing
checkpoints. The rate a person plans with, and the one `metrics.jsonl` and `report.png`
show, is steps over stepping time only: the warm-up, validations and checkpoints are timed
as phases of their own (`StepClock.apart`), so the first logged rate is already the steady
one, not the steps diluted by minutes of compiling.

XLA runs steps asynchronously; a window's time is closed at the loss read-back of
`Run.log_losses`, the loop's one host sync, so it holds the window's device work.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

TRAINING = "training"
"""The phase whose time is stepping time."""


class StepClock:
    """Seconds per phase (setup, warm-up, training, validation, checkpoint) and the stepping
    time of each logging window. One phase runs at a time: `start` switches to another, `apart`
    interrupts the current one for a block; only the `training` phase's time counts as
    stepping time."""

    def __init__(self, phase: str = "setup") -> None:
        self.phases: dict[str, float] = defaultdict(float)
        self.phase, self._mark = phase, time.perf_counter()
        self._window_s, self._window_steps = 0.0, 0

    def start(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases[self.phase] += now - self._mark
        if self.phase == TRAINING:
            self._window_s += now - self._mark
        self.phase, self._mark = phase, now

    @contextmanager
    def apart(self, phase: str) -> Iterator[None]:
        """Time spent inside is `phase`'s; the phase before goes on afterwards."""
        before = self.phase
        self.start(phase)
        try:
            yield
        finally:
            self.start(before)

    def stepped(self, n: int = 1) -> None:
        self._window_steps += n

    def window(self) -> tuple[int, float]:
        """(steps, stepping seconds) since the last window; starts the next one."""
        self.start(self.phase)
        out = (self._window_steps, self._window_s)
        self._window_s, self._window_steps = 0.0, 0
        return out

    def seconds(self) -> dict[str, float]:
        """Seconds per phase so far, the current one included."""
        self.start(self.phase)
        return {k: round(v, 3) for k, v in self.phases.items()}

