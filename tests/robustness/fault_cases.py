"""Probes of tests/robustness/probe.py on faults around a run: signals, a second process beside it, the
host's limits (file descriptors, memory, devices, numba's cache), numbers and data shapes.

A driver runs the probe's command its own way: `interrupted` sends SIGTERM or SIGINT once the
command has reached some point (then, for b2t-train, runs it again with --resume), `beside`
starts another b2t command first and judges the probe's command run while that one works.
The checks say whether anything was lost: a step beyond the one in flight, the weights of
the unbroken run, a worker left running, a dataset changed under its reader.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import psutil

from b2t.config import TINY_CONFIG
from tests.robustness.probe_base import (
    Case,
    Driver,
    Probe,
    Workspace,
    argv,
    command_env,
    copy,
    eval_args,
    preprocess_args,
    printed,
    sets,
    train_args,
)

LONG = ("train.steps=12", "train.log_every=1", "train.checkpoint_every=100", "train.val_every=100")
"""A run long enough to be stopped mid-way, with no checkpoint of its own before its end."""
Ready = Callable[[Path, "Running"], bool]


class Running:
    """A command started in the background, its output collected as it comes."""

    def __init__(self, cmd: list[str], d: Path, probe: Probe) -> None:
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=d,
                                     env=command_env(probe), errors="replace", start_new_session=True)
        self.started = time.monotonic()
        self.out: list[str] = []
        self.err: list[str] = []
        self.readers = [threading.Thread(target=lambda s=s, into=into: into.extend(s), daemon=True)
                        for s, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for t in self.readers:
            t.start()

    @property
    def text(self) -> str:
        return "".join(self.out) + "".join(self.err)

    def wait_until(self, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline and not ready():
            time.sleep(0.2)

    def finish(self, timeout: float) -> subprocess.CompletedProcess:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise
        for t in self.readers:
            t.join(timeout=10)
        return subprocess.CompletedProcess(self.cmd, self.proc.returncode, "".join(self.out), "".join(self.err))


def trained_to(step: int) -> Ready:
    """Ready once d/run/metrics.jsonl holds a train record at `step` or later."""
    def ready(d: Path, running: Running) -> bool:
        try:
            lines = (d / "run" / "metrics.jsonl").read_text().splitlines()
            return any(r.get("kind") == "train" and r.get("step", 0) >= step for r in map(json.loads, lines[:-1]))
        except (OSError, ValueError):
            return False
    return ready


def shown(text: str) -> Ready:
    return lambda d, running: text in running.text


def after(seconds: float) -> Ready:
    """Ready `seconds` after the command started (in its start-up: imports, reading the inputs)."""
    return lambda d, running: time.monotonic() - running.started >= seconds


def workers(n: int) -> Ready:
    """Ready once the command has `n` child processes (its pool's workers and resource tracker)."""
    def ready(d: Path, running: Running) -> bool:
        try:
            return len(psutil.Process(running.proc.pid).children(recursive=True)) >= n
        except psutil.NoSuchProcess:
            return False
    return ready


def holds_lock(name: str) -> Ready:
    """Ready once the lock file d/`name` names the command's pid (it holds that folder)."""
    def ready(d: Path, running: Running) -> bool:
        try:
            return f"pid {running.proc.pid} " in (d / name).read_text()
        except OSError:
            return False
    return ready


def interrupted(signum: int, when: Ready, *, again: bool = False, resume: bool = True, group: bool = False) -> Driver:
    """Start the command, send `signum` (to its process group with `group`, as Ctrl-C does) once
    `when` holds, with `again` a second one as soon as it acknowledged the first; the children it
    had then must not outlive it (d/children.json). With `resume`, a b2t-train that stopped is run again with --resume to
    its end (its output follows the first run's, then `[--resume exit N]`)."""
    def drive(cmd: list[str], d: Path, probe: Probe, ws: Workspace) -> subprocess.CompletedProcess:
        first = Running(cmd, d, probe)
        first.wait_until(lambda: when(d, first), probe.timeout)
        try:
            children = psutil.Process(first.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        for i in range(2 if again else 1):
            if i:  # two at once would be one: the second waits for the first's acknowledgement
                deadline = time.monotonic() + probe.timeout
                while (first.proc.poll() is None and "stopping once" not in first.text
                       and time.monotonic() < deadline):
                    time.sleep(0.005)
            if first.proc.poll() is None:  # (it may have ended before it was ready: judged as it ended)
                (os.killpg if group else os.kill)(first.proc.pid, signum)
        done = first.finish(probe.timeout)
        _, alive = psutil.wait_procs(children, timeout=20)
        (d / "children.json").write_text(json.dumps([p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE]))
        if not resume or done.returncode != 128 + signum:
            return done
        rerun = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, cwd=d, env=command_env(probe),
                               timeout=probe.timeout, errors="replace")
        return subprocess.CompletedProcess(cmd, done.returncode, done.stdout + rerun.stdout,
                                           done.stderr + rerun.stderr + f"\n[--resume exit {rerun.returncode}]")
    return drive


def beside(first: Callable[[Workspace, Path], list[str]], when: Ready) -> Driver:
    """Start the command line `first(ws, d)`, wait until `when` holds for it and pause it there
    (SIGSTOP: it keeps its locks and half-done work, as a slow run would), run the probe's own
    command to its end and judge that one; then let the first go on and stop it with SIGTERM
    (its exit code and output go to d/first.txt)."""
    def drive(cmd: list[str], d: Path, probe: Probe, ws: Workspace) -> subprocess.CompletedProcess:
        other = Running(first(ws, d), d, probe)
        other.wait_until(lambda: when(d, other), probe.timeout)
        os.killpg(other.proc.pid, signal.SIGSTOP)
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=d, env=command_env(probe),
                                  timeout=probe.timeout, errors="replace")
        finally:
            os.killpg(other.proc.pid, signal.SIGCONT)
            if other.proc.poll() is None:
                os.kill(other.proc.pid, signal.SIGTERM)
            ended = other.finish(probe.timeout)
            (d / "first.txt").write_text(f"exit {ended.returncode}\n{ended.stdout}{ended.stderr}")
    return drive


