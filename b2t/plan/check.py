"""`b2t-plan --target`: the TPU compiler's verdict on a run, on a machine with no TPU.

    config + buckets + mesh -> trace every graph (b2t.plan.capture, virtual CPU devices)
      -> compile each for the target (b2t.plan.compiler, libtpu) -> per graph and chip:
         memory, compile seconds, fits or the compiler's refusal; a roofline bound per step
      -> with `fit`: the most rows per chip of the longest bucket that compile (bisection)

The shape model of `b2t.plan.memory` is printed beside the compiler's total, so the two can
be compared; where the compiler has spoken, its verdict is the answer.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from b2t.config import Config
from b2t.contract import BucketShape
from b2t.engine.backend import backend_class
from b2t.engine.concurrent_compiles import HostMemory
from b2t.errors import UsageError
from b2t.plan.capture import Graph, TraceBackend, prepare_process, trace, trace_backend
from b2t.plan.compiler import HEADROOM, Compiled
from b2t.plan.side_by_side import compile_all, compile_step
from b2t.plan.targets import GiB, Target

MiB = 1024**2


@dataclass(frozen=True)
class Checked:
    """One step of a bucket (train or eval) as the compiler saw it: `compiled` is its peak module's
    memory (the training state beside that module included) with the compile seconds, FLOPs and
    bytes of all its modules summed; `parts` is every module (openxla compiles several per step)."""

    graph: Graph  # the peak module
    compiled: Compiled
    planned: int | None = None  # the shape model's per-device estimate for a train graph
    parts: tuple[tuple[Graph, Compiled], ...] = ()


def run_check(target: Target, cfg: Config, buckets: list[BucketShape], n_days: int,
              report: Callable[[str], None], *, fit: bool = False, jobs: int = 1) -> str:
    """Trace and compile every graph of a run of `cfg` (its `train.backend`: openxla or xla) on
    `target`, compiling up to `jobs` steps at once (`b2t.plan.side_by_side`); the report as text."""
    if not backend_class(cfg.train.backend).xla:
        raise UsageError(f"--target checks a TPU run, which compiles with openxla or xla, not {cfg.train.backend}: "
                         "pass --backend openxla (or xla)")
    mesh = cfg.mesh
    # no mesh given (or data=all): data-parallel over every chip, as --devices all would train
    devices = target.chips if mesh.data == -1 or not mesh.spmd else mesh.data * mesh.fsdp
    if devices != target.chips:
        raise UsageError(f"--mesh spans {devices} devices but {target.name} has {target.chips} chips: "
                         f"give a mesh of {target.chips} (e.g. --mesh data={target.chips})")
    bad = [b for b in buckets if b.B % devices]
    if bad:
        raise UsageError(f"bucket T={bad[0].T} B={bad[0].B} does not split over {devices} chips: "
                         f"re-run b2t-preprocess with --set data.row_multiple={devices}")
    with tempfile.TemporaryDirectory(prefix="b2t-tpu-") as tmp:
        dump = Path(tmp)
        prepare_process(target.chips, dump)
        backend = trace_backend(replace(mesh, data=devices // mesh.fsdp), cfg.train.backend)
        steps = [traced(cfg, n_days, backend, kind, shape, dump, report) for shape in buckets for kind in ("train", "eval")]
        report("\n".join(_table_head(target, cfg, devices)))

        results: list[Checked] = [None] * len(steps)  # filled as the steps compile

        def done(i: int, compiled: list[Compiled]) -> None:  # each step's rows as soon as it is compiled
            results[i] = checked(cfg, n_days, target, steps[i], compiled)
            report("\n".join(_rows(results[i], target)))

        _, memory, wall = compile_all(target, steps, jobs, report, done)
        text = format_report(target, cfg, devices, results) + "\n" + format_side_by_side(results, memory, wall, jobs)
        if fit:
            longest = max(buckets, key=lambda b: b.T)
            rows, probes = largest_fitting_rows(target, cfg, n_days, backend, longest, devices, dump, report)
            text += "\n" + format_fit(longest, rows, devices, probes)
    return text


def check_graph(target: Target, cfg: Config, n_days: int, backend: TraceBackend, kind: str, shape: BucketShape,
                dump: Path, report: Callable[[str], None]) -> Checked:
    """Trace one graph of the run and compile it for `target`; a train graph also gets the
    shape model's estimate (`b2t.plan.memory.step_bytes`) for comparison."""
    parts = traced(cfg, n_days, backend, kind, shape, dump, report)
    report(f"compiling the {kind} step of bucket T={shape.T} B={shape.B} for {target.name}")
    return checked(cfg, n_days, target, parts, compile_step(target, parts))


