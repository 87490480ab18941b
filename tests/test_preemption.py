"""SIGTERM and SIGINT are a preemption (`b2t.signals`): issue 35, cases 5 and 6, and the stop policy.

b2t-train keeps the step in flight in last.safetensors, says so and exits 128 + the signal;
`--resume` then gives the unbroken run's weights. Before the first step it stops at once
(nothing to keep). b2t-preprocess and other commands stop their workers and leave only
whole files. The in-process tests send the signal to the test process itself, inside the
policy the CLI installs; the others run the command as a subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from b2t import signals
from b2t.config import TINY_CONFIG, load_config
from b2t.engine.checkpoint import read_state
from b2t.train.loop import Run, RunOptions, train
from b2t.train.resume import resume_or_start

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "PJRT_DEVICE": "CPU"}
SETS = ["train.backend=eager", "train.steps=6", "train.log_every=2", "train.val_every=4",
        "train.checkpoint_every=4", "train.num_workers=0"]
OPTS = RunOptions(progress=False, device="cpu")


@pytest.fixture(scope="module")
def unbroken(tiny_dataset, tmp_path_factory) -> dict:
    return train(tiny_dataset[1], tmp_path_factory.mktemp("unbroken") / "run", load_config(TINY_CONFIG, SETS), OPTS)


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_05_a_signal_mid_run_keeps_the_step_in_flight_and_resume_is_exact(unbroken, tiny_dataset, tmp_path,
                                                                           monkeypatch, signum, code):
    """SIGTERM killed the run with exit 143, no word and no checkpoint (the steps since the last
    one lost); SIGINT said only "Aborted!". Here the signal arrives during step 3."""
    cfg, run = load_config(TINY_CONFIG, SETS), tmp_path / "run"
    step = Run.step

    def signalled_step(self, stream):
        if self.state.step == 2:
            os.kill(os.getpid(), signum)  # delivered at once, in the middle of step 3
        return step(self, stream)

    monkeypatch.setattr(Run, "step", signalled_step)
    with signals.installed("b2t-train"), pytest.raises(signals.Stopped) as stopped:
        train(tiny_dataset[1], run, cfg, OPTS)
    name = signal.Signals(signum).name
    assert stopped.value.line == f"stopped by {name} at step 3; `--resume` continues from 3 ({run / 'last.safetensors'})"
    assert stopped.value.exit_code == code
    assert read_state(run / "last.safetensors").step == 3
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {k: v for k, v in records[-1].items() if k not in ("time", "elapsed_s")} == {  # every record is timed
        "kind": "stopped", "step": 3, "signal": name}
    monkeypatch.undo()
    resumed = train(tiny_dataset[1], run, cfg, replace(OPTS, resume=True))
    assert resumed["weights_sha256"] == unbroken["weights_sha256"]


def test_a_signal_right_after_a_checkpoint_keeps_that_one(unbroken, tiny_dataset, tmp_path, monkeypatch):
    cfg, run = load_config(TINY_CONFIG, SETS), tmp_path / "run"
    checkpoint = Run.checkpoint
    written = []

    def counted(self):
        written.append(self.state.step)
        checkpoint(self)
        if self.state.step == 4:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(Run, "checkpoint", counted)
    with signals.installed("b2t-train"), pytest.raises(signals.Stopped, match="at step 4;"):
        train(tiny_dataset[1], run, cfg, OPTS)
    assert written == [4], "the step-4 checkpoint is not written twice"
    monkeypatch.undo()
    assert train(tiny_dataset[1], run, cfg, replace(OPTS, resume=True))["weights_sha256"] == unbroken["weights_sha256"]


def test_05_sigint_during_the_warm_up_stops_at_once_with_one_line(tiny_dataset, tmp_path):
    """Ctrl-C during the warm-up's compiles was swallowed by a gc callback (the run then trained to
    exit 0) or ended in torch's 114-line UnboundLocalError traceback."""
    run = tmp_path / "run"
    command = [sys.executable, "-c", "from b2t.launch import train; train()", str(tiny_dataset[1]), str(run),
               "--config", str(TINY_CONFIG), "--backend", "xla", "--no-progress", "--set", "train.steps=2"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        for line in proc.stdout:  # the device line comes just before the warm-up
            if line.startswith("device:"):
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "stopped by SIGINT during the warm-up, before step 1; nothing to keep", err
    assert "Traceback" not in err and "Exception ignored" not in err and "done:" not in out
    assert not (run / "last.safetensors").exists()
    cfg = load_config(TINY_CONFIG, ["train.steps=2"])
    assert resume_or_start(run, cfg, resume=False) is False, "nothing was trained: the same command starts again"


START_UP_SCRIPT = textwrap.dedent("""
    import importlib, os, signal
    import_module = importlib.import_module

    def preempted(name, *args):  # the signal lands while the command's modules import
        os.kill(os.getpid(), signal.SIGTERM)
        return import_module(name, *args)

    importlib.import_module = preempted
    from b2t import launch
    launch.train()
""")


def test_a_signal_during_the_start_up_imports_is_a_stop_with_one_line(tmp_path):
    """Seconds of imports come before the command's own policy; a SIGTERM there ended the
    process with Python's default (exit -15, no line). The console scripts enter through
    b2t.launch, whose policy is in place before those imports."""
    proc = subprocess.run([sys.executable, "-c", START_UP_SCRIPT, str(tmp_path / "ds"), str(tmp_path / "run")],
                          capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 143, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("stopped by SIGTERM; nothing partial is left"), proc.stderr
    assert not (tmp_path / "run").exists()


EXIT_SCRIPT = textwrap.dedent("""
    import atexit, os, signal, sys, threading, time
    from b2t import launch

    if sys.argv[1] == "thread":  # a thread that takes signals (torch_xla's runtime has several)
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    atexit.register(lambda: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(1)))  # while the process exits
    sys.argv = ["b2t-plan", "--help"]
    launch.plan()
""")


@pytest.mark.parametrize("threads", ["main", "thread"])
def test_a_signal_while_a_finished_command_exits_leaves_its_exit_code(threads):
    """Python's finalization puts the default handlers back, under which a command signalled in its
    last moments ended with exit -15 and no line (kill_resume: a SIGTERM as a finished run shut
    down); a console script ignores the signals once its command has returned, in every thread
    (blocked in the main thread only, a second thread took the signal: kill_resume --backend xla)."""
    proc = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, threads], capture_output=True, text=True, env=ENV,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Usage: b2t-plan" in proc.stdout and "stopped" not in proc.stderr


POLICY_SCRIPT = textwrap.dedent("""
    import multiprocessing, os, signal, sys, time
    from concurrent.futures import ProcessPoolExecutor
    from b2t import signals

    if __name__ == "__main__":
        with signals.installed("probe"):
            signals.describe_stop(lambda name: f"stopped by {name} in the test")
            signals.on_stop(lambda: print("cleaned up", flush=True))
            pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"),
                                       initializer=signals.ignore_stop_signals)
            with signals.spawning():  # each submit may start a worker
                list(pool.map(abs, range(4)))  # both are up
            print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)
            signals.defer()
            os.kill(os.getpid(), signal.SIGTERM)
            assert signals.pending() == signal.SIGTERM
            print("deferred", flush=True)
            os.killpg(0, signal.SIGINT) if sys.argv[1] == "group" else os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)
        print("not reached", flush=True)
""")


@pytest.mark.parametrize("second", ["self", "group"])
def test_a_second_signal_stops_at_once_and_kills_the_workers(tmp_path, second):
    """Deferred, the first signal waits for the loop (said in a line at once); a second one (here
    also sent to the whole group, as Ctrl-C is) stops at once: workers killed without tracebacks,
    cleanups run, one line."""
    (tmp_path / "policy.py").write_text(POLICY_SCRIPT)
    proc = subprocess.run([sys.executable, str(tmp_path / "policy.py"), second], capture_output=True, text=True,
                          env=ENV, timeout=120, start_new_session=True)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 130 and lines[1:] == ["deferred", "cleaned up"], (proc.stdout, proc.stderr)
    assert proc.stderr.splitlines() == [  # the first acknowledged at once, the second the stop
        "SIGTERM: stopping once the step in flight is kept; a second SIGTERM or Ctrl-C stops at once",
        "stopped by a second SIGINT in the test"], proc.stderr
    workers = [int(p) for p in lines[0].split()]
    assert len(workers) == 2 and not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                                         for p in workers)