# --- checks ------------------------------------------------------------------------------------------

def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def stopped_at_its_step(d: Path, output: str) -> str | None:
    """The line names step N, the log's stop record says N (nothing lost but the step in flight),
    the --resume ran to its end, and its final weights are those of the unbroken run."""
    import re

    m = re.search(r"stopped by SIG\w+ at step (\d+); `--resume` continues from \1", output)
    if m is None:
        return "no 'stopped by ... at step N; `--resume` continues from N' line"
    stops = [r["step"] for r in _records(d / "run") if r["kind"] == "stopped"]
    if stops != [int(m.group(1))]:
        return f"stop records at steps {stops}, the line says {m.group(1)}"
    if "[--resume exit 0]" not in output:
        return "the --resume run did not finish"
    cmd = json.loads((d / "unbroken.json").read_text())
    subprocess.run(cmd, capture_output=True, cwd=d, env=command_env(None), timeout=900, check=True)
    unbroken = [r["weights_sha256"] for r in _records(d / "unbroken") if r["kind"] == "summary"]
    final = [r["weights_sha256"] for r in _records(d / "run") if r["kind"] == "summary"]
    return None if final == unbroken else "the resumed run's final weights differ from the unbroken run's"


def no_workers_left(d: Path, output: str) -> str | None:
    alive = json.loads((d / "children.json").read_text())
    temps = [p.name for p in (d / "out").glob(".*.tmp")] if (d / "out").is_dir() else []
    return f"processes left running: {alive}" if alive else f"temp files left in OUT: {temps}" if temps else None