def traced(cfg: Config, n_days: int, backend: TraceBackend, kind: str, shape: BucketShape, dump: Path,
           report: Callable[[str], None]) -> list[Graph]:
    """The step's modules as `b2t.plan.capture.trace` gives them (one under xla, several under openxla)."""
    report(f"tracing the {kind} step of bucket T={shape.T} B={shape.B}")
    return trace(cfg, n_days, backend, kind, shape, dump)


def checked(cfg: Config, n_days: int, target: Target, graphs: list[Graph], compiled: list[Compiled]) -> Checked:
    """A step's modules and their compiles as one `Checked`, with the planner's estimate."""
    graph, peak = combined(list(zip(graphs, compiled)))
    parts = tuple(zip(graphs, compiled)) if len(graphs) > 1 else ()
    return Checked(graph, peak, planned_bytes(cfg, n_days, graph, target.chips), parts)


def planned_bytes(cfg: Config, n_days: int, graph: Graph, devices: int) -> int | None:
    """The shape model's per-device estimate of a train graph (`b2t.plan.memory.step_bytes`); None for eval."""
    from b2t.plan.memory import step_bytes, weight_layout

    if graph.kind != "train":
        return None
    weights = weight_layout(cfg.model, n_days, cfg.mesh.fsdp)
    return step_bytes(max(graph.rows // devices, 1), graph.bucket, weights, cfg.model)


def combined(parts: list[tuple[Graph, Compiled]]) -> tuple[Graph, Compiled]:
    """A step of several modules as one: the first refused module, else the one with the largest
    total; compile seconds, FLOPs and bytes summed over all of them."""
    refused = [p for p in parts if p[1].memory is None]
    graph, peak = refused[0] if refused else max(parts, key=lambda p: p[1].memory.total)
    return graph, replace(peak, seconds=sum(c.seconds for _, c in parts), flops=sum(c.flops for _, c in parts),
                          bytes_accessed=sum(c.bytes_accessed for _, c in parts))


def format_side_by_side(results: list[Checked], memory: HostMemory, wall: float, jobs: int) -> str:
    """The compiles' wall time against their sum, and the host memory each one running at once took."""
    total = sum(r.compiled.seconds for r in results)
    at_once = min(jobs, len(results))
    return (f"side by side: {len(results)} steps, up to {at_once} at once (--jobs {jobs}): {wall:.0f} s of wall time "
            f"for {total:.0f} s of compiling; host memory {memory.before / GiB:.1f} GiB before, peak "
            f"{memory.peak / GiB:.1f} GiB with {memory.most_at_once} at once, about {memory.per_compile / GiB:.2f} GiB "
            "per concurrent compile (each extra job adds about that much)")


def largest_fitting_rows(target: Target, cfg: Config, n_days: int, backend: TraceBackend, shape: BucketShape,
                         devices: int, dump: Path, report: Callable[[str], None]) -> tuple[int, list[tuple[int, bool]]]:
    """Most rows per chip of `shape`'s train step the compiler accepts (0: none), searched from
    the bucket's own rows (`b2t.plan.memory.largest_passing`); also each probe (rows per chip, fits)."""
    from b2t.plan.memory import largest_passing

    probes: list[tuple[int, bool]] = []

    def fits(rows: int) -> bool:
        report(f"fit probe: {rows} rows per chip of T={shape.T}")
        ok = check_graph(target, cfg, n_days, backend, "train", replace(shape, B=rows * devices), dump, report).compiled.fits
        probes.append((rows, ok))
        return ok

    return largest_passing(fits, start=max(shape.B // devices, 1)), probes


def _mib(n: int) -> str:
    return f"{n / MiB:9.1f}"


def _table_head(target: Target, cfg: Config, devices: int) -> list[str]:
    chip, m = target.chip, cfg.mesh
    return [f"TPU check: {target.name} ({target.chips} x {chip.kind} chip, {chip.hbm / GiB:.0f} GiB HBM each, "
            f"{target.hosts} host{'s' * (target.hosts > 1)}), mesh data={devices // m.fsdp},fsdp={m.fsdp}",
            f"graphs: the trainer's --backend {cfg.train.backend} train step and eval step per bucket, traced on "
            f"{devices} virtual CPU device{'s' * (devices > 1)} with placeholder weights, compiled by the TPU compiler "
            "(libtpu)",
            "",
            f"{'per chip, MiB':26s}{'args':>9s}{'out':>9s}{'alias':>9s}{'temp':>9s}{'code':>9s}{'live':>9s}{'total':>9s}"
            f"{'of HBM':>8s}{'compile':>9s}{'planner':>9s}  verdict"]


def _rows(r: Checked, target: Target) -> list[str]:
    """A step's lines of the table: the step (its peak module's memory), then under openxla each module."""
    g = r.graph
    return [_row(f"{g.kind:5s} T={g.bucket.T} B={g.rows}", r.compiled, target.chip.hbm, r.planned),
            *(_row(f"  {part.part}", compiled, target.chip.hbm, None) for part, compiled in r.parts)]


def _row(name: str, c: Compiled, hbm: int, planned: int | None) -> str:
    """One line of the report: per-chip MiB, share of HBM, compile seconds, planner, verdict."""
    plan = f"{planned / MiB:9.0f}" if planned is not None else f"{'':9s}"
    if c.memory is None:
        return f"{name:26s}{'':63s}{'':8s}{c.seconds:8.1f}s{plan}  {c.refusal}"
    m = c.memory
    return (f"{name:26s}{_mib(m.arguments)}{_mib(m.outputs)}{_mib(m.aliased)}{_mib(m.temp)}{_mib(m.code)}"
            f"{_mib(m.resident)}{_mib(m.total)}{m.total / hbm:7.1%} {c.seconds:7.1f}s{plan}  {c.verdict}")


def format_report(target: Target, cfg: Config, devices: int, results: list[Checked]) -> str:
    chip = target.chip
    lines = _table_head(target, cfg, devices) + [line for r in results for line in _rows(r, target)]
    refused = [r for r in results if r.compiled.memory is None or r.compiled.refusal]
    tight = [r for r in results if r.compiled.tight]
    if refused:
        r = refused[0]
        verdict = (f"DOES NOT FIT: {len(refused)} of {len(results)} graphs refused, first "
                   f"{r.graph.kind} T={r.graph.bucket.T} B={r.graph.rows}: {r.compiled.refusal}")
    elif tight:
        r = tight[0]
        verdict = (f"TIGHT: {len(tight)} of {len(results)} graphs leave less than {HEADROOM:.0%} of HBM free, first "
                   f"{r.graph.kind} T={r.graph.bucket.T} B={r.graph.rows}: {r.compiled.tight}")
    else:
        peak = max(results, key=lambda r: r.compiled.memory.total)
        verdict = (f"fits: every graph compiled; the largest, {peak.graph.kind} T={peak.graph.bucket.T}, needs "
                   f"{peak.compiled.memory.total / GiB:.2f} GiB of {chip.hbm / GiB:.0f} GiB per chip "
                   f"({1 - peak.compiled.memory.total / chip.hbm:.0%} spare)")
    compile_s = sum(r.compiled.seconds for r in results)
    lines += ["", f"verdict (the TPU compiler's): {verdict}",
              f"compile time on this machine: {compile_s:.0f} s for {len(results)} steps "
              f"(a TPU host compiles the same graphs before the first step)",
              "live: training state the run keeps beside a graph that it does not read (the moments "
              "during a forward or an eval)",
              "planner: b2t-plan's shape-model estimate (without --target) of the train step, for comparison", ""]
    lines += format_roofline(target, cfg, devices, results)
    return "\n".join(lines)


def loop_flops(cfg: Config, shape: BucketShape, rows: int) -> float:
    """Train-step FLOPs of the GRU recurrences' time steps after the first, which the compiler's
    cost analysis leaves out: it counts a while-loop body once, not once per trip (measured:
    `tools/tpu_figures.py loop-count`). Two loops per layer walk the steps, each with one
    recurrent product of 2 * rows * 3H * H per step: the forward and the backward's state
    gradient (`b2t.model.recurrence.stack_backward`; its other products run over all steps at
    once, outside any loop, and are counted)."""
    from b2t.buckets import patch_count
    from b2t.plan.memory import model_shape

    P = patch_count(shape.T, cfg.model.patch_size, cfg.model.patch_stride)
    per_step = sum(n * 2 * rows * 3 * H * H for _, H, n in model_shape(cfg.model).grus)
    return 2.0 * per_step * max(P - 1, 0)


def format_roofline(target: Target, cfg: Config, devices: int, results: list[Checked]) -> list[str]:
    """Per train graph: FLOPs (the cost analysis plus the loop trips it leaves out) and HBM
    traffic (the cost analysis: a loop body's traffic counted once, so a lower bound) against the
    chip's peak, a lower bound on the step time (no overlap loss, no collectives, no host)."""
    chip = target.chip
    lines = [f"roofline per chip ({chip.kind}: {chip.peak_bf16 / 1e12:.0f} TFLOP/s bf16, "
             f"{chip.hbm_bandwidth / 1e9:.0f} GB/s HBM; FLOPs = cost analysis + GRU loop trips, bytes = cost analysis):",
             f"  {'graph':22s}{'GFLOP':>10s}{'GB moved':>10s}{'>= ms/step':>12s}{'<= steps/s':>12s}  bound by"]
    for r in results:
        c = r.compiled
        if r.graph.kind != "train" or c.memory is None:
            continue
        flops = c.flops + loop_flops(cfg, r.graph.bucket, max(r.graph.rows // devices, 1))
        compute, memory = flops / chip.peak_bf16, c.bytes_accessed / chip.hbm_bandwidth
        floor = max(compute, memory)
        lines.append(f"  {'train T=' + str(r.graph.bucket.T) + ' B=' + str(r.graph.rows):22s}{flops / 1e9:10.1f}"
                     f"{c.bytes_accessed / 1e9:10.2f}{floor * 1e3:12.2f}{1 / floor if floor else 0:12.1f}  "
                     f"{'compute' if compute >= memory else 'HBM bandwidth'}")
    return lines


def format_fit(shape: BucketShape, rows: int, devices: int, probes: list[tuple[int, bool]]) -> str:
    tried = ", ".join(f"{r}{'' if ok else ' (refused)'}" for r, ok in probes)
    if rows == 0:
        return f"largest micro-batch of T={shape.T}: not even 1 row per chip compiles (probes: {tried})"
    accum = -(-shape.B // (rows * devices))
    line = (f"largest micro-batch of T={shape.T} the compiler accepts: {rows} rows per chip = {rows * devices} rows "
            f"(probes, rows per chip: {tried})")
    if rows * devices < shape.B:
        line += f"; for {shape.B} rows per step use train.grad_accum={accum} with that micro-batch"
    return line
