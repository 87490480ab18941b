"""The TPU compiler's figures for docs/tpu.md: planner against compiler, the 687M question,
compile time per bucket, each chip's share of the work, the roofline, and how the cost analysis
counts a while-loop.

Each case traces one graph of the trainer (b2t.plan.capture) and compiles it with libtpu for
a target, in a fresh process (the trace fixes its CPU device count at start-up), and prints
one JSON line; the driver prints markdown tables. Minutes per case for the large models on
a 2-core machine, so every case's rows are kept in `--results` (JSON lines) and a case
already there is not compiled again: the tables share cases, and an interrupted run resumes.

    python tools/tpu_figures.py calibration      # tiny / baseline / noise687m, 1 and 8 chips
    python tools/tpu_figures.py question         # noise687m B=64 T=2498 on v5e-8, 3 meshes + fallback, both backends
    python tools/tpu_figures.py share            # per-chip FLOPs on 8 chips against the one-chip step's / 8
    python tools/tpu_figures.py guard            # fails when the 687M step, as its config runs it, outgrows docs/tpu.md
    python tools/tpu_figures.py compile-times    # every bucket of baseline (v5e-1) and noise687m (v5e-8)
    python tools/tpu_figures.py loop-count       # cost analysis vs analytic FLOPs of a recurrence-heavy GRU
    python tools/tpu_figures.py targets          # the tiny step on every slice, v5e-64 (16 hosts) included
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[1]
LONGEST = "2498,64,88"  # the competition's longest bucket (b2t.plan.memory.COMPETITION_BUCKETS)
MESHES_8 = ("data=8", "fsdp=8", "data=2,fsdp=4")
DAYS = 45  # the competition's sessions: one day layer each


RESULTS: Path | None = None


@click.group()
@click.option("--results", type=click.Path(dir_okay=False, path_type=Path), default=REPO / "bench_out" / "tpu_cases.jsonl",
              show_default=True, help="JSON lines of finished cases, reused by later runs.")
def main(results: Path) -> None:
    """Run one figure set; each case in its own process."""
    global RESULTS
    RESULTS = results


@main.command()
@click.option("--config", required=True)
@click.option("--target", required=True)
@click.option("--mesh", default="")
@click.option("--shape", default=LONGEST, help="T,B,L")
@click.option("--kinds", default="train")
@click.option("--set", "overrides", multiple=True)
@click.option("--days", default=DAYS)
@click.option("--backend", default="", help="openxla or xla (default: the config's train.backend)")
def case(config: str, target: str, mesh: str, shape: str, kinds: str, overrides: tuple[str, ...], days: int,
         backend: str) -> None:
    """One traced and compiled step per kind, as a JSON line each."""
    from b2t.config import load_config
    from b2t.contract import BucketShape
    from b2t.engine.mesh import parse_devices
    from b2t.plan.capture import prepare_process, trace_backend
    from b2t.plan.check import check_graph
    from b2t.plan.targets import parse_target

    t = parse_target(target)
    mesh_cfg = parse_devices(None, mesh) if mesh else None
    sets = (*overrides, *((f"mesh.data={mesh_cfg.data}", f"mesh.fsdp={mesh_cfg.fsdp}") if mesh_cfg else ()),
            *((f"train.backend={backend}",) if backend else ()))
    cfg = load_config(REPO / config, sets)
    T, B, L = (int(x) for x in shape.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        prepare_process(t.chips, Path(tmp))
        tracer = trace_backend(mesh_cfg, cfg.train.backend)
        for kind in kinds.split(","):
            t0 = time.perf_counter()
            r = check_graph(t, cfg, days, tracer, kind, BucketShape(T=T, B=B, L=L), Path(tmp), lambda _: None)
            c, m = r.compiled, r.compiled.memory
            print(json.dumps({
                "config": config, "target": target, "mesh": mesh or "one chip", "backend": cfg.train.backend,
                "kind": kind, "T": T, "B": B, "grad_accum": cfg.train.grad_accum, "fits": c.fits,
                "refusal": c.refusal or c.tight, "memory": None if m is None else {**m.__dict__, "total": m.total},
                "planned": r.planned, "compile_s": c.seconds, "trace_s": r.graph.trace_s * max(len(r.parts), 1),
                "wall_s": time.perf_counter() - t0, "flops": c.flops, "bytes": c.bytes_accessed,
                "parts": [{"part": g.part, **({**p.memory.__dict__, "total": p.memory.total} if p.memory else {}),
                           "compile_s": p.seconds} for g, p in r.parts],
                "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,
                "fingerprint": fingerprint([g for g, _ in r.parts] or [r.graph]),
            }), flush=True)


def _run(*args: str) -> list[dict]:
    """The case's rows from RESULTS, or from a fresh process (then appended to RESULTS)."""
    key = " ".join(args)
    if RESULTS is not None and RESULTS.exists():
        kept = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
        rows = [_verdict(r["row"]) for r in kept if r["case"] == key]
        if rows:
            return rows
    out = subprocess.run([sys.executable, __file__, "case", *args], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not rows:
        lines = out.stderr.strip().splitlines()
        python = [ln for ln in lines if re.match(r"^\w+(Error|Exception|Missing)\b", ln)]  # libtpu's noise comes after
        print(f"case {key} failed (exit {out.returncode}): {' | '.join(python[-1:] or lines[-3:])}", file=sys.stderr)
        return []
    if RESULTS is not None:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        with RESULTS.open("a") as f:  # one line per row, written whole after the case ended
            f.writelines(json.dumps({"case": key, "row": r}) + "\n" for r in rows)
    for r in rows:
        print(json.dumps(r), file=sys.stderr, flush=True)
    return [_verdict(r) for r in rows]


def _verdict(r: dict) -> dict:
    """The row with b2t.plan.compiler's current verdict (a row kept from an earlier version of it
    may say `fits` for a graph the compiler accepted but the chip cannot hold)."""
    from b2t.plan.compiler import Compiled, Memory, over_hbm, short_of_headroom
    from b2t.plan.targets import parse_target

    if r["memory"]:
        m = r["memory"]
        memory = Memory(m["arguments"], m["outputs"], m["aliased"], m["temp"], m["code"], m.get("resident", 0))
        hbm = parse_target(r["target"]).chip.hbm
        c = Compiled(r["compile_s"], memory, refusal=over_hbm(memory, hbm), tight=short_of_headroom(memory, hbm))
        r = {**r, "fits": c.fits, "refusal": c.refusal or c.tight}
    return r


def _compiler_total(r: dict) -> float | None:
    """The compiler's per-chip total in bytes: its memory report, or the figure its refusal names."""
    if r["memory"]:
        return r["memory"]["total"]
    m = re.search(r"needs ([\d.]+)G of", r["refusal"])
    return float(m.group(1)) * 1024**3 if m else None


def _gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 1024**3:.2f}"


