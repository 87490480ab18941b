"""Compiles that run side by side: how many at once, what each costs in host memory, and the
openxla warm-up's pool that compiles a run's dynamo graphs while the next ones are traced.

Why: a run's graphs do not depend on each other, and a compile runs in C++ with the GIL
released, so tracing (Python, one graph after another) and compiling (many at once) can overlap.
Both torch_xla's compiles (the warm-up, `CompileAhead`) and libtpu's compile-only client
(`b2t-plan --target`, `b2t.plan.side_by_side`) compile from several threads at once
(docs/xla-facts.md, item 19).

Each concurrent compile holds its own copy of the module and the compiler's working state, so
the host-memory cost is measured while they run (the process's resident set, sampled) and
reported per compile running at once: what one more job would add.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from b2t.private_api import bridge_compiles_handed_off, drop_pending_graphs

_PAGE = os.sysconf("SC_PAGE_SIZE")


def default_jobs() -> int:
    """Half the cores this process may run on (its CPU affinity, else the machine's count), at
    least 1: one libtpu compile keeps about two cores busy, so more concurrent compiles only
    contend (docs/tpu.md, the tiny config on one v5e chip)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores // 2)


def resident_bytes() -> int:
    """This process's resident set size now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


@dataclass(frozen=True)
class HostMemory:
    """The process's resident memory around the compiles: before the first, the peak while they
    ran, and the most that ran at once."""

    before: int
    peak: int
    most_at_once: int

    @property
    def per_compile(self) -> float:
        """Bytes each compile running at once added, on average (peak over before, per compile)."""
        return max(self.peak - self.before, 0) / max(self.most_at_once, 1)


class MemorySampler:
    """Samples the resident set every `interval` seconds while compiles run; `started` and
    `finished` around each compile count how many ran at once."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval, self.peak, self.running, self.most = interval, resident_bytes(), 0, 0
        self.before = self.peak
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        rss = resident_bytes()
        with self._lock:
            self.peak = max(self.peak, rss)

    def started(self) -> None:
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)

    def finished(self) -> None:
        self.sample()
        with self._lock:
            self.running -= 1

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def memory(self) -> HostMemory:
        return HostMemory(self.before, self.peak, self.most)


@dataclass
class _Traced:
    """One traced piece of the warm-up: when its trace began, and its compile jobs (each with
    whether it compiled, or found its graph in torch_xla's cache)."""

    start: float
    jobs: list[tuple[Future, bool]]
    reported: bool = False

    def done(self) -> bool:
        return all(job.done() for job, _ in self.jobs)


@dataclass(frozen=True)
class CompiledPiece:
    """A piece whose compiles have all ended: how many graphs it compiled, when its trace began
    and its last compile ended (perf_counter seconds), and the first compile's error, if any."""

    piece: object
    graphs: int
    start: float
    end: float
    error: BaseException | None


class CompileAhead:
    """Up to `jobs` compiles at once of the dynamo graphs an openxla warm-up traces, in threads,
    while the warm-up traces the next ones (`tracing`): torch_xla's bridge hands each compile
    over (`private_api.bridge_compiles_handed_off`) and runs none of them. The warm-up then runs
    its steps as before, and every graph they meet is in torch_xla's compilation cache.

    `real_outputs`: a graph's stand-in outputs are zero-filled device buffers (a later graph of
    the trace reads them: openxla's backward, off a mesh), else placeholders. A job ends with
    its compile; `pieces_done` and `wait` say what each piece compiled, in the order they end."""

    def __init__(self, jobs: int, device: torch.device, *, real_outputs: bool) -> None:
        self.device, self.real_outputs = device, real_outputs
        self.pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="b2t-compile")
        self.sampler = MemorySampler()
        self.ends: dict[Future, float] = {}
        self.traced: dict[object, _Traced] = {}

    def __enter__(self) -> CompileAhead:
        self.sampler.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        """A warm-up stopped early (an error, a signal) waits for the compiles already running
        and starts no other."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.sampler.__exit__(*exc)

    def _start(self, compile_graph: Callable[[], None]) -> Future:
        def job() -> None:
            self.sampler.started()
            try:
                compile_graph()
            finally:
                self.sampler.finished()

        future = self.pool.submit(job)
        future.add_done_callback(lambda f: self.ends.setdefault(f, time.perf_counter()))
        return future

    @contextlib.contextmanager
    def tracing(self, piece: object) -> Iterator[None]:
        """The graphs the bridge meets inside are `piece`'s; what the trace leaves pending after
        them (the gradients, the host's reads) is dropped, as a run's step never ran it."""
        start = time.perf_counter()
        with bridge_compiles_handed_off(self._start, real_outputs=self.real_outputs) as handed:
            yield
        drop_pending_graphs(self.device)
        self.traced[piece] = _Traced(start, list(handed))

    def pieces_done(self) -> list[CompiledPiece]:
        """The traced pieces whose compiles have all ended since the last call."""
        done = []
        for piece, t in self.traced.items():
            if not t.reported and t.done():
                t.reported = True
                errors = [job.exception() for job, _ in t.jobs if job.exception() is not None]
                end = max((self.ends.get(job, time.perf_counter()) for job, _ in t.jobs), default=t.start)
                done.append(CompiledPiece(piece, sum(compiled for _, compiled in t.jobs), t.start, end,
                                     errors[0] if errors else None))
        return sorted(done, key=lambda c: c.end)

    def wait(self) -> Iterator[CompiledPiece]:
        """Every piece not yet reported, as its compiles end."""
        while any(not t.reported for t in self.traced.values()):
            yield from self.pieces_done()
            time.sleep(0.01)

    def memory(self) -> HostMemory:
        return self.sampler.memory()