def first_run_intact(d: Path) -> str | None:
    """The first trainer of a `beside` probe ended cleanly (done, or stopped by the SIGTERM) and
    logged each step once: the refused second one wrote nothing into its run."""
    text = (d / "first.txt").read_text()
    code = int(text.split()[1])
    if code not in (0, 143) or "Traceback" in text:
        return f"the first trainer ended with exit {code}"
    steps = [r["step"] for r in _records(d / "run") if r["kind"] == "train"]
    return None if len(steps) == len(set(steps)) else f"steps logged twice: {steps}"


def dataset_unchanged(d: Path) -> str | None:
    manifest = d / "shards" / "manifest.json"
    if manifest.is_file() and manifest.read_bytes() == (d / "manifest.before").read_bytes():
        return None
    return f"{manifest} was removed or rewritten while a run read the dataset"


# --- the probes ---------------------------------------------------------------------------------------

def long_run(*extra: str) -> Callable[[Workspace, Path], Case]:
    """A LONG b2t-train into d/run; the same command into d/unbroken is kept for the check."""
    def make(ws: Workspace, d: Path) -> Case:
        args = sets(*LONG, *extra)
        (d / "unbroken.json").write_text(json.dumps(argv("b2t-train", *train_args(ws.shards, d / "unbroken", *args))))
        return train_args(ws.shards, d / "run", *args), []
    return make


def _copy_dataset(ws: Workspace, d: Path) -> Path:
    shards = copy(ws.shards, d)
    (d / "manifest.before").write_bytes((shards / "manifest.json").read_bytes())
    return shards


def _trainer_on_the_copy(ws: Workspace, d: Path) -> list[str]:
    return argv("b2t-train", *train_args(d / "shards", d / "run", *sets(*LONG, "train.steps=400")))


def _rewriting_the_copy(ws: Workspace, d: Path) -> list[str]:
    return argv("b2t-preprocess", *preprocess_args(ws.src, d / "shards", "--overwrite",
                                                   *sets("data.seed=7", "data.epochs=8")))


def _xla_warm_up(ws: Workspace, d: Path) -> Case:
    return train_args(ws.shards, d / "run", "--backend", "xla", "--device", "xla:0"), ["nothing to keep"]


def _preprocess_workers(word: str) -> Callable[[Workspace, Path], Case]:
    return lambda ws, d: (preprocess_args(ws.src, d / "out", "--workers", "2", *sets("data.batches_per_shard=1")),
                          [word])


SIGNAL_PROBES = [
    Probe("SIGTERM mid-run, then --resume", "b2t-train", long_run(), drive=interrupted(signal.SIGTERM, trained_to(3)),
          check=stopped_at_its_step),
    Probe("SIGINT mid-run, then --resume", "b2t-train", long_run(), drive=interrupted(signal.SIGINT, trained_to(5)),
          check=stopped_at_its_step),
    Probe("Ctrl-C mid-run with 2 loader workers, then --resume", "b2t-train", long_run("train.num_workers=2"),
          drive=interrupted(signal.SIGINT, trained_to(4), group=True), check=stopped_at_its_step),
    Probe("SIGTERM during the warm-up's compiles (xla)", "b2t-train", _xla_warm_up,
          drive=interrupted(signal.SIGTERM, shown("device:"), resume=False)),
    Probe("Ctrl-C during the warm-up's compiles (xla, case 5)", "b2t-train", _xla_warm_up,
          drive=interrupted(signal.SIGINT, shown("device:"), resume=False, group=True)),
    Probe("SIGTERM in start-up (its imports)", "b2t-train",
          lambda ws, d: (train_args(ws.shards, d / "run"), ["stopped by SIGTERM"]),
          drive=interrupted(signal.SIGTERM, after(1), resume=False)),  # torch's import alone takes longer
    Probe("SIGTERM twice mid-run (the second stops at once)", "b2t-train",
          lambda ws, d: (train_args(ws.shards, d / "run", *sets(*LONG, "train.compute_dtype=bf16")),
                         ["stopped by a second SIGTERM"]),
          drive=interrupted(signal.SIGTERM, trained_to(3), again=True, resume=False)),
    Probe("SIGTERM to b2t-preprocess --workers 2 (case 6)", "b2t-preprocess", _preprocess_workers("stopped by SIGTERM"),
          drive=interrupted(signal.SIGTERM, workers(3), resume=False), check=no_workers_left),
    Probe("Ctrl-C to b2t-preprocess --workers 2", "b2t-preprocess", _preprocess_workers("stopped by SIGINT"),
          drive=interrupted(signal.SIGINT, workers(3), resume=False, group=True), check=no_workers_left),
    Probe("SIGTERM to b2t-eval --workers 2 while it decodes words", "b2t-eval",
          lambda ws, d: (eval_args(ws, ws.shards, "--lexicon", str(ws.lexicon), "--workers", "2", "--out",
                                   str(d / "eval")), ["stopped by SIGTERM"]),
          drive=interrupted(signal.SIGTERM, workers(3), resume=False), check=no_workers_left),
]