SPAWN_SCRIPT = textwrap.dedent("""
    import multiprocessing, os, signal
    from concurrent.futures import ProcessPoolExecutor
    from b2t import signals

    if __name__ == "__main__":
        with signals.installed("probe"):
            signals.describe_stop(lambda name: f"stopped by {name} in the test")
            with signals.spawning():
                os.kill(os.getpid(), signal.SIGTERM)  # as if it came while a worker was starting
                pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"),
                                           initializer=signals.ignore_stop_signals)
                list(pool.map(abs, range(4)))  # each submit may start a worker
                print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)
            print("not reached", flush=True)
""")


def test_a_signal_while_workers_start_stops_once_they_are_known_and_kills_them(tmp_path):
    """CI caught b2t-preprocess's SIGTERM landing while a spawned worker was starting: the parent
    did not know that child yet, left it, and the child printed an EOFError traceback reading its
    start-up data from the closed pipe. In `spawning()` the stop waits for the block's end."""
    (tmp_path / "spawn.py").write_text(SPAWN_SCRIPT)
    proc = subprocess.run([sys.executable, str(tmp_path / "spawn.py")], capture_output=True, text=True, env=ENV,
                          timeout=120)
    assert proc.returncode == 143 and proc.stderr.splitlines() == ["stopped by SIGTERM in the test"], proc.stderr
    workers = [int(p) for p in proc.stdout.split()]
    assert len(workers) == 2 and "not reached" not in proc.stdout
    deadline = time.monotonic() + 30  # killed before the exit; init reaps them
    while any(psutil.pid_exists(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(psutil.pid_exists(p) for p in workers)


BOOTING_SCRIPT = textwrap.dedent("""
    import multiprocessing, os, signal
    from concurrent.futures import ProcessPoolExecutor
    from b2t import signals

    def mask():
        return sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))

    if __name__ == "__main__":
        with signals.installed("probe"):
            spawn = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(1, mp_context=spawn, initializer=signals.ignore_stop_signals) as pool:
                with signals.spawning():
                    child = spawn.Process(target=mask)
                    child.start()
                    os.kill(child.pid, signal.SIGINT)  # Ctrl-C while it is still importing its modules
                    in_worker = pool.submit(mask)  # starts the worker
                child.join(60)
                print(child.exitcode, mask(), in_worker.result(), flush=True)
""")


def test_a_child_started_while_spawning_never_sees_a_stop_signal(tmp_path):
    """make test-all caught a Ctrl-C to b2t-preprocess --workers 2 printing a worker's
    KeyboardInterrupt traceback: the group's signal reached the spawned child before its
    `ignore_stop_signals` ran. A child started in `spawning()` starts with both signals blocked
    (here one with no initializer, signalled at once, ends cleanly); a pool worker's initializer
    ignores them and unblocks them, and the parent's mask is back as it was."""
    (tmp_path / "booting.py").write_text(BOOTING_SCRIPT)
    proc = subprocess.run([sys.executable, str(tmp_path / "booting.py")], capture_output=True, text=True, env=ENV,
                          timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.strip().split(maxsplit=1) == ["0", "[] []"], (proc.stdout, proc.stderr)


def test_06_sigterm_to_preprocess_stops_its_workers_and_keeps_whole_shards(tiny_dataset, tmp_path):
    """The parent exited silently; its two workers (750 MB each) and the resource tracker stayed,
    blocked, after moving more shards into OUT."""
    hdf5 = tiny_dataset[0]
    out = tmp_path / "out"
    command = [sys.executable, "-c", "from preprocess.cli import main; main()", str(hdf5), str(out), "--config",
               str(TINY_CONFIG), "--workers", "2", "--no-progress", "--set", "data.batches_per_shard=1"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 120
    while len(parent.children()) < 3 and time.monotonic() < deadline:  # the tracker and 2 workers
        time.sleep(0.2)
    children = parent.children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("stopped by SIGTERM"), err
    psutil.wait_procs(children, timeout=30)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")], "no temp file left"
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=600)
    assert done.returncode == 0, done.stderr
    assert (out / "manifest.json").is_file()
