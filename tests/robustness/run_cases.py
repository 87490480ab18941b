"""Probes of tests/robustness/probe.py on runs: resumes, checkpoints (damaged and crafted), run directories,
evaluation, LMs, baseline imports, metrics, full disks."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from tests.robustness.probe_base import (
    Case,
    Probe,
    Workspace,
    copy,
    eval_args,
    garbage,
    preprocess_args,
    printed,
    run_copy,
    sets,
    small_disk,
    train_args,
    truncate,
    unchanged,
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


def _killed_in_the_warm_up(ws: Workspace, d: Path, run: Path) -> None:
    """The run as a kill -9 during its warm-up leaves it: start-up records only, no checkpoint."""
    for p in run.glob("*.safetensors"):
        p.unlink()
    records = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
               if r["kind"] in ("layout", "compile", "init")]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


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
    Probe("--resume before the first checkpoint (killed in the warm-up)", "b2t-train",
          run_probe(_killed_in_the_warm_up, "--resume"), expect="ok", check=printed("starting from scratch")),
    Probe("--resume after every checkpoint was deleted", "b2t-train",
          run_probe(lambda ws, d, run: [p.unlink() for p in run.glob("*.safetensors")] and "last.safetensors",
                    "--resume")),
    Probe("--init-from a missing file", "b2t-train",
          lambda ws, d: (train_args(ws.shards, d / "fresh", "--init-from", str(d / "none.safetensors")),
                         [str(d / "none.safetensors")]), check=_no_run_dir),
    Probe("RUN_DIR a regular file", "b2t-train",
          lambda ws, d: ((d / "f").write_text("x") and None or train_args(ws.shards, d / "f"), [str(d / "f")])),
    Probe("DATASET a folder without a manifest", "b2t-train",
          lambda ws, d: ((d / "ds").mkdir() or train_args(d / "ds", d / "run"), ["manifest.json"])),
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


# --- run directories and resumes -------------------------------------------------------------------

def _without(*names: str) -> Callable[[Workspace, Path], Path]:
    def make(ws: Workspace, d: Path) -> Path:
        run = run_copy(ws, d)
        for name in names:
            (run / name).unlink()
        return run
    return make


def _resume_with(*overrides: str) -> Callable[[Workspace, Path], Case]:
    return lambda ws, d: (train_args(ws.shards, run_copy(ws, d), "--resume", *sets("train.steps=3", *overrides)),
                          [o.split("=")[0] for o in overrides])


RUN_DIR_PROBES = [
    Probe("a finished run without its last.safetensors, run again (case 1)", "b2t-train",
          lambda ws, d: (train_args(ws.shards, _without("last.safetensors")(ws, d)), ["best.safetensors"]),
          kept=unchanged("run/best.safetensors", "run/metrics.jsonl")),
    Probe("the same, with --resume", "b2t-train",
          lambda ws, d: (train_args(ws.shards, _without("last.safetensors")(ws, d), "--resume"), ["last.safetensors"]),
          kept=unchanged("run/best.safetensors", "run/metrics.jsonl")),
    Probe("a run dir holding only best.safetensors", "b2t-train",
          lambda ws, d: (train_args(ws.shards, _without("last.safetensors", "metrics.jsonl")(ws, d)),
                         ["best.safetensors"]), kept=unchanged("run/best.safetensors")),
    Probe("a run dir holding only metrics.jsonl with steps", "b2t-train",
          lambda ws, d: (train_args(ws.shards, _without("last.safetensors", "best.safetensors")(ws, d)),
                         ["metrics.jsonl"]), kept=unchanged("run/metrics.jsonl")),
    Probe("a run dir with a stray temp file, --resume", "b2t-train",
          lambda ws, d: (garbage(run_copy(ws, d) / ".last.safetensors.x1.tmp", b"half") and
                         train_args(ws.shards, d / "run", "--resume", *sets("train.steps=3")), []), expect="ok"),
    Probe("--resume with train.seed=5 (case 9)", "b2t-train", _resume_with("train.seed=5")),
    Probe("--resume with train.shuffle_buffer=2 (case 9)", "b2t-train", _resume_with("train.shuffle_buffer=2")),
    Probe("--resume with train.grad_accum=2", "b2t-train", _resume_with("train.grad_accum=2")),
    Probe("--resume with train.num_workers=2 (case 9)", "b2t-train", _resume_with("train.num_workers=2"),
          expect="ok", check=printed("train.num_workers=2 ignored")),
    Probe("--resume with train.compute_dtype=bf16", "b2t-train", _resume_with("train.compute_dtype=bf16"),
          expect="ok", check=printed("not bit-identical")),
]


# --- crafted checkpoints ------------------------------------------------------------------------------

def crafted(change: Callable[[dict, dict], object], name: str = "last.safetensors") -> Callable[[Workspace, Path], Path]:
    """A copy of the workspace run whose `name` was rewritten by change(tensors, b2t metadata)."""
    def make(ws: Workspace, d: Path) -> Path:
        from safetensors import safe_open
        from safetensors.torch import save_file

        run = copy(ws.run, d)
        with safe_open(str(run / name), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
            meta = json.loads(f.metadata()["b2t"])
        changed = change(tensors, meta)
        meta = changed if isinstance(changed, (dict, list)) else meta
        save_file(tensors, str(run / name), metadata={"b2t": json.dumps(meta)})
        return run / name
    return make


def _state(**fields: object) -> Callable[[dict, dict], dict]:
    return lambda t, m: {**m, "state": {**m["state"], **fields}}


def _drop_state(key: str) -> Callable[[dict, dict], dict]:
    return lambda t, m: {**m, "state": {k: v for k, v in m["state"].items() if k != key}}


def _tensor(key: str, value: Callable) -> Callable[[dict, dict], None]:
    return lambda t, m: t.update({key: value(t[key])})


def resume_probe(change: Callable, *names: str) -> Callable[[Workspace, Path], Case]:
    """--resume of the crafted checkpoint with a step more to go (a finished run's re-run prints its
    summary and reads no tensor, so only an unfinished one loads the checkpoint)."""
    return lambda ws, d: (train_args(ws.shards, crafted(change)(ws, d).parent, "--resume", *sets("train.steps=3")),
                          [str(d / "run"), *names])


def eval_probe(change: Callable, *names: str) -> Callable[[Workspace, Path], Case]:
    def make(ws: Workspace, d: Path) -> Case:
        ckpt = crafted(change, "best.safetensors")(ws, d)
        return [str(ckpt), str(ws.shards), "--split", "val", "--backend", "eager", "--device", "cpu",
                "--no-progress"], [str(ckpt), *names]
    return make


def init_probe(change: Callable, *names: str) -> Callable[[Workspace, Path], Case]:
    def make(ws: Workspace, d: Path) -> Case:
        ckpt = crafted(change, "best.safetensors")(ws, d)
        return train_args(ws.shards, d / "fresh", "--init-from", str(ckpt)), [str(ckpt), *names]
    return make


def _nan(t):
    return t.fill_(float("nan"))


CHECKPOINT_PROBES = [
    Probe("a state field from a newer b2t, --resume (case 10)", "b2t-train",
          resume_probe(_state(ema_decay=0.999), "ema_decay")),
    Probe("a state field from a newer b2t, b2t-eval (case 10)", "b2t-eval", eval_probe(_state(ema_decay=0.999))),
    Probe("b2t metadata a JSON list (case 10)", "b2t-train", resume_probe(lambda t, m: [m])),
    Probe("saved state a JSON string", "b2t-eval", eval_probe(lambda t, m: {**m, "state": "step 3"})),
    Probe("an AdamW moment of the wrong shape (case 11)", "b2t-train",
          resume_probe(_tensor("optim.0.exp_avg", lambda v: v[:1].clone()), "optim.0.exp_avg")),
    Probe("AdamW step counts that disagree with the step", "b2t-train", resume_probe(_state(step=1), "optim.0.step")),
    Probe("an AdamW moment missing", "b2t-train", resume_probe(lambda t, m: t.pop("optim.2.exp_avg_sq") is None)),
    Probe("NaN weights, b2t-eval (case 12)", "b2t-eval", eval_probe(_tensor("model.out.weight", _nan), "NaN")),
    Probe("NaN weights, --resume (case 12)", "b2t-train", resume_probe(_tensor("model.out.weight", _nan), "NaN")),
    Probe("NaN weights, --init-from (case 12)", "b2t-train", init_probe(_tensor("model.out.weight", _nan), "NaN")),
    Probe("Inf in an AdamW moment, --resume", "b2t-train",
          resume_probe(_tensor("optim.1.exp_avg_sq", lambda v: v.fill_(float("inf"))), "optim.1.exp_avg_sq")),
    Probe("integer weights, --init-from (case 12)", "b2t-train",
          init_probe(_tensor("model.out.bias", lambda v: v.to(__import__("torch").int64)), "int64")),
    Probe("no step in the state (case 12)", "b2t-train", resume_probe(_drop_state("step"), "step")),
    Probe("the step a string", "b2t-eval", eval_probe(_state(step="3"), "step")),
    Probe("an extra tensor", "b2t-eval",
          eval_probe(lambda t, m: t.update({"payload": __import__("torch").zeros(4)}), "payload")),
    Probe("sessions that are not names", "b2t-eval", eval_probe(_state(sessions=[1, 2]), "sessions")),
    Probe("a config key this b2t does not know", "b2t-eval",
          eval_probe(lambda t, m: {**m, "state": {**m["state"], "config": {**m["state"]["config"],
                                                                            "train": {"ema": 1}}}}, "ema")),
]
