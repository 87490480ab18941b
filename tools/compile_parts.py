"""Where the TPU compile time of b2t's graphs goes: per part of the step, HLO instructions and
the TPU compiler's time.

Each case traces one graph of the trainer as `b2t-plan --target` does
(`b2t.plan.capture`), with every instruction tagged by the part of the step that traced it
(`hlo_parts.tagged`), compiles it with libtpu for the target with its per-kernel log on, and
prints one JSON line: instructions per part (and inside while-loop bodies), the compiler's
stage durations (HLO passes, backend, code generation), and per part the TPU kernels
(fusions) and the compiler-thread seconds spent on them (emission, LLO optimisation,
scheduling, bundle packing; several threads run at once, so these add up to more than the
backend stage's wall time). A case runs in a fresh process, against the b2t of `--repo`
(default this clone), so a main checkout and a branch can be measured alternately:

    python tools/compile_parts.py run --label after --config configs/tiny.yaml --shape 162,16,32
    python tools/compile_parts.py run --label before --repo /tmp/before --config configs/tiny.yaml --shape 162,16,32
    python tools/compile_parts.py table --labels before,after

Rows are appended to `--results` (JSON lines); `table` prints every case kept there.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[1]
DEBUG_ENV = {"XLA_IR_DEBUG": "1", "XLA_HLO_DEBUG": "1"}
# libtpu's logging: one line per compiled kernel from its compiler (a wildcard, as the file name
# carries a build prefix), to stderr
TPU_LOG_ENV = {"TPU_STDERR_LOG_LEVEL": "0", "TPU_MIN_LOG_LEVEL": "0", "TPU_VMODULE": "*compiler_base=1,hlo_pass_pipeline=1"}


@click.group()
@click.option("--results", type=click.Path(dir_okay=False, path_type=Path),
              default=REPO / "bench_out" / "compile_parts.jsonl", show_default=True,
              help="JSON lines of measured cases; `run` appends, `table` reads.")
@click.pass_context
def main(ctx: click.Context, results: Path) -> None:
    """Per-part HLO instruction counts and TPU compile time of b2t's graphs."""
    ctx.obj = results


def _case_options(f):
    for option in reversed((
        click.option("--config", required=True, help="b2t config (relative to --repo)."),
        click.option("--target", default="v5e-1", show_default=True),
        click.option("--mesh", default="", help="e.g. data=2,fsdp=4 (default: one chip)."),
        click.option("--shape", required=True, help="bucket T,B,L"),
        click.option("--kinds", default="train", show_default=True, help="train, eval or train,eval"),
        click.option("--days", default=45, show_default=True),
        click.option("--set", "overrides", multiple=True, help="config override key=value"),
    )):
        f = option(f)
    return f


@main.command()
@_case_options
@click.option("--label", required=True, help="Name of this measurement (e.g. before, after).")
@click.option("--repo", type=click.Path(file_okay=False, exists=True, path_type=Path), default=REPO,
              show_default=True, help="The b2t checkout whose graphs are measured.")
