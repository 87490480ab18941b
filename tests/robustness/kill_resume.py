"""kill -9 (or SIGTERM) at random points during b2t-train, rerun the same command, compare the final weights.

One uninterrupted run gives the reference `weights_sha256` (from its summary record in
metrics.jsonl). Then, per try, a fresh run directory: the command is started and stopped
with the signal at a random moment one or two times (`stop_moment`: a fifth of them during the
process's start-up, before the run's first record; two fifths after that record, over 90% of the
reference's run time, so they land in the warm-up, steps, checkpoint writes and validation,
however long the imports take on a loaded machine; two fifths over its steps alone, after the
reference's warm-up, which on the XLA device is most of a short run), then
rerun with `--resume` until it finishes; a try passes when its final weights hash equals
the reference. The command is the same every time (`--resume` also starts from scratch
when the stop came before the first checkpoint). Tiny config on the CPU: the eager backend,
or with `--backend xla`/`openxla` the XLA CPU device (PJRT_DEVICE=CPU; every run compiles its
graphs again, so a try takes minutes).

`--signal term` is a preemption (b2t.signals): each stopped run must exit 143 saying
`stopped by SIGTERM at step N` with last.safetensors at step N (the step in flight kept:
nothing lost), or that it stopped before its first step with nothing to keep.

    python -m tests.robustness.kill_resume --tries 10
    python -m tests.robustness.kill_resume --tries 10 --backend xla --signal term
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import click

from b2t.config import TINY_CONFIG
from b2t.engine.checkpoint import read_state
from b2t.run_dir import RunDir

TRAIN = "from b2t.launch import train; train()"  # as the b2t-train script starts
SETS = ("train.steps=40", "train.checkpoint_every=7", "train.log_every=5", "train.val_every=20",
        "optim.warmup_steps=5", "optim.decay_steps=40")


def make_dataset(work: Path) -> Path:
    from b2t.config import load_config
    from preprocess.synth import SynthSpec, write_dataset
    from preprocess.writer import prepare_dataset

    write_dataset(SynthSpec(sessions=2, train_trials=24, val_trials=6, test_trials=0, seed=1), work / "hdf5")
    cfg = load_config(TINY_CONFIG, ["data.batch_size=8", "data.epochs=1"])
    prepare_dataset(work / "hdf5", work / "shards", cfg, splits=("train", "val"), progress=False)
    return work / "shards"


def command(shards: Path, run: Path, resume: bool, backend: str) -> list[str]:
    sets = [a for s in SETS for a in ("--set", s)]
    device = ["--device", "cpu"] if backend == "eager" else []  # the XLA backends take the XLA CPU device
    return [sys.executable, "-c", TRAIN, str(shards), str(run), "--config", str(TINY_CONFIG), "--backend", backend,
            *device, "--no-progress", *sets, *(["--resume"] if resume else [])]


def records(run: Path) -> list[dict]:
    """The run's complete records (a line being written is left out)."""
    files = RunDir(run)
    return files.scan()[0] if files.metrics.exists() else []


def final_digest(run: Path) -> str | None:
    summaries = [r for r in records(run) if r.get("kind") == "summary"]
    return summaries[-1]["weights_sha256"] if summaries else None


def layouts(run: Path) -> int:
    """How many runs have started in `run` (each writes a layout record first)."""
    return sum(r.get("kind") == "layout" for r in records(run))


def stop_moment(rng: random.Random, startup: float, run_time: float, warm_up: float) -> tuple[bool, float]:
    """(after the run's first record?, delay): a fifth of the stops in the start-up (imports,
    config, data checks), two fifths over the run itself from its first record, two fifths over
    its steps (from the end of the reference's warm-up, `warm_up` seconds into its run)."""
    draw, end = rng.random(), 0.9 * run_time
    if draw < 0.2:
        return False, rng.uniform(0.0, startup)
    return True, rng.uniform(0.0 if draw < 0.6 else min(warm_up, end), end)


def wait_for_start(proc: subprocess.Popen, run: Path, before: int) -> None:
    """Until the run's first record is written (or the process has ended)."""
    while proc.poll() is None and layouts(run) <= before:
        time.sleep(0.05)


STOPPED = re.compile(r"stopped by SIGTERM at step (\d+); `--resume` continues from \1")


