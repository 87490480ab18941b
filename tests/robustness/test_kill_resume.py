"""A run stopped at random moments (kill -9, or SIGTERM as a preemption) and resumed with the same
command ends with the unbroken run's weights, every time (`tests.robustness.kill_resume`; SIGTERM
stops are checked to keep the step in flight). Slow: minutes per round on the CPU, xla's longest."""

from __future__ import annotations

import pytest

from tests.robustness.kill_resume import stop_and_resume

TRIES = 10


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "how"), [("eager", "kill"), ("eager", "term"), ("xla", "term")])
def test_stopped_runs_resume_to_the_unbroken_runs_weights(backend, how):
    assert stop_and_resume(TRIES, seed=0, backend=backend, how=how) == TRIES