GUARD_DOC = REPO / "docs" / "tpu.md"
GUARD_CASE = ("--config", "configs/noise687m.yaml", "--target", "v5e-8", "--mesh", "data=8", "--shape", LONGEST)
"""The config's own backend and mesh: the run a user rents the hardware for."""
GUARD_TOLERANCE = 0.05
"""How far the guarded step's per-chip total may exceed the figure docs/tpu.md states."""


GUARD_LINE = re.compile(r"(Guarded figure[^\n]*?: )\*\*([\d.]+) GiB per chip\*\*, graph `([0-9a-f]{12})`")


def guarded(doc: Path = GUARD_DOC) -> tuple[float, str]:
    """The GiB per chip docs/tpu.md promises for the guarded step, and the fingerprint of the
    graph it was measured on (its 'Guarded figure' line)."""
    m = GUARD_LINE.search(doc.read_text())
    if m is None:
        raise click.ClickException(f"{doc} states no 'Guarded figure ...: **N GiB per chip**, graph `F`' line")
    return float(m.group(2)), m.group(3)


def fingerprint(graphs: list) -> str:
    """What decides a step's TPU figures, as 12 hex digits: each module's traced HLO without its
    ops' metadata (source files: the install's path), what the module donates, is handed and keeps
    beside it, and the TPU compiler's version. The same fingerprint, the same compiler figures."""
    from importlib.metadata import PackageNotFoundError, version

    from b2t.plan.capture import without_metadata

    try:
        libtpu = version("libtpu")
    except PackageNotFoundError:
        libtpu = "none"
    h = hashlib.sha256(libtpu.encode())
    for g in graphs:
        h.update(json.dumps([g.part, g.kind, g.rows, g.donors, g.inputs_from, g.resident]).encode())
        h.update(hashlib.sha256(without_metadata(g.hlo)).digest())
    return h.hexdigest()[:12]


