"""Every probe (`tests.robustness.probe`: each kind of bad input or fault, against the commands as
subprocesses) ends as the design says: a clear error that names what it must, or, where accepting
is the design, a checked result; none with a traceback, an internal error, silence, lost work, a
hang, a nameless message or a wrong refusal. Slow: half an hour or more on 2 cores."""

from __future__ import annotations

import pytest

from tests.robustness.probe import BAD, PROBES, replay_all


@pytest.mark.slow
def test_every_probe_ends_as_designed(tmp_path):
    results = replay_all(PROBES, tmp_path, jobs=2)
    bad = [f"{p.cli} {p.name}: {verdict}: {message}" for p, (verdict, message) in zip(PROBES, results)
           if verdict in BAD]
    assert not bad, "\n".join(bad)