CONCURRENCY_PROBES = [
    Probe("a second b2t-train in a running run's directory (case 7)", "b2t-train",
          lambda ws, d: (_copy_dataset(ws, d) and train_args(d / "shards", d / "run"), [str(d / "run"), "in use"]),
          drive=beside(_trainer_on_the_copy, shown("device:")), kept=first_run_intact),
    Probe("b2t-preprocess --overwrite of a dataset a run reads (case 8)", "b2t-preprocess",
          lambda ws, d: (_copy_dataset(ws, d) and preprocess_args(ws.src, d / "shards", "--overwrite",
                                                                  *sets("data.seed=5")), [str(d / "shards"), "read"]),
          drive=beside(_trainer_on_the_copy, shown("device:")), kept=dataset_unchanged),
    Probe("b2t-train on a dataset b2t-preprocess is rewriting", "b2t-train",
          lambda ws, d: (_copy_dataset(ws, d) and train_args(d / "shards", d / "run"), [str(d / "shards")]),
          drive=beside(_rewriting_the_copy, holds_lock("shards/.b2t-preprocess.lock"))),
    Probe("b2t-eval on a dataset b2t-preprocess is rewriting", "b2t-eval",
          lambda ws, d: (_copy_dataset(ws, d) and eval_args(ws, d / "shards"), [str(d / "shards")]),
          drive=beside(_rewriting_the_copy, holds_lock("shards/.b2t-preprocess.lock"))),
]


# --- the host, numbers, data shapes ----------------------------------------------------------------

def _long_trial(ws: Workspace, d: Path) -> Path:
    """A copy of the source whose first train trial lasts 20,000 bins."""
    src = copy(ws.src, d)
    path = sorted(src.glob("*/data_train.hdf5"))[0]
    with h5py.File(path, "r+") as f:
        g = f["trial_0000"]
        del g["input_features"]
        g.create_dataset("input_features", data=np.zeros((20_000, 512), np.float32))
        g.attrs["n_time_steps"] = np.int64(20_000)
    return src


def _damaged_numba_cache(ws: Workspace, d: Path) -> Case:
    code = "from b2t.data.rows import compiled_checks; compiled_checks()"
    subprocess.run([sys.executable, "-c", code], env={**os.environ, "NUMBA_CACHE_DIR": str(d / "numba")}, check=True)
    for index in (d / "numba").rglob("*.nbi"):
        index.write_bytes(b"\x80\x04garbage")
    return ["verify", str(ws.shards)], []


def _linked_shard(ws: Workspace, d: Path) -> Case:
    shards = copy(ws.shards, d)
    shard = sorted(shards.glob("train-*.tar"))[0]
    (shards / "store").mkdir()
    shard.rename(shards / "store" / shard.name)
    shard.symlink_to(shards / "store" / shard.name)
    return train_args(shards, d / "run"), []