@main.command("fingerprint")
def fingerprint_command() -> None:
    """Trace the guarded step (no compile: half a minute) and fail when its graph is not the one
    docs/tpu.md's figure was measured on: `make test`'s tripwire for the slow `guard`."""
    from b2t.config import load_config
    from b2t.contract import BucketShape
    from b2t.engine.mesh import parse_devices
    from b2t.plan.capture import prepare_process, trace, trace_backend

    _, measured = guarded()
    args = dict(zip(GUARD_CASE[::2], GUARD_CASE[1::2]))
    mesh_cfg = parse_devices(None, args["--mesh"])
    cfg = load_config(REPO / args["--config"], (f"mesh.data={mesh_cfg.data}", f"mesh.fsdp={mesh_cfg.fsdp}"))
    T, B, L = (int(x) for x in args["--shape"].split(","))
    with tempfile.TemporaryDirectory() as tmp:
        prepare_process(mesh_cfg.data * mesh_cfg.fsdp, Path(tmp))
        now = fingerprint(trace(cfg, DAYS, trace_backend(mesh_cfg, cfg.train.backend), "train",
                                BucketShape(T=T, B=B, L=L), Path(tmp)))
    if now != measured:
        raise click.ClickException(
            f"the guarded 687M step's graph is {now}, docs/tpu.md's figure was measured on {measured}: run "
            "`python tools/tpu_figures.py guard --update` (3 minutes of the TPU compiler) and commit the figure it states")
    click.echo(f"guarded step's graph: {now}, as docs/tpu.md's figure: ok")


@main.command()
@click.option("--update", is_flag=True, help="State the figure and graph measured now in docs/tpu.md.")
def guard(update: bool) -> None:
    """Compile the 687M model's train step (data=8, B=64, T=2498, the config's backend and mesh) in
    a fresh process and fail when its per-chip total exceeds docs/tpu.md's figure by more than 5%,
    or its graph is not the one the figure was measured on; `--update` states the new figure."""
    promised, measured = guarded()
    global RESULTS
    RESULTS = None  # always compiled again: the guard is about the code as it is now
    rows = _run(*GUARD_CASE)
    if not rows:
        raise click.ClickException("the guarded case did not compile (see above)")
    total, graph = _compiler_total(rows[0]) / 1024**3, rows[0]["fingerprint"]
    verdict = (f"guarded step: {total:.2f} GiB per chip, graph {graph}; docs/tpu.md states {promised:.2f}, graph "
               f"{measured} (limit +{GUARD_TOLERANCE:.0%})")
    if update:
        text = GUARD_DOC.read_text()
        GUARD_DOC.write_text(GUARD_LINE.sub(lambda m: f"{m.group(1)}**{total:.2f} GiB per chip**, graph `{graph}`", text))
        click.echo(f"{verdict}: docs/tpu.md now states {total:.2f}, graph {graph}; its tables of the 687M step "
                   "were measured on the old graph: re-measure those that moved")
    elif total > promised * (1 + GUARD_TOLERANCE):
        raise click.ClickException(f"{verdict}: it grew; find the change, or re-measure and update docs/tpu.md")
    elif graph != measured:
        raise click.ClickException(f"{verdict}: the graph changed; state it with --update")
    else:
        click.echo(f"{verdict}: ok")


