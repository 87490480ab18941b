"""Compile traced graphs for a TPU target side by side, and what that costs in host memory.

Why: a run's graphs do not depend on each other, and libtpu's compile-only client compiles
from several threads at once (it releases the GIL; docs/xla-facts.md, item 19), so `b2t-plan --target` waits about as long as
its slowest graph on a host with enough cores, not for the sum. Tracing stays one graph after
another (torch_xla traces in one thread); only the compiles overlap.

The host-memory cost of each compile running at once is measured while they run
(`b2t.engine.concurrent_compiles`, which owns that accounting for the warm-up too).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from b2t.engine.concurrent_compiles import HostMemory, MemorySampler
from b2t.errors import UsageError
from b2t.plan.capture import Graph
from b2t.plan.compiler import Compiled, compile_for
from b2t.plan.targets import Target


def compile_step(target: Target, parts: Sequence[Graph]) -> list[Compiled]:
    """A step's modules compiled in its order: a module reads an earlier one's outputs in the
    shardings that module's compile chose (openxla's forward, backward, update)."""
    compiled: list[Compiled] = []
    for graph in parts:
        handed = {n: compiled[m].output_shardings[i] for n, m, i in graph.inputs_from
                  if i < len(compiled[m].output_shardings)}
        compiled.append(compile_for(target, graph.hlo, graph.donors, graph.resident, handed))
    return compiled


def compile_all(target: Target, steps: Sequence[Sequence[Graph]], jobs: int, report: Callable[[str], None],
                done: Callable[[int, list[Compiled]], None] | None = None
                ) -> tuple[list[list[Compiled]], HostMemory, float]:
    """Compile every step for `target`, up to `jobs` steps at once (a step's own modules one
    after another, `compile_step`); the results in `steps`' order, the host memory they took
    and the wall seconds of the whole. Each compile's start is reported as k/N with an expected
    time (the compiled steps of its kind so far), and `done(index, compiled)` is called as each
    step finishes, so a caller can show its row at once."""
    from b2t.train.warmup_progress import CompileEstimates

    if jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {jobs}")
    jobs = min(jobs, len(steps)) or 1
    report(f"compiling {len(steps)} step{'s' * (len(steps) != 1)} for {target.name}, {jobs} at a time")
    estimates, lock = CompileEstimates(), threading.Lock()
    t0 = time.perf_counter()
    with MemorySampler() as sampler, ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="tpu-compile") as pool:
        def one(index: int) -> list[Compiled]:
            g = steps[index][0]
            with lock:
                expected = estimates.estimate(f"{g.kind} T={g.bucket.T}", g.kind)
            report(f"compiling {index + 1}/{len(steps)}: the {g.kind} step of bucket T={g.bucket.T} B={g.rows}"
                   f"{f' ({expected})' if expected else ''}")
            sampler.started()
            try:
                compiled = compile_step(target, steps[index])
            finally:
                sampler.finished()
            seconds = sum(c.seconds for c in compiled)
            with lock:
                estimates.observe(g.kind, f"T={g.bucket.T}", seconds)
            report(f"compiled the {g.kind} step of bucket T={g.bucket.T} B={g.rows}: {seconds:.1f} s")
            if done is not None:
                done(index, compiled)
            return compiled

        results = list(pool.map(one, range(len(steps))))
    return results, sampler.memory(), time.perf_counter() - t0
