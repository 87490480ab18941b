"""b2t.workers: the one way b2t starts worker processes (b2t-preprocess, b2t-eval --workers)."""

from __future__ import annotations

import os
import signal

import pytest

from b2t.workers import WorkerDied, run_jobs, worker_pool


def test_workers_ignore_the_stop_signals_and_run_the_initializer_after():
    # Ctrl-C reaches every process of the group: a worker leaves the stop to its parent (b2t.signals)
    with worker_pool(1, os.umask, (0o077,)) as pool:
        found = dict(run_jobs(pool, signal.getsignal, [signal.SIGTERM, signal.SIGINT]))
        umask_before = dict(run_jobs(pool, os.umask, [0o022]))  # the one the initializer set
    assert found == {0: signal.SIG_IGN, 1: signal.SIG_IGN} and umask_before == {0: 0o077}


def test_a_worker_that_dies_mid_job_is_one_line_and_the_pool_shuts_down():
    # the kernel's out-of-memory killer ends a worker with no word: a bug's "please report" would mislead
    with worker_pool(2) as pool:
        with pytest.raises(WorkerDied, match=r"^a worker process died in the middle of a job \(killed by the "
                                             r"system.*fewer --workers if memory is short$"):
            list(run_jobs(pool, os._exit, [3, 3]))


def test_jobs_run_in_this_process_without_an_executor():
    assert sorted(run_jobs(None, divmod, [7, 9], 2)) == [(0, (3, 1)), (1, (4, 1))]