def preempted(proc: subprocess.Popen, run: Path, moment: str) -> str:
    """SIGTERM `proc` (`moment`, in words) and check the stop: exit 143 and a line that the step in
    flight was kept (its step in last.safetensors) or that it stopped before its first step; what
    it kept, in words."""
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=600)
    if proc.returncode == 0:
        return "finished first"
    last = err.strip().splitlines()[-1] if err.strip() else ""
    if proc.returncode != 143:
        raise SystemExit(f"exit {proc.returncode} after SIGTERM {moment}, not 143; {len(records(run))} records "
                         f"in the run:\n{err[-2000:]}")
    if "during the warm-up" in last or last.startswith("stopped by SIGTERM; nothing partial"):
        return "before its first step: nothing to keep"
    m = STOPPED.search(last)
    last = RunDir(run).last
    kept = read_state(last).step if last.exists() else None
    if m is None or kept != int(m.group(1)):
        raise SystemExit(f"the stop line is {last!r}, last.safetensors holds step {kept}")
    return f"kept step {kept}"


def when(started: bool, delay: float) -> str:
    return f"{delay:.1f}s {'into the run' if started else 'after launch'}"


def run_to_end(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[3:5])}: exit {done.returncode}\n{done.stderr[-2000:]}")


def stop_and_resume(tries: int, seed: int, backend: str, how: str, echo: Callable[[str], object] = print) -> int:
    """How many of `tries` stopped-and-resumed runs end with the unbroken run's weights (see the
    module docstring); each try's stops and outcome are `echo`ed."""
    os.environ.setdefault("PJRT_DEVICE", "CPU")  # the runs inherit it
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shards = make_dataset(work)
        t0 = time.perf_counter()
        run_to_end(command(shards, work / "reference", resume=False, backend=backend))
        wall = time.perf_counter() - t0
        reference = final_digest(work / "reference")
        kept = records(work / "reference")
        run_time = kept[-1]["elapsed_s"]
        warm_up = next((r["elapsed_s"] for r in kept if r.get("kind") == "compile"), 0.0)
        startup = max(wall - run_time, 0.0)
        echo(f"{backend}: reference {wall:.1f} s uninterrupted ({startup:.1f} s start-up, {run_time:.1f} s run), "
                   f"weights_sha256 {reference[:16]}...")
        same, killed = 0, 0
        for i in range(tries):
            run = work / f"try{i}"
            kills = []
            for _ in range(rng.choice((1, 2))):
                started, delay = stop_moment(rng, startup, run_time, warm_up)
                moment = when(started, delay)
                before = layouts(run)
                proc = subprocess.Popen(command(shards, run, resume=run.exists(), backend=backend),
                                        stdout=subprocess.DEVNULL, text=True,
                                        stderr=subprocess.PIPE if how == "term" else subprocess.DEVNULL)
                if started:
                    wait_for_start(proc, run, before)
                try:
                    proc.wait(timeout=delay)
                except subprocess.TimeoutExpired:
                    if how == "term":
                        kills.append(f"{moment} ({preempted(proc, run, moment)})")
                        continue
                    proc.kill()  # SIGKILL
                    proc.wait()
                    had = sorted(p.name for p in run.glob("*.safetensors")) if run.exists() else []
                    kills.append(f"{moment} ({', '.join(had) or 'no checkpoint'})")
            run_to_end(command(shards, run, resume=True, backend=backend))
            digest = final_digest(run)
            same += digest == reference
            killed += bool(kills)
            echo(f"try {i + 1}: {'killed' if how == 'kill' else 'SIGTERM'} at "
                       f"{'; '.join(kills) or 'never (finished first)'} -> "
                       f"{'identical' if digest == reference else f'DIFFERENT {digest}'}")
            shutil.rmtree(run)
    echo(f"{same}/{tries} reruns gave the reference's final weights ({killed} of the tries were stopped at "
         "least once)")
    return same


@click.command()
@click.option("--tries", default=10, show_default=True)
@click.option("--seed", default=0, show_default=True, help="Seeds the kill delays.")
@click.option("--backend", type=click.Choice(["eager", "xla", "openxla"]), default="eager", show_default=True,
              help="The training backend of every run.")
@click.option("--signal", "how", type=click.Choice(["kill", "term"]), default="kill", show_default=True,
              help="kill: SIGKILL (kill -9); term: SIGTERM, a preemption whose stop is checked too.")
def main(tries: int, seed: int, backend: str, how: str) -> None:
    if stop_and_resume(tries, seed, backend, how, click.echo) != tries:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