@click.option("--keep", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Keep the traced and optimized modules and libtpu's log here (default: a temporary folder).")
@click.pass_obj
def run(results: Path, label: str, repo: Path, keep: Path | None, **case) -> None:
    """Measure one case in a fresh process and append its rows to --results."""
    args = [sys.executable, __file__, "measure", "--config", case["config"], "--target", case["target"],
            "--mesh", case["mesh"], "--shape", case["shape"], "--kinds", case["kinds"], "--days", str(case["days"])]
    if keep is not None:
        args += ["--keep", str(keep.resolve())]
    for s in case["overrides"]:
        args += ["--set", s]
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    env = {**os.environ, **DEBUG_ENV, **TPU_LOG_ENV, "PYTHONPATH": f"{repo}{os.pathsep}{REPO}", "PJRT_DEVICE": "CPU"}
    t0 = time.perf_counter()
    out = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not rows:
        tail = " | ".join(out.stderr.strip().splitlines()[-4:])
        raise click.ClickException(f"case {case['config']} {case['shape']} failed (exit {out.returncode}): {tail}")
    results.parent.mkdir(parents=True, exist_ok=True)
    with results.open("a") as f:
        for r in rows:
            f.write(json.dumps({"label": label, "commit": commit, "case_wall_s": time.perf_counter() - t0, **r}) + "\n")
    for r in rows:
        click.echo(format_case({"label": label, "commit": commit, **r}))


@main.command(hidden=True)
@_case_options
@click.option("--keep", type=click.Path(file_okay=False, path_type=Path), default=None)
def measure(config: str, target: str, mesh: str, shape: str, kinds: str, days: int, overrides: tuple[str, ...],
            keep: Path | None) -> None:
    """(In the fresh process `run` starts.) Trace, tag, compile and print one JSON line per kind."""
    from b2t.config import load_config
    from b2t.contract import BucketShape
    from b2t.engine.mesh import parse_devices
    from b2t.plan.capture import prepare_process, trace, trace_backend
    from b2t.plan.compiler import compile_for
    from b2t.plan.targets import parse_target

    hlo_parts = _this_clones_hlo_parts()

    t = parse_target(target)
    mesh_cfg = parse_devices(None, mesh) if mesh else None
    sets = (*overrides, *((f"mesh.data={mesh_cfg.data}", f"mesh.fsdp={mesh_cfg.fsdp}") if mesh_cfg else ()))
    cfg = load_config(Path(config), sets)
    T, B, L = (int(x) for x in shape.split(","))
    with tempfile.TemporaryDirectory(prefix="b2t-parts-") as tmp:
        dump = Path(tmp) if keep is None else keep
        dump.mkdir(parents=True, exist_ok=True)
        prepare_process(t.chips, dump)
        os.environ["XLA_FLAGS"] += " --xla_dump_hlo_as_text"  # libtpu reads them too: its optimized module
        backend = trace_backend(mesh_cfg)
        for kind in kinds.split(","):
            with hlo_parts.tagged():
                (graph,) = trace(cfg, days, backend, kind, BucketShape(T=T, B=B, L=L), dump)  # xla: one graph
            traced = _newest(dump, "module_*.before_optimizations.txt", exclude="cl_")
            counts = hlo_parts.count(traced.read_text())
            log = dump / f"tpu-{kind}.log"
            cpu0 = time.process_time()
            compiled = _logged(log, lambda: compile_for(t, graph.hlo, graph.donors))
            cpu = time.process_time() - cpu0  # every compiler thread's: steadier than wall time on a busy host
            optimized = _newest(dump, "module_*cl_*.after_optimizations.txt")
            backend_log = hlo_parts.backend_seconds(log.read_text())
            owners = hlo_parts.kernel_parts(optimized.read_text()) if optimized else {}
            seconds, kernels, llo = collections.Counter(), collections.Counter(), collections.Counter()
            for k, s in backend_log.kernels.items():
                p = owners.get(k, "unattributed")
                seconds[p] += s
                kernels[p] += 1
                llo[p] += backend_log.llo.get(k, 0)
            top = sorted(backend_log.kernels.items(), key=lambda kv: -kv[1])[:12]
            print(json.dumps({
                "config": config, "target": target, "mesh": mesh or "one chip", "kind": kind, "T": T, "B": B,
                "instructions": counts.instructions, "while_loops": counts.loops,
                "parts": {p: {"instructions": n, "in_loops": counts.in_loops[p], "kernels": kernels[p],
                              "kernel_s": round(seconds[p], 2), "llo": llo[p]}
                          for p, n in counts.total.items()}
                         | {p: {"instructions": 0, "in_loops": 0, "kernels": kernels[p], "kernel_s": round(seconds[p], 2),
                                "llo": llo[p]} for p in seconds if p not in counts.total},
                "stages_s": backend_log.stages, "compiler_threads": backend_log.threads,
                "passes_s": dict(sorted(((k, round(v, 2)) for k, v in backend_log.passes.items()), key=lambda kv: -kv[1])[:15]),
                "compile_s": compiled.seconds, "compile_cpu_s": cpu, "fits": compiled.fits, "trace_s": graph.trace_s,
                "load_avg": os.getloadavg()[0],
                "top_kernels": [[k, round(s, 2), owners.get(k, "unattributed"), backend_log.llo.get(k, 0)]
                                for k, s in top],
                "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,
            }), flush=True)


def _this_clones_hlo_parts():
    """tools/hlo_parts.py beside this file, whatever `tools` the measured checkout (--repo) has."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("b2t_tools_hlo_parts", Path(__file__).with_name("hlo_parts.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _newest(directory: Path, pattern: str, exclude: str = "") -> Path | None:
    files = [p for p in directory.glob(pattern) if not exclude or exclude not in p.name]
    return max(files, key=lambda p: p.stat().st_mtime) if files else None


def _logged(log: Path, fn):
    """`fn()` with this process's stderr (where libtpu logs) written to `log`."""
    sys.stderr.flush()
    saved = os.dup(2)
    with log.open("w") as f:
        os.dup2(f.fileno(), 2)
        try:
            return fn()
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def format_case(r: dict) -> str:
    """One case as a markdown table, parts by compiler-thread seconds."""
    st = r["stages_s"]
    head = (f"{r['label']} ({r['commit']}): {Path(r['config']).stem} {r['kind']} T={r['T']} B={r['B']} on {r['target']} "
            f"{r['mesh']}: {r['instructions']} HLO instructions, {r['while_loops']} while-loops; compile "
            f"{r['compile_s']:.0f} s, {r.get('compile_cpu_s', 0):.0f} s of CPU (HLO passes {st.get('HLO_PASSES', 0):.1f}, "
            f"backend {st.get('BACKEND_PASSES', 0):.1f}, "
            f"code generation {st.get('CODE_GENERATION', 0):.1f}; {r['compiler_threads']} compiler threads)")
    lines = [head, "", "| part | HLO instructions | in loop bodies | TPU kernels | compiler-thread s | LLO instructions |",
             "|---|---|---|---|---|---|"]
    parts = sorted(r["parts"].items(), key=lambda kv: (-kv[1]["kernel_s"], -kv[1]["instructions"]))
    for name, p in parts:
        lines.append(f"| {name} | {p['instructions']} | {p['in_loops']} | {p['kernels']} | {p['kernel_s']:.1f} | "
                     f"{p['llo']} |")
    passes = ", ".join(f"{name} {sec:.1f}" for name, sec in list(r.get("passes_s", {}).items())[:8])
    head += f"\n\nslowest passes, seconds summed over their calls: {passes}" if passes else ""
    lines[0] = head
    total = sum(p["kernel_s"] for p in r["parts"].values())
    lines.append(f"| total | {r['instructions']} | {sum(p['in_loops'] for p in r['parts'].values())} | "
                 f"{sum(p['kernels'] for p in r['parts'].values())} | {total:.1f} | "
                 f"{sum(p['llo'] for p in r['parts'].values())} |")
    return "\n".join(lines)


def compare(rows: list[dict], labels: list[str]) -> str:
    """Cases measured under several labels side by side: instructions and compiler-thread seconds per part."""
    by = {r["label"]: r for r in rows}
    names = sorted({p for r in rows for p in r["parts"]}, key=lambda p: -max(r["parts"].get(p, {}).get("kernel_s", 0)
                                                                                 for r in rows))
    r0 = rows[0]
    lines = [f"{Path(r0['config']).stem} {r0['kind']} T={r0['T']} B={r0['B']} on {r0['target']} {r0['mesh']}", "",
             "| part | " + " | ".join(f"{lab} instructions | {lab} compiler-thread s" for lab in labels) + " |",
             "|---|" + "---|---|" * len(labels)]
    for name in names:
        cells = []
        for lab in labels:
            p = by[lab]["parts"].get(name, {})
            cells += [str(p.get("instructions", 0)), f"{p.get('kernel_s', 0):.1f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    cells = []
    for lab in labels:
        cells += [str(by[lab]["instructions"]), f"{sum(p['kernel_s'] for p in by[lab]['parts'].values()):.1f}"]
    lines.append("| total | " + " | ".join(cells) + " |")
    cells = []
    for lab in labels:
        cells += [str(sum(p["llo"] for p in by[lab]["parts"].values())),
                  f"{by[lab]['compile_s']:.0f} s ({by[lab].get('compile_cpu_s', 0):.0f} s CPU)"]
    lines.append("| LLO instructions; compile wall (CPU) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


@main.command()
@click.option("--labels", default="", help="Comma-separated labels to put side by side (default: each case alone).")
@click.pass_obj
def table(results: Path, labels: str) -> None:
    """Print the kept cases: each alone, or the same case under several labels side by side."""
    if not results.exists():
        raise click.ClickException(f"no results at {results}: measure a case with `run` first")
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    if not labels:
        for r in rows:
            click.echo(format_case(r) + "\n")
        return
    wanted = labels.split(",")
    cases: dict[tuple, dict[str, dict]] = collections.defaultdict(dict)
    for r in rows:
        key = (r["config"], r["target"], r["mesh"], r["kind"], r["T"], r["B"])
        if r["label"] in wanted:
            cases[key][r["label"]] = r  # the latest row of each label
    for key, by in cases.items():
        if all(lab in by for lab in wanted):
            click.echo(compare([by[lab] for lab in wanted], wanted) + "\n")


if __name__ == "__main__":
    main()