GiB = 1 << 30
HOST_PROBES = [
    Probe("ulimit -n 40 with 2 loader workers (case 16)", "b2t-train",
          lambda ws, d: (train_args(ws.shards, d / "run", *sets("train.num_workers=2")), ["ulimit -n"]),
          limits={resource.RLIMIT_NOFILE: 40}, timeout=300),
    Probe("--device cuda without CUDA (case 14)", "b2t-train",
          lambda ws, d: (train_args(ws.shards, d / "run", "--device", "cuda"), ["--device cuda"])),
    Probe("--device potato:3 (case 14)", "b2t-train",
          lambda ws, d: (train_args(ws.shards, d / "run", "--device", "potato:3"), ["potato:3"])),
    Probe("--device cpu with --backend xla", "b2t-train",
          lambda ws, d: (train_args(ws.shards, d / "run", "--backend", "xla"), ["--device cpu"])),
    Probe("b2t-eval --device cuda:3", "b2t-eval", lambda ws, d: (eval_args(ws, ws.shards, "--device", "cuda:3"),
                                                                 ["cuda:3"])),
    Probe("PJRT_DEVICE=TPU on a host without a TPU (case 15)", "b2t-train",
          lambda ws, d: (train_args(ws.shards, d / "run", "--backend", "openxla", "--device", "xla:0"),
                         ["PJRT_DEVICE=TPU"]), env={"PJRT_DEVICE": "TPU"}, timeout=120),
    Probe("no usable numba cache (case 13)", "b2t-preprocess", lambda ws, d: (["verify", str(ws.shards)], []),
          env={"NUMBA_CACHE_LOCATOR_CLASSES": "IPythonCacheLocator"}, expect="ok", check=printed("OK")),
    Probe("a damaged numba cache index (case 13)", "b2t-preprocess", _damaged_numba_cache, expect="ok",
          check=printed("OK")),
    Probe("out of memory: 4096 GRU units under ulimit -v 7 GiB (case 17)", "b2t-train",
          lambda ws, d: (train_args(ws.shards, d / "run", *sets("model.gru.n_units=4096")), ["out of memory"]),
          limits={resource.RLIMIT_AS: 7 * GiB}),
    Probe("one 20,000-bin trial with a token budget (case 18)", "b2t-preprocess",
          lambda ws, d: (preprocess_args(_long_trial(ws, d), d / "out", *sets("data.token_budget=4096")),
                         ["trial_0000", "data.token_budget"])),
    Probe("the same with --skip-bad", "b2t-preprocess",
          lambda ws, d: (preprocess_args(_long_trial(ws, d), d / "out", "--skip-bad", *sets("data.token_budget=4096")),
                         []), expect="ok",
          check=lambda d, out: None if "exclusions: 1" in out else "the long trial was not excluded"),
    Probe("--set data.seed=-1 (case 19)", "b2t-preprocess",
          lambda ws, d: (preprocess_args(ws.src, d / "out", *sets("data.seed=-1")), ["data.seed"])),
    Probe("--set train.seed=2**70 (case 19)", "b2t-plan",
          lambda ws, d: (["--config", str(TINY_CONFIG), *sets(f"train.seed={2**70}")], ["train.seed"])),
    Probe("--set data.batches_per_shard=10**30", "b2t-preprocess",
          lambda ws, d: (preprocess_args(ws.src, d / "out", *sets(f"data.batches_per_shard={10**30}")),
                         ["data.batches_per_shard"])),
    Probe("--set optim.lr=1e400", "b2t-plan",
          lambda ws, d: (["--config", str(TINY_CONFIG), *sets("optim.lr=1e400")], ["optim.lr"])),
    Probe("a shard linked to a file in a sub-folder (case 20)", "b2t-train", _linked_shard, expect="ok"),
]
