"""The shared parts of tests/robustness/probe.py: its workspace, the Probe record and the command helpers."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from b2t.config import TINY_CONFIG

BIN = Path(sys.executable).parent
DATA_SETS = ("data.batch_size=8", "data.epochs=1", "data.batches_per_shard=2")
TRAIN_SETS = (*DATA_SETS, "train.steps=2", "train.log_every=1", "train.val_every=2", "train.checkpoint_every=1")


@dataclass(frozen=True)
class Workspace:
    root: Path
    src: Path  # b2t-synth tree, 2 sessions
    shards: Path  # its b2t-preprocess output (DATA_SETS)
    shards_seed1: Path  # the same trials batched with data.seed=1
    run: Path  # 2 eager steps on `shards`: last/best.safetensors, metrics.jsonl
    lexicon: Path
    lm: Path


Case = tuple[list[str], list[str]]  # (the command's arguments, what its message must name)
Driver = Callable[[list[str], Path, "Probe", Workspace], subprocess.CompletedProcess]
"""Runs a probe's command its own way (signals, a second process beside it): (argv, folder, probe, workspace)."""


@dataclass(frozen=True)
class Probe:
    name: str
    cli: str
    make: Callable[[Workspace, Path], Case]  # builds the bad input under its own folder
    expect: str = "error"  # "error": a clear refusal; "ok": accepted by design
    check: Callable[[Path, str], str | None] | None = None  # (folder, output) -> what went wrong, or None
    kept: Callable[[Path], str | None] | None = None  # folder -> what valuable was destroyed, or None
    drive: Driver | None = None  # default: run the command once and wait
    env: dict[str, str] = field(default_factory=dict)  # added to the command's environment
    limits: dict[int, int] = field(default_factory=dict)  # resource.RLIMIT_* -> soft and hard limit
    timeout: float = 900  # seconds until the command is judged to hang


def sets(*items: str) -> list[str]:
    return [a for s in items for a in ("--set", s)]


def command_env(probe: Probe | None = None) -> dict[str, str]:
    return {**os.environ, "PJRT_DEVICE": "CPU", "COLUMNS": "200", **(probe.env if probe else {})}


def limited(probe: Probe | None) -> Callable[[], None] | None:
    """A preexec_fn applying the probe's resource limits in the child (None when it sets none)."""
    if probe is None or not probe.limits:
        return None

    def apply() -> None:
        for kind, value in probe.limits.items():
            resource.setrlimit(kind, (value, value))
    return apply


def argv(name: str, *args: object) -> list[str]:
    return [str(BIN / name), *map(str, args)]


def cli(name: str, *args: object, cwd: Path | None = None, check: bool = False,
        probe: Probe | None = None) -> subprocess.CompletedProcess:
    """Run b2t command `name` to its end (subprocess.TimeoutExpired past the probe's timeout)."""
    done = subprocess.run(argv(name, *args), capture_output=True, text=True, cwd=cwd, env=command_env(probe),
                          timeout=probe.timeout if probe else 900, errors="replace", preexec_fn=limited(probe))
    if check and done.returncode != 0:
        raise SystemExit(f"{name} {' '.join(map(str, args))}: exit {done.returncode}\n{done.stdout}{done.stderr}")
    return done


def build_workspace(root: Path) -> Workspace:
    """The workspace in `root`, built unless a complete one is there (its LM is written last)."""
    from b2t.words.ngram import build_arpa
    from preprocess.synth import SynthSpec, write_dataset

    src = root / "src"
    ws = Workspace(root, src, root / "shards", root / "shards_seed1", root / "run", src / "lexicon.txt", root / "lm.arpa")
    if ws.lm.is_file():
        return ws
    shutil.rmtree(root, ignore_errors=True)
    write_dataset(SynthSpec(sessions=2, train_trials=8, val_trials=4, test_trials=2, corpus_sentences=50, seed=4), src)
    config = ["--config", TINY_CONFIG, *sets(*DATA_SETS), "--no-progress"]
    cli("b2t-preprocess", src, root / "shards", *config, check=True)
    cli("b2t-preprocess", src, root / "shards_seed1", *config, *sets("data.seed=1"), check=True)
    cli("b2t-train", *train_args(root / "shards", root / "run"), check=True)
    ws.lm.write_text(build_arpa((src / "corpus.txt").read_text().splitlines()))
    return ws


def train_args(dataset: Path, run: Path, *extra: str) -> list[str]:
    return [str(dataset), str(run), "--config", str(TINY_CONFIG), "--backend", "eager", "--device", "cpu",
            "--no-progress", *sets(*TRAIN_SETS), *extra]


def preprocess_args(src: Path, out: Path, *extra: str) -> list[str]:
    return [str(src), str(out), "--config", str(TINY_CONFIG), *sets(*DATA_SETS), "--no-progress", *extra]


def eval_args(ws: Workspace, dataset: Path, *extra: str) -> list[str]:
    return [str(ws.run / "best.safetensors"), str(dataset), "--split", "val", "--backend", "eager", "--device",
            "cpu", "--no-progress", *extra]


def copy(path: Path, d: Path) -> Path:
    target = d / path.name
    if path.is_dir():
        shutil.copytree(path, target, symlinks=True)
    else:
        shutil.copy(path, target)
    return target


def truncate(path: Path, fraction: float = 0.5) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])
    return path


def keep(path: Path, d: Path) -> Path:
    """Remember `path` (below d) as it is now, in d/before/, for `unchanged`."""
    saved = d / "before" / path.relative_to(d)
    saved.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, saved)
    return path


def unchanged(*names: str) -> Callable[[Path], str | None]:
    """A probe's `kept` check: each d/`name` still holds what `keep` saw (else it was lost)."""
    def kept(d: Path) -> str | None:
        for name in names:
            path = d / name
            if not path.is_file() or path.read_bytes() != (d / "before" / name).read_bytes():
                return f"{path} was overwritten or removed"
        return None
    return kept


def run_copy(ws: Workspace, d: Path) -> Path:
    """A copy of the workspace's run in d/run, its files kept (`unchanged("run/best.safetensors")`)."""
    run = copy(ws.run, d)
    for name in ("best.safetensors", "last.safetensors", "metrics.jsonl"):
        keep(run / name, d)
    return run


def garbage(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def printed(text: str) -> Callable[[Path, str], str | None]:
    return lambda d, output: None if text in output else f"the output lacks {text!r}"


class Skip(Exception):
    """The probe cannot run on this machine."""


MOUNTS: list[Path] = []


def small_disk(d: Path, size: str = "1m") -> Path:
    """A 1 MiB tmpfs at d/small_disk (needs root; Skip otherwise), unmounted at the end."""
    mount = d / "small_disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        raise Skip(f"no tmpfs mount here ({done.stderr.decode(errors='replace').strip() or 'mount failed'})")
    MOUNTS.append(mount)
    return mount
