"""Replay the bad-input probe: every kind of bad input or fault, against the CLIs as subprocesses.

A small workspace is built once (a b2t-synth tree of 2 sessions, its shards, a 2-step eager run,
a lexicon and an LM); each probe then copies what it breaks into its own folder, runs one
command (`b2t-preprocess`, `b2t-train`, `b2t-eval`, `b2t-import-baseline`, `b2t-report`,
`b2t-lm`) and classifies what happened:

    clear error        non-zero exit, no traceback, the message names what it must (file, key, line)
    accepted           exit 0 where accepting is the design (e.g. `lr: 1e-3`), and the result checks out
    traceback          a Python traceback reached the user
    internal error     the command said a bug in b2t stopped it (b2t.cli.rule), not the input
    silent             exit 0 although the input is bad, or a check of the result failed
    lost               something the user had (a model, a run, their own files) was destroyed
    hang               the command did not end within the probe's time limit
    nameless           a refusal whose message does not name the file or key it is about
    wrong refusal      a refusal of an input the design accepts
    skipped            the probe cannot run here (e.g. no tmpfs mount for the disk-full probes)

Everything runs on the CPU (eager backend, tiny config); about ten minutes on 2 cores.

    python -m tests.robustness.probe            # all probes, a table and the totals
    python -m tests.robustness.probe -k lm      # only probes whose name contains 'lm'
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click

from tests.robustness.data_cases import HDF5_PROBES, OUTPUT_AND_CONFIG_PROBES, SHARD_PROBES
from tests.robustness.fault_cases import CONCURRENCY_PROBES, HOST_PROBES, SIGNAL_PROBES
from tests.robustness.path_cases import FIFO_PROBES, OUTPUT_PROBES, SYNTH_PROBES
from tests.robustness.probe_base import MOUNTS, Probe, Skip, Workspace, argv, build_workspace, cli
from tests.robustness.run_cases import (
    CHECKPOINT_PROBES,
    DISK_PROBES,
    EVAL_PROBES,
    METRICS_AND_LM_PROBES,
    RUN_DIR_PROBES,
    RUN_PROBES,
)

PROBES = HDF5_PROBES + OUTPUT_AND_CONFIG_PROBES + SHARD_PROBES + RUN_PROBES + EVAL_PROBES + METRICS_AND_LM_PROBES + \
    DISK_PROBES + OUTPUT_PROBES + SYNTH_PROBES + FIFO_PROBES + RUN_DIR_PROBES + CHECKPOINT_PROBES + SIGNAL_PROBES + \
    CONCURRENCY_PROBES + HOST_PROBES


# --- running and judging ------------------------------------------------------------------------------

BAD = ("traceback", "internal error", "silent", "lost", "hang", "nameless", "wrong refusal")


def named(name: str, output: str) -> bool:
    """Whether `output` names `name` (a path counts when its file name is there)."""
    return name in output or ("/" in name and Path(name).name in output)


def judge(probe: Probe, returncode: int, output: str, names: list[str], problem: str | None,
          lost: str | None = None) -> str:
    if lost:
        return "lost"
    if "Traceback (most recent call last)" in output:
        return "traceback"
    if "internal error: " in output:
        return "internal error"
    if probe.expect == "ok":
        return "wrong refusal" if returncode != 0 else "silent" if problem else "accepted"
    if returncode == 0 or problem:
        return "silent"
    return "clear error" if all(named(n, output) for n in names) else "nameless"


def replay(ws: Workspace, probe: Probe, d: Path) -> tuple[str, str]:
    """(verdict, the message or the reason) of one probe, run in its own folder `d`."""
    d.mkdir(parents=True)
    try:
        args, names = probe.make(ws, d)
    except Skip as e:
        return "skipped", str(e)
    try:
        done = (probe.drive(argv(probe.cli, *args), d, probe, ws) if probe.drive
                else cli(probe.cli, *args, cwd=d, probe=probe))
    except subprocess.TimeoutExpired as e:
        return "hang", f"no exit after {e.timeout:.0f} s"
    finally:
        unmount(d)
    output = done.stdout + done.stderr
    problem = probe.check(d, output) if probe.check else None
    lost = probe.kept(d) if probe.kept else None
    verdict = judge(probe, done.returncode, output, names, problem, lost)
    lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
    message = (lost if verdict == "lost" else problem if problem and verdict == "silent"
               else (lines[-1] if lines else f"exit {done.returncode}"))
    if verdict == "nameless":
        message += f"  [does not name {[n for n in names if not named(n, output)]}]"
    return verdict, message


def unmount(below: Path) -> None:
    """Unmount the probes' small disks below `below`."""
    for mount in [m for m in MOUNTS if below in m.parents]:
        subprocess.run(["umount", str(mount)], capture_output=True)
        MOUNTS.remove(mount)


def replay_all(chosen: list[Probe], root: Path, jobs: int,
               on_row: Callable[[int, Probe, str, str], object] = lambda *_: None) -> list[tuple[str, str]]:
    """(verdict, message) of every probe in `chosen`, `jobs` at a time, in a workspace under `root`;
    `on_row(i, probe, verdict, message)` as soon as each is known, in order."""
    ws = build_workspace(root / "workspace")
    probes = Path(tempfile.mkdtemp(prefix="probes-", dir=root))
    results = []
    try:
        with ThreadPoolExecutor(jobs) as pool:
            for i, (verdict, message) in enumerate(pool.map(lambda ip: replay(ws, ip[1], probes / f"{ip[0]:03d}"),
                                                            enumerate(chosen))):
                results.append((verdict, message))
                on_row(i, chosen[i], verdict, message)
    finally:
        unmount(root)
    return results


@click.command()
@click.option("-k", "patterns", multiple=True, help="Only probes whose name contains this (repeatable: any of them).")
@click.option("--jobs", default=2, show_default=True, help="Probes run at once.")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Keep the workspace and every probe's folder here; a workspace a run left there is reused.")
def main(patterns: tuple[str, ...], jobs: int, workdir: Path | None) -> None:
    """Replay every bad-input probe against the CLIs; print a verdict table and the totals."""
    chosen = [p for p in PROBES if not patterns or any(k.lower() in p.name.lower() for k in patterns)]
    root = workdir or Path(tempfile.mkdtemp(prefix="b2t-probe-"))
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    width = max(len(p.name) for p in chosen)
    click.echo(f"{len(chosen)} probes, {jobs} at a time")

    def row(i: int, probe: Probe, verdict: str, message: str) -> None:
        click.echo(f"{i + 1:3d} {probe.cli:<19} {probe.name:<{width}}  "
                   f"{verdict.upper() if verdict in BAD else verdict:<13} {message[:150]}")

    try:
        results = replay_all(chosen, root, jobs, row)
    finally:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    totals = Counter(verdict for verdict, _ in results)
    order = ["clear error", "accepted", *BAD, "skipped"]
    click.echo(f"\n{len(results)} probes in {time.perf_counter() - t0:.0f} s: "
               + ", ".join(f"{totals.get(v, 0)} {v}" for v in order))
    if any(totals.get(v) for v in BAD):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
