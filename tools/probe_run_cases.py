"""Probes of tools/probe_bad_inputs.py on runs: resumes, checkpoints, evaluation, LMs, baseline imports, metrics, full disks."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from probe_base import (
    Case,
    Probe,
    Workspace,
    copy,
    eval_args,
    garbage,
    preprocess_args,
    printed,
    sets,
    small_disk,
    train_args,
    truncate,
)

# --- runs, resumes and checkpoints -------------------------------------------------------------------

def run_probe(change: Callable[[Workspace, Path, Path], object], *extra: str,
              dataset: Callable[[Workspace], Path] = lambda ws: ws.shards) -> Callable[[Workspace, Path], Case]:
    """b2t-train on a copy of the workspace's 2-step run, after `change(ws, d, run)`."""
    def make(ws: Workspace, d: Path) -> Case:
        run = copy(ws.run, d)
        named = change(ws, d, run)
        return train_args(dataset(ws), run, *extra), [str(named)] if named else []
    return make


def _no_run_dir(d: Path, output: str) -> str | None:
    return f"{d / 'fresh'} was left behind" if (d / "fresh").exists() else None


def _other_size(ws: Workspace, d: Path) -> Case:
    return (train_args(ws.shards, d / "fresh", "--init-from", str(ws.run / "last.safetensors"),
                       *sets("model.gru.n_units=32")), ["n_units"])


RUN_PROBES = [
    Probe("--resume with --init-from (case 9)", "b2t-train",
          run_probe(lambda ws, d, run: "--init-from", "--resume", "--init-from", "/dev/null")),
    Probe("--resume on shards of another data.seed (case 8)", "b2t-train",
          run_probe(lambda ws, d, run: ws.shards_seed1, "--resume", dataset=lambda ws: ws.shards_seed1)),
    Probe("--resume with another model size", "b2t-train",
          run_probe(lambda ws, d, run: "model", "--resume", *sets("model.gru.n_units=32"))),
    Probe("--resume with a binary metrics.jsonl (case 19)", "b2t-train",
          run_probe(lambda ws, d, run: garbage(run / "metrics.jsonl", bytes(range(256))), "--resume")),
    Probe("--resume with a garbage line in metrics.jsonl", "b2t-train",
          run_probe(lambda ws, d, run: garbage(run / "metrics.jsonl", b"oops\n" + (ws.run / "metrics.jsonl")
                                                .read_bytes()), "--resume")),
    Probe("--resume from a truncated last.safetensors", "b2t-train",
          run_probe(lambda ws, d, run: truncate(run / "last.safetensors"), "--resume")),
    Probe("--resume from a garbage last.safetensors", "b2t-train",
          run_probe(lambda ws, d, run: garbage(run / "last.safetensors", b"\x00" * 64), "--resume")),
    Probe("a run dir with a checkpoint, no --resume", "b2t-train", run_probe(lambda ws, d, run: "--resume")),
    Probe("--resume before the first checkpoint", "b2t-train",
          run_probe(lambda ws, d, run: [p.unlink() for p in run.glob("*.safetensors")] and None, "--resume"),
          expect="ok", check=printed("starting from scratch")),
    Probe("--init-from a missing file", "b2t-train",
          lambda ws, d: (train_args(ws.shards, d / "fresh", "--init-from", str(d / "none.safetensors")),
                         [str(d / "none.safetensors")]), check=_no_run_dir),
    Probe("RUN_DIR a regular file", "b2t-train",
          lambda ws, d: ((d / "f").write_text("x") and None or train_args(ws.shards, d / "f"), [str(d / "f")])),
    Probe("DATASET a folder without a manifest", "b2t-train",
          lambda ws, d: (train_args(d, d / "run"), ["manifest.json"])),
    Probe("--init-from a garbage file (+ empty RUN dir)", "b2t-train",
          lambda ws, d: (train_args(ws.shards, d / "fresh", "--init-from",
                                    str(garbage(d / "x.safetensors", b"junk" * 9))), [str(d / "x.safetensors")]),
          check=_no_run_dir),
    Probe("--init-from a checkpoint of another model size", "b2t-train", _other_size, check=_no_run_dir),
    Probe("config data section differs from the shards (case 10)", "b2t-train",
          lambda ws, d: (train_args(ws.shards, d / "run", *sets("data.n_buckets=2")), []), expect="ok",
          check=printed("note: the shards were made with data.n_buckets=3")),
    Probe("--max-compiles not a number", "b2t-train",
          lambda ws, d: (train_args(ws.shards, d / "run", "--max-compiles", "many"), ["--max-compiles"])),
]


