"""Worker processes, started one way: b2t-preprocess's scans and shard writers, b2t-eval's word
decoders.

- Spawned, not forked: the parent may hold an initialised XLA runtime and torch's threads.
- A `concurrent.futures` executor, not a `multiprocessing.Pool`: a Pool starts a replacement
  for a worker that a stop killed, and the stopping parent's exit left it reading its start-up
  data from a closed pipe (an EOFError traceback); a Pool's finalizer also waits forever on
  workers that ignore the SIGTERM it stops them with.
- Each worker ignores SIGTERM and SIGINT (its parent stops it: b2t.signals), and is started in
  `signals.spawning()`: the executor starts its workers as jobs are submitted.
- A worker that dies mid-job (the kernel's out-of-memory killer, most often) is said in one
  line (`WorkerDied`), not as a bug.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from b2t import signals
from b2t.errors import B2tError


class WorkerDied(B2tError):
    """A worker process ended in the middle of a job."""


def worker_pool(workers: int, initializer: Callable[..., object] | None = None,
                initargs: tuple[Any, ...] = ()) -> ProcessPoolExecutor:
    """`workers` spawned processes; each ignores the stop signals, then runs `initializer(*initargs)`."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_start,
                               initargs=(initializer, initargs))


def _start(initializer: Callable[..., object] | None, initargs: tuple[Any, ...]) -> None:
    signals.ignore_stop_signals()  # first: Ctrl-C reaches every process of the terminal's group
    if initializer is not None:
        initializer(*initargs)


def run_jobs(executor: Executor | None, fn: Callable[..., Any], jobs: Sequence[Any],
             *args: Any) -> Iterator[tuple[int, Any]]:
    """(job index, fn(job, *args)) as each finishes; in this process when `executor` is None.
    Jobs not yet started are cancelled when the caller stops early (an error, a `break`)."""
    if executor is None:
        for i, job in enumerate(jobs):
            yield i, fn(job, *args)
        return
    with signals.spawning():  # a submit may start a worker
        futures = {executor.submit(fn, job, *args): i for i, job in enumerate(jobs)}
    try:
        for future in as_completed(futures):
            try:
                result = future.result()
            except BrokenProcessPool:
                raise WorkerDied("a worker process died in the middle of a job (killed by the system, most often "
                                 "when memory runs out, or by hand): run the same command again, with fewer "
                                 "--workers if memory is short") from None
            yield futures[future], result
    finally:
        for future in futures:
            future.cancel()
