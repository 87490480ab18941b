"""What SIGTERM and SIGINT do to a b2t command: a preemption, said in one line, never a traceback.

A TPU spot VM is preempted with SIGTERM (SIGKILL follows some 30 s later); Ctrl-C sends
SIGINT to the whole foreground process group. Python's defaults lost work or made noise:
SIGTERM killed b2t-train with no checkpoint and no word, and b2t-preprocess's parent alone,
its workers left running; SIGINT raised KeyboardInterrupt wherever the main thread was,
inside dynamo's tracer (a 114-line traceback) or a gc callback (swallowed: the run went on).

The one policy, installed by every b2t command (`b2t.cli.rule.Command`; a console script's
`b2t.launch` installs it before the command's seconds of imports):
- By default a signal stops the command at once, at the next Python instruction of the
  main thread: child processes are killed, the command's `cleanup`s run (b2t-preprocess
  removes its temp files), one line says what was stopped and what is kept, and the process
  exits 128 + the signal number (143 for SIGTERM, 130 for SIGINT). Every b2t output is
  written atomically, so stopping anywhere leaves old files or whole new ones.
- Once `defer()` was called (b2t-train, before its first step) a signal is only recorded
  and acknowledged in a line: the loop asks `pending()` after each step, keeps its work (a
  checkpoint) and raises `Stopped`, whose line and exit code the command prints and returns. A second signal
  stops at once. (A signal recorded after the loop's last check, while the run finishes,
  lets it finish.)
- While a command starts processes (`spawning()`), a signal waits for the block's end: one
  that arrived mid-start left a spawned child unknown to the parent, which then read its
  start-up data from a closed pipe and printed a traceback; and a child started there has the
  signals blocked until it ignores them.
Child processes ignore both signals and are stopped by their parent: forked ones (the
loader's workers) inherit the handler, which does nothing outside the process that
installed it; spawned pools call `ignore_stop_signals` first. Pools are `concurrent.futures`
executors, which leave a killed worker dead: a `multiprocessing.Pool` starts a replacement,
which a stop's exit left reading its start-up data from a closed pipe (an EOFError traceback).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing import resource_tracker
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_code(signum: int) -> int:
    """The shell's code for a process ended by `signum` (143 for SIGTERM, 130 for SIGINT)."""
    return 128 + signum


class Stopped(Exception):
    """A command stopped by a signal after keeping its work; `line` says so, `exit_code` ends it."""

    def __init__(self, signum: int, line: str) -> None:
        super().__init__(line)
        self.signum, self.line = signum, line

    @property
    def exit_code(self) -> int:
        return exit_code(self.signum)


class _Policy:
    """The installed handler's state (one per process: signal handlers are process-wide)."""

    def __init__(self, command: str) -> None:
        self.pid = os.getpid()
        self.command = command
        self.now: Callable[[str], str] = lambda name: (f"stopped by {name}; nothing partial is left (outputs are "
                                                       "written whole or not at all): run the same command again")
        self.cleanups: list[Callable[[], object]] = []
        self.deferring = False
        self.pending: int | None = None
        self.spawning = 0  # depth of `spawning()` blocks
        self.held: int | None = None  # a signal that arrived in one, acted on at its end

    def handle(self, signum: int, frame: object) -> None:
        if os.getpid() != self.pid:  # a forked child: its parent stops it
            return
        if self.spawning and self.held is None:
            self.held = signum
            return
        if self.deferring and self.pending is None:
            self.pending = signum
            name = signal.Signals(signum).name  # said now: a long step would otherwise leave it unanswered
            _say(f"{name}: stopping once the step in flight is kept; a second SIGTERM or Ctrl-C stops at once")
            return
        self.stop_now(signum)

    def stop_now(self, signum: int) -> None:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # torch's loader raises from SIGCHLD when a worker dies
        for child in multiprocessing.active_children():  # not joined: a pool would start new workers meanwhile
            child.kill()
        for cleanup in self.cleanups:
            try:
                cleanup()
            except Exception:  # noqa: BLE001 - a failed cleanup must not turn the stop into a traceback
                pass
        name = signal.Signals(signum).name
        line = self.now(name if self.pending is None else f"a second {name}")
        try:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
        except Exception:  # noqa: BLE001 - a write the signal interrupted: the line below goes unbuffered
            pass
        _say(line)
        os._exit(exit_code(signum))