# --- evaluation, lexicons, LMs, baseline imports -----------------------------------------------------

def eval_probe(*extra: str | Callable[[Workspace, Path], str]) -> Callable[[Workspace, Path], Case]:
    """b2t-eval of the workspace run; callables in `extra` build a file and return its path (named)."""
    def make(ws: Workspace, d: Path) -> Case:
        args = [a(ws, d) if callable(a) else a for a in extra]
        return eval_args(ws, ws.shards, *args), [a for a in args if a.startswith(str(d))]  # the files it made
    return make


def file_of(name: str, data: bytes) -> Callable[[Workspace, Path], str]:
    return lambda ws, d: str(garbage(d / name, data))


def lexicon(ws: Workspace, d: Path) -> str:
    return str(ws.lexicon)


class Hostile:
    """Pickled, it asks the unpickler to run a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _pickle(obj_of: Callable[[Path], object], name: str = "best_checkpoint") -> Callable[[Workspace, Path], Case]:
    def make(ws: Workspace, d: Path) -> Case:
        import torch

        torch.save(obj_of(d), d / name)
        return [str(d / name), "-o", str(d / "out.safetensors"), "--sessions-from", str(ws.shards)], [str(d / name)]
    return make


def _never_ran(d: Path, output: str) -> str | None:
    if (d / "pwned").exists():
        return "the pickle's command ran"
    return "torch's advice to use weights_only=False was shown" if "weights_only=False" in output else None


def _import_file(data: bytes) -> Callable[[Workspace, Path], Case]:
    return lambda ws, d: ([str(garbage(d / "best_checkpoint", data)), "-o", str(d / "o.safetensors"),
                           "--sessions-from", str(ws.shards)], [str(d / "best_checkpoint")])


EVAL_PROBES = [
    Probe("checkpoint garbage", "b2t-eval",
          lambda ws, d: ([str(garbage(d / "c.safetensors", b"junk")), str(ws.shards), "--split", "val"],
                         [str(d / "c.safetensors")])),
    Probe("--lm a text file that is not ARPA (case 15)", "b2t-eval",
          eval_probe("--lexicon", lexicon, "--lm", file_of("notes.txt", b"hello world\n"))),
    Probe("--lm a binary file (case 19)", "b2t-eval",
          eval_probe("--lexicon", lexicon, "--lm", file_of("lm.bin", bytes(range(256)) * 64))),
    Probe("--lm with a broken body", "b2t-eval",
          eval_probe("--lexicon", lexicon, "--lm", file_of("bad.arpa", b"\\data\\\nngram 1=2\n\n\\1-grams:\n-1\tx\n"
                                                                     b"GARBAGE\n\\end\\\n"))),
    Probe("non-UTF-8 lexicon (case 19)", "b2t-eval", eval_probe("--lexicon", file_of("lex.txt", b"caf\xe9 K AE F\n"))),
    Probe("lexicon with an unknown phoneme", "b2t-eval", eval_probe("--lexicon", file_of("lex.txt", b"cat K QQ T\n"))),
    Probe("empty lexicon", "b2t-eval", eval_probe("--lexicon", file_of("lex.txt", b"\n"))),
    Probe("--csv without words", "b2t-eval", eval_probe("--csv", "out.csv")),
    Probe("--lexicon a missing file", "b2t-eval",
          lambda ws, d: (eval_args(ws, ws.shards, "--lexicon", str(d / "none.txt")), [str(d / "none.txt")])),
    Probe("--lm an empty file", "b2t-eval", eval_probe("--lexicon", lexicon, "--lm", file_of("empty.arpa", b""))),
    Probe("hostile pickle", "b2t-import-baseline", _pickle(lambda d: {"model_state_dict": Hostile(d / "pwned")}),
          check=_never_ran),
    Probe("a pickle that is not a checkpoint (case 20)", "b2t-import-baseline",
          _pickle(lambda d: {"notes": Workspace}), check=_never_ran),
    Probe("a dict without model_state_dict", "b2t-import-baseline", _pickle(lambda d: {"weights": [1, 2]})),
    Probe("a pickled tensor, not a dict", "b2t-import-baseline", _pickle(lambda d: __import__("torch").zeros(3))),
    Probe("a truncated torch file", "b2t-import-baseline", _import_file(b"PK\x03\x04" + b"\x00" * 40)),
    Probe("malformed args.yaml", "b2t-import-baseline",
          lambda ws, d: ((d / "args.yaml").write_text("model: [\n") and None
                         or [str(garbage(d / "best_checkpoint", b"x")), "-o", str(d / "o.safetensors")],
                         [str(d / "args.yaml")])),
    Probe("args.yaml a YAML list", "b2t-import-baseline",
          lambda ws, d: ((d / "args.yaml").write_text("- model\n") and None
                         or [str(garbage(d / "best_checkpoint", b"x")), "-o", str(d / "o.safetensors")],
                         [str(d / "args.yaml")])),
]


# --- metrics files, b2t-lm -----------------------------------------------------------------------------

def report_probe(data: bytes, expect_skip: str | None = None) -> Callable[[Workspace, Path], Case]:
    def make(ws: Workspace, d: Path) -> Case:
        garbage(d / "metrics.jsonl", data)
        return [str(d), "-o", str(d / "r.png")], [str(d / "metrics.jsonl")] + ([expect_skip] if expect_skip else [])
    return make


GOOD = b'{"kind": "train", "step": 1, "loss": 2.0}\n{"kind": "train", "step": 2, "loss": 1.0}\n'

METRICS_AND_LM_PROBES = [
    Probe("garbage line mid-file (case 11)", "b2t-report", report_probe(GOOD + b"{oops\n" + GOOD), expect="ok",
          check=printed("1 line of")),
    Probe('"per": "abc" (case 11)', "b2t-report",
          report_probe(GOOD + b'{"kind": "val", "step": 2, "per": "abc"}\n'), expect="ok",
          check=printed("per is 'abc'")),
    Probe("binary metrics file (case 16)", "b2t-report", report_probe(bytes(range(256)) * 8, "not UTF-8")),
    Probe("every step null (case 21)", "b2t-report",
          report_probe(b'{"kind": "train", "step": null, "loss": 1.0}\n' * 3, "step is None")),
    Probe("empty metrics file", "b2t-report", report_probe(b"")),
    Probe("metrics lines that are JSON lists", "b2t-report", report_probe(b"[1, 2]\n" * 3, "not an object")),
    Probe("metrics.jsonl a folder", "b2t-report",
          lambda ws, d: ((d / "metrics.jsonl").mkdir() or [str(d)], [str(d / "metrics.jsonl")])),
    Probe("no metrics file", "b2t-report", lambda ws, d: ([str(d)], [str(d / "metrics.jsonl")])),
    Probe("b2t-lm build on a binary corpus", "b2t-lm",
          lambda ws, d: (["build", str(garbage(d / "c.txt", bytes(range(128, 256)))), "-o", str(d / "lm.arpa")],
                         [str(d / "c.txt")])),
    Probe("b2t-lm build on an empty corpus", "b2t-lm",
          lambda ws, d: (["build", str(garbage(d / "c.txt", b"\n\n")), "-o", str(d / "lm.arpa")], [str(d / "c.txt")])),
    Probe("b2t-lm lexicon --source non-UTF-8", "b2t-lm",
          lambda ws, d: (["lexicon", str(ws.src / "corpus.txt"), "-o", str(d / "l.txt"), "--source",
                          str(garbage(d / "src.txt", b"caf\xe9 K AE F\n"))], [str(d / "src.txt")])),
]


# --- disk full --------------------------------------------------------------------------------------

def full_disk(d: Path) -> Path:
    """A small tmpfs already filled to its last byte."""
    mount = small_disk(d, "64k")
    with open(mount / "filler", "wb", buffering=0) as f:
        try:
            while f.write(b"\0" * 4096):
                pass
        except OSError:  # no space left
            pass
    return mount


DISK_PROBES = [
    Probe("disk full while writing an LM", "b2t-lm",
          lambda ws, d: (["build", str(ws.src / "corpus.txt"), "-o", str(full_disk(d) / "lm.arpa")],
                         [str(d / "small_disk" / "lm.arpa")])),
    Probe("disk full while writing shards", "b2t-preprocess",
          lambda ws, d: (preprocess_args(ws.src, small_disk(d) / "out"), [str(d / "small_disk" / "out")])),
    Probe("disk full while training (case 18)", "b2t-train",
          lambda ws, d: (train_args(ws.shards, small_disk(d) / "run"), [str(d / "small_disk" / "run")])),
]