@main.command()
def calibration() -> None:
    """Planner estimate against the compiler's per-chip total, train step of the longest bucket."""
    print("| config | target | mesh | planner GiB | compiler GiB | planner/compiler | compiler verdict |")
    print("|---|---|---|---|---|---|---|")
    configs = ("configs/tiny.yaml", "configs/baseline.yaml", "configs/noise687m.yaml")
    cases = [(c, "v5e-8", m) for m in MESHES_8 for c in configs] + [(c, "v5e-1", "") for c in configs]
    for config, target, mesh in cases:
        for r in _run("--config", config, "--target", target, "--mesh", mesh, "--shape", LONGEST):
            total = _compiler_total(r)
            ratio = f"{r['planned'] / total:.2f}" if total else "-"
            print(f"| {Path(config).stem} | {target} | {r['mesh']} | {_gib(r['planned'])} | {_gib(total)} | {ratio} | "
                  f"{'fits' if r['fits'] else r['refusal']} |", flush=True)


def _bound(r: dict) -> tuple[float, float, float, str]:
    """A train row's per-chip FLOPs (cost analysis + the GRU loops' uncounted trips,
    b2t.plan.check.loop_flops), its bytes, and the roofline's ms per step and what bounds it."""
    from b2t.config import load_config
    from b2t.contract import BucketShape
    from b2t.plan.check import loop_flops
    from b2t.plan.targets import parse_target

    target = parse_target(r["target"])
    cfg = load_config(REPO / r["config"], (f"train.grad_accum={r['grad_accum']}",))
    flops = r["flops"] + r["grad_accum"] * loop_flops(cfg, BucketShape(T=r["T"], B=r["B"], L=88),
                                                     max(r["B"] // target.chips, 1))
    compute, memory = flops / target.chip.peak_bf16, r["bytes"] / target.chip.hbm_bandwidth
    return flops, r["bytes"], max(compute, memory) * 1e3, "compute" if compute > memory else "HBM bandwidth"


QUESTION = (("B=64", "data=8", LONGEST, ()), ("B=64", "data=2,fsdp=4", LONGEST, ()), ("B=64", "fsdp=8", LONGEST, ()),
            ("B=32 x grad_accum 2", "data=8", "2498,32,88", ("train.grad_accum=2",)))


BACKENDS = click.option("--backend", "backends", multiple=True, default=("openxla", "xla"), show_default=True,
                        type=click.Choice(["openxla", "xla"]), help="Backends to measure (repeatable).")


@main.command()
@BACKENDS
def question(backends: tuple[str, ...]) -> None:
    """noise687m at batch 64 in the longest bucket on v5e-8 (the original layout data=8, two fsdp
    meshes, and the original fallback B=32 x 2), both backends: memory per chip, verdict, FLOPs,
    bytes, roofline and compile seconds."""
    print("| backend | run | mesh | args | out | alias | temp | live | code | total GiB per chip | verdict | TFLOP per chip "
          "| GB moved | >= ms/step | <= steps/s | bound by | compile s | peak host RAM GiB |")
    print("|" + "---|" * 18)
    for backend in backends:
        for name, mesh, shape, sets in QUESTION:
            args = ["--config", "configs/noise687m.yaml", "--target", "v5e-8", "--mesh", mesh, "--shape", shape,
                    "--backend", backend]
            for s in sets:
                args += ["--set", s]
            for r in _run(*args):
                m = r["memory"] or {}
                flops, moved, ms, bound = _bound(r) if r["memory"] else (0, 0, 0, "-")
                print(f"| {backend} | {name} | {r['mesh']} | {_gib(m.get('arguments'))} | {_gib(m.get('outputs'))} | "
                      f"{_gib(m.get('aliased'))} | {_gib(m.get('temp'))} | {_gib(m.get('resident'))} | "
                      f"{_gib(m.get('code'))} | {_gib(m.get('total'))} | {'fits' if r['fits'] else r['refusal']} | "
                      f"{flops / 1e12:.1f} | {moved / 1e9:.0f} | {ms:.0f} | {1e3 / ms if ms else 0:.2f} | {bound} | "
                      f"{r['compile_s']:.0f} | {r['peak_rss_gib']:.1f} |", flush=True)


@main.command()
@BACKENDS
@click.option("--config", "configs", multiple=True, show_default=True,
              default=("configs/tiny.yaml", "configs/baseline.yaml", "configs/noise687m.yaml"))
def share(backends: tuple[str, ...], configs: tuple[str, ...]) -> None:
    """Does each chip do only its share? Per-chip train FLOPs (loop trips included) on v5e-8
    meshes against the one-chip step's / 8, longest bucket at B=64, both backends. The 687M
    model does not fit one chip at B=64, so its reference is one chip at B=8 (its per-row work
    is the whole step's / 8; the update, per weight, is counted whole on every data-parallel chip)."""
    print("| config | backend | mesh | TFLOP per chip | one chip's / 8 | ratio |")
    print("|---|---|---|---|---|---|")
    for config in configs:
        for backend in backends:
            big = "noise687m" in config
            one = _run("--config", config, "--target", "v5e-1", "--mesh", "", "--shape",
                       "2498,8,88" if big else LONGEST, "--backend", backend)
            if not one or not one[0]["memory"]:
                print(f"| {Path(config).stem} | {backend} | - | - | - | the one-chip reference did not compile |")
                continue
            reference = _bound(one[0])[0] / (1 if big else 8)
            for mesh in MESHES_8:
                for r in _run("--config", config, "--target", "v5e-8", "--mesh", mesh, "--shape", LONGEST,
                              "--backend", backend):
                    flops = _bound(r)[0] if r["memory"] else float("nan")
                    print(f"| {Path(config).stem} | {backend} | {mesh} | {flops / 1e12:.3f} | {reference / 1e12:.3f} | "
                          f"{flops / reference:.2f} |", flush=True)


@main.command("compile-times")
def compile_times() -> None:
    """TPU compile seconds per bucket and graph, on this machine, for each config as it runs
    (its own backend and mesh), and the warm-up they add up to: every bucket's train and eval
    step, an `openxla` optimizer update once (the same graph in every bucket, compiled once);
    then what the warm-up waits for one graph after another and side by side (`side_by_side`)."""
    from b2t.plan.memory import COMPETITION_BUCKETS

    print("| config | target | bucket | train compile s | of which update | eval compile s | train trace s |")
    print("|---|---|---|---|---|---|---|")
    for config, target, mesh in (("configs/baseline.yaml", "v5e-1", ""), ("configs/noise687m.yaml", "v5e-8", "data=8")):
        warm_up, update, buckets = 0.0, 0.0, []  # mesh: the config's own (noise687m.yaml's `mesh:` is data=8)
        for b in COMPETITION_BUCKETS:  # one case per graph: the longest bucket's train case is the question's
            case = ("--config", config, "--target", target, "--mesh", mesh, "--shape", f"{b.T},{b.B},{b.L}")
            rows = {r["kind"]: r for r in (*_run(*case), *_run(*case, "--kinds", "eval"))}
            if len(rows) < 2:
                continue
            train = rows["train"]
            buckets.append(rows)
            this_update = next((p["compile_s"] for p in train["parts"] if p["part"] == "update"), None)
            update = max(update, this_update or 0.0)
            warm_up += train["compile_s"] - (this_update or 0.0) + rows["eval"]["compile_s"]
            of_update = "-" if this_update is None else f"{this_update:.1f}"
            print(f"| {Path(config).stem} | {target} {train['mesh']} | T={b.T} B={b.B} | {train['compile_s']:.0f} | "
                  f"{of_update} | {rows['eval']['compile_s']:.0f} | {train['trace_s']:.0f} |", flush=True)
        in_turn, beside = side_by_side(buckets)
        print(f"\n{Path(config).stem} warm-up: {(warm_up + update) / 60:.1f} min of compiling; with the traces "
              f"{in_turn:.0f} s one graph after another, about {beside:.0f} s side by side "
              f"({beside / in_turn:.2f}x; an estimate: enough cores for every graph at once)\n", flush=True)


def side_by_side(buckets: list[dict]) -> tuple[float, float]:
    """What an openxla warm-up waits for, from each bucket's train and eval rows (their modules'
    compile seconds and trace seconds): (one graph after another, side by side).

    Side by side (b2t.train.warmup): the buckets' train and eval steps are traced in turn, each
    dynamo module compiling from the end of its trace on, as many at once as there are modules;
    then the steps run, compiling what stays lazy one after another: the update once, or, on a
    mesh, each bucket's backward and update. The lazy part's trace counts inside the train
    trace, which is all on the first pass: a bound on the wait, not a measurement."""
    t, ends, lazy, update, in_turn = 0.0, [0.0], 0.0, 0.0, 0.0
    for rows in buckets:
        train, evaluation = rows["train"], rows["eval"]
        parts = {p["part"]: p["compile_s"] for p in train["parts"]}
        update = max(update, parts.get("update", 0.0))
        lazy += parts.get("backward+update", 0.0)
        in_turn += train["trace_s"] + evaluation["trace_s"] + train["compile_s"] + evaluation["compile_s"]
        t += train["trace_s"]
        ends += [t + s for part, s in parts.items() if part in ("forward", "backward")]
        t += evaluation["trace_s"]
        ends.append(t + evaluation["compile_s"])
    in_turn -= update * (len(buckets) - 1)  # one update graph serves every bucket
    return in_turn, max(t, *ends) + update + lazy


@main.command()
def targets() -> None:
    """Every slice compiles: the tiny config's train step (B=64, T=254) on each, data-parallel
    over its chips (v5e-64: a 16 x 4 data x fsdp mesh over 16 hosts' chips)."""
    from b2t.plan.targets import TARGETS

    print("| target | chips | mesh | total MiB per chip | compile s | verdict |")
    print("|---|---|---|---|---|---|")
    for target, mesh in (("v5e-64", "data=16,fsdp=4"), ("v6e-8", "data=8"), ("v5p-8", "data=4"), ("v4-8", "data=4"),
                         ("v5e-4", "data=4"), ("v5e-8", "data=8"), ("v5e-1", "")):
        for r in _run("--config", "configs/tiny.yaml", "--target", target, "--mesh", mesh, "--shape", "254,64,32",
                      "--days", "5"):
            total = f"{r['memory']['total'] / 1024**2:.1f}" if r["memory"] else "-"
            print(f"| {target} | {TARGETS[target].chips} | {r['mesh']} | {total} | {r['compile_s']:.0f} | "
                  f"{'fits' if r['fits'] else r['refusal']} |", flush=True)


def analytic_train_flops(B: int, T: int, H: int, layers: int, patch: int, stride: int, loop_trips: bool) -> float:
    """Matmul FLOPs of one train step (backward = 2x forward) of a `gru` model: day layer,
    GRU input projections, recurrent products (per time step when `loop_trips`, else once),
    output layer. CTC and element-wise work are left out (small next to these)."""
    F, C = 512, 41
    P = (T - patch) // stride + 1
    D = patch * F
    day = 2 * B * T * F * F
    inputs = sum(2 * B * P * (D if i == 0 else H) * 3 * H for i in range(layers))
    recurrent = layers * 2 * B * 3 * H * H * (P if loop_trips else 1)
    out = 2 * B * P * H * C
    return 3 * (day + inputs + recurrent + out)


@main.command("loop-count")
def loop_count() -> None:
    """Does the cost analysis count a while-loop body once or per trip? A GRU whose recurrent
    products dominate (H=1024, patch 1) against both analytic counts."""
    B, T, H, layers = 4, 256, 1024, 1
    sets = ("model.patch_size=1", "model.patch_stride=1", f"model.gru.n_units={H}", f"model.gru.n_layers={layers}")
    args = ["--config", "configs/tiny.yaml", "--target", "v5e-1", "--shape", f"{T},{B},8", "--days", "2"]
    for s in sets:
        args += ["--set", s]
    from b2t.config import load_config
    from b2t.contract import BucketShape
    from b2t.plan.check import loop_flops

    missing = loop_flops(load_config(REPO / "configs/tiny.yaml", sets), BucketShape(T=T, B=B, L=8), B)
    for r in _run(*args):
        per_trip = analytic_train_flops(B, T, H, layers, 1, 1, True)
        once = analytic_train_flops(B, T, H, layers, 1, 1, False)
        print("| cost analysis GFLOP | analytic, loop per trip | analytic, loop body once | cost analysis + the two "
              "loops' other trips (the roofline's count) |")
        print("|---|---|---|---|")
        print(f"| {r['flops'] / 1e9:.2f} | {per_trip / 1e9:.2f} | {once / 1e9:.2f} | {(r['flops'] + missing) / 1e9:.2f} |")


if __name__ == "__main__":
    main()
