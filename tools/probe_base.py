"""The shared parts of tools/probe_bad_inputs.py: its workspace, the Probe record and the command helpers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Probe:
    name: str
    cli: str
    make: Callable[[Workspace, Path], Case]  # builds the bad input under its own folder
    expect: str = "error"  # "error": a clear refusal; "ok": accepted by design
    check: Callable[[Path, str], str | None] | None = None  # (folder, output) -> what went wrong, or None


def sets(*items: str) -> list[str]:
    return [a for s in items for a in ("--set", s)]


def cli(name: str, *args: object, cwd: Path | None = None, check: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "PJRT_DEVICE": "CPU", "COLUMNS": "200"}
    done = subprocess.run([str(BIN / name), *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=900, errors="replace")
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
    (shutil.copytree if path.is_dir() else shutil.copy)(path, target, symlinks=True)
    return target


def truncate(path: Path, keep: float = 0.5) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


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