def _say(line: str) -> None:
    """`line` on stderr in one unbuffered write (safe in a signal handler), past a progress bar's line."""
    lead = "\n" if sys.stderr.isatty() else ""
    os.write(2, f"{lead}{line}\n".encode())


_policy: _Policy | None = None

_TRACKER_NOISE = "ignore:resource_tracker:UserWarning"
"""A `-W` option for the interpreters multiprocessing starts (they take sys.warnoptions): after
an immediate stop its resource tracker removes the stopped pool's semaphores, as it should,
and warns of "leaked semaphore objects" while it does, which reads as a failure."""


def _install(command: str) -> dict[int, Any] | None:
    """Install the policy (the handlers it replaced), or None where one is in place already or
    this is not the main thread (only the main thread may set handlers)."""
    global _policy
    if _policy is not None or threading.current_thread() is not threading.main_thread():
        return None
    _policy = _Policy(command)
    if _TRACKER_NOISE not in sys.warnoptions:
        sys.warnoptions.append(_TRACKER_NOISE)
    return {s: signal.signal(s, _policy.handle) for s in STOP_SIGNALS}


def install(command: str) -> None:
    """The stop policy for the rest of this process (a console script's, `b2t.launch`)."""
    _install(command)


def hold() -> None:
    """From here on SIGTERM and SIGINT are ignored, by every thread, to the process's exit: for a
    command that has finished its work, so its exit code is its own. Python's finalization puts
    the default handlers back (except an ignored one), under which a signal in the last moments
    of the exit ended a finished command with exit -15 and no line; blocking the signals covered
    only the main thread, and torch_xla's threads took one (kill_resume --backend xla)."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)


@contextmanager
def installed(command: str) -> Iterator[None]:
    """The stop policy for the block (the whole of a command's run); nested calls keep the
    outer one, and the previous handlers come back at the end. A no-op off the main thread."""
    global _policy
    previous = _install(command)
    if previous is None:
        yield
        return
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _policy = None


def describe_stop(now: Callable[[str], str]) -> None:
    """The line an immediate stop prints from here on: `now(signal name)`."""
    if _policy is not None:
        _policy.now = now


def on_stop(cleanup: Callable[[], object]) -> None:
    """Run `cleanup` when a signal stops the command at once (after its children are killed)."""
    if _policy is not None:
        _policy.cleanups.append(cleanup)


def defer() -> None:
    """From here to the end of the command a signal is recorded, not acted on (see `pending`);
    a second one stops at once."""
    if _policy is not None:
        _policy.deferring = True


def pending() -> int | None:
    """The signal received since `defer()` and not yet acted on, or None."""
    return None if _policy is None else _policy.pending


@contextmanager
def spawning() -> Iterator[None]:
    """A block that starts child processes: a signal arriving in it is acted on at its end, once
    every child it started is one `multiprocessing` knows (and a stop kills). A second signal
    acts at once, as always.

    The block's thread blocks the stop signals, so a child it starts has them blocked until its
    `ignore_stop_signals`: Ctrl-C reaches the whole group, and a spawned child still importing
    its modules printed a KeyboardInterrupt traceback (CPython's resource tracker is started so
    too). The parent gets a signal that came meanwhile at the block's end, or, taken by another
    of its threads, at once (then held as above)."""
    policy = _policy
    if policy is None or os.getpid() != policy.pid:
        yield
        return
    outermost = not policy.spawning
    if outermost:  # children inherit the mask: blocked from their first instruction
        resource_tracker.ensure_running()  # its start unblocks both signals after it: not in the block
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    policy.spawning += 1
    try:
        yield
    finally:
        policy.spawning -= 1
        if outermost:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # one that waited is handled now
            if policy.held is not None:
                held, policy.held = policy.held, None
                policy.handle(held, None)


def ignore_stop_signals() -> None:
    """For a worker process: SIGTERM and SIGINT do nothing (its parent stops it). A spawned
    pool's initializer, since Ctrl-C reaches every process of the terminal's group."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # as `spawning()` started it: one that waited is dropped
