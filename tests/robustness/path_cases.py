"""Probes of tests/robustness/probe.py on where commands write and what they read: outputs named like
their inputs (a CSV onto its checkpoint, an LM onto its corpus, OUT inside SRC), b2t-synth's
--overwrite beside the user's own files, and FIFOs or devices named as inputs."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from tests.robustness.probe_base import (
    Case,
    Probe,
    Workspace,
    copy,
    eval_args,
    keep,
    preprocess_args,
    run_copy,
    train_args,
    unchanged,
)

# --- outputs named like inputs -------------------------------------------------------------------------

def _corpus(d: Path) -> Path:
    path = d / "corpus.txt"
    path.write_text("the cat sat\nthe dog sat on the mat\n")
    return keep(path, d)


def _eval_csv_onto(target: Callable[[Workspace, Path], Path]) -> Callable[[Workspace, Path], Case]:
    def make(ws: Workspace, d: Path) -> Case:
        ckpt = keep(copy(ws.run / "best.safetensors", d), d)
        lexicon = keep(copy(ws.lexicon, d), d)
        path = target(ws, d)
        args = [str(ckpt), str(ws.shards), "--split", "test", "--backend", "eager", "--device", "cpu", "--no-progress",
                "--lexicon", str(lexicon), "--csv", str(path)]
        return args, [str(path)]
    return make


def _linked(d: Path, to: Path, name: str, hard: bool = False) -> Path:
    (os.link if hard else os.symlink)(to, d / name)
    return d / name


OUTPUT_PROBES = [
    Probe("--csv onto its checkpoint (case 2)", "b2t-eval", _eval_csv_onto(lambda ws, d: d / "best.safetensors"),
          kept=unchanged("best.safetensors")),
    Probe("--csv onto the lexicon", "b2t-eval", _eval_csv_onto(lambda ws, d: d / "lexicon.txt"),
          kept=unchanged("lexicon.txt")),
    Probe("--csv onto a symlink to its checkpoint", "b2t-eval",
          _eval_csv_onto(lambda ws, d: _linked(d, d / "best.safetensors", "sub.csv")), kept=unchanged("best.safetensors")),
    Probe("--out inside DATASET", "b2t-eval",
          lambda ws, d: (eval_args(ws, copy(ws.shards, d), "--out", str(d / "shards" / "eval")), [str(d / "shards")]),
          check=lambda d, out: f"{d / 'shards' / 'eval'} was made" if (d / "shards" / "eval").exists() else None),
    Probe("b2t-lm build -o its corpus (case 3)", "b2t-lm",
          lambda ws, d: (["build", str(_corpus(d)), "-o", str(d / "corpus.txt")], [str(d / "corpus.txt")]),
          kept=unchanged("corpus.txt")),
    Probe("b2t-lm build -o a hard link of its corpus", "b2t-lm",
          lambda ws, d: (["build", str(_corpus(d)), "-o", str(_linked(d, d / "corpus.txt", "lm.arpa", hard=True))],
                         [str(d / "lm.arpa")]), kept=unchanged("corpus.txt")),
    Probe("b2t-lm lexicon -o its --source", "b2t-lm",
          lambda ws, d: (["lexicon", str(_corpus(d)), "-o", str(keep(copy(ws.lexicon, d), d)), "--source",
                          str(d / "lexicon.txt")], [str(d / "lexicon.txt")]), kept=unchanged("lexicon.txt")),
    Probe("b2t-lm build -o onto an HDF5 file", "b2t-lm",
          lambda ws, d: (["build", str(_corpus(d)), "-o", str(keep(copy(next(ws.src.glob("*/data_train.hdf5")), d), d))],
                         [str(d / "data_train.hdf5"), "HDF5"]), kept=unchanged("data_train.hdf5")),
    Probe("b2t-report -o onto the run's best checkpoint", "b2t-report",
          lambda ws, d: ([str(run_copy(ws, d)), "-o", str(d / "run" / "best.safetensors")],
                         [str(d / "run" / "best.safetensors"), "checkpoint"]), kept=unchanged("run/best.safetensors")),
    Probe("b2t-report -o onto its metrics.jsonl", "b2t-report",
          lambda ws, d: ([str(run_copy(ws, d)), "-o", str(d / "run" / "metrics.jsonl")],
                         [str(d / "run" / "metrics.jsonl")]), kept=unchanged("run/metrics.jsonl")),
    Probe("b2t-preprocess SRC SRC/shards (case 21)", "b2t-preprocess",
          lambda ws, d: (preprocess_args(copy(ws.src, d), d / "src" / "shards"), [str(d / "src" / "shards")]),
          check=lambda d, out: f"{d / 'src' / 'shards'} was made" if (d / "src" / "shards").exists() else None),
    Probe("b2t-preprocess SRC SRC", "b2t-preprocess",
          lambda ws, d: (preprocess_args(copy(ws.src, d), d / "src", "--overwrite"), [str(d / "src")])),
    Probe("b2t-preprocess OUT a symlink into SRC", "b2t-preprocess",
          lambda ws, d: (preprocess_args(copy(ws.src, d), _linked(d, d / "src", "alias") / "out"), ["alias"])),
    Probe("b2t-train RUN_DIR = DATASET", "b2t-train",
          lambda ws, d: (train_args(copy(ws.shards, d), d / "shards"), [str(d / "shards")])),
    Probe("b2t-train RUN_DIR inside DATASET", "b2t-train",
          lambda ws, d: (train_args(copy(ws.shards, d), d / "shards" / "run"), [str(d / "shards" / "run")])),
    Probe("b2t-import-baseline -o onto its args.yaml", "b2t-import-baseline",
          lambda ws, d: ((d / "args.yaml").write_text("model: {}\n") and None or
                         [str(keep(_write(d / "best_checkpoint", b"x"), d)), "-o", str(d / "args.yaml")],
                         [str(d / "args.yaml")])),
]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _synth_with_own_files(inside_session: bool) -> Callable[[Workspace, Path], Case]:
    def make(ws: Workspace, d: Path) -> Case:
        out = copy(ws.src, d)
        mine = (next(out.glob("t15.*")) if inside_session else out) / "notes.txt"
        mine.write_text("the user's own notes")
        keep(mine, d)
        return [str(out), "--sessions", "2", "--seed", "9", "--overwrite"], ["notes.txt", "did not write"]
    return make


def _notes_unchanged(d: Path) -> str | None:
    return unchanged(*(str(p.relative_to(d / "before")) for p in (d / "before").rglob("notes.txt")))(d)


SYNTH_PROBES = [
    Probe("b2t-synth --overwrite with the user's file in OUT (case 4)", "b2t-synth", _synth_with_own_files(False),
          kept=_notes_unchanged),
    Probe("b2t-synth --overwrite with the user's file in a session folder", "b2t-synth", _synth_with_own_files(True),
          kept=_notes_unchanged),
    Probe("b2t-synth OUT with a damaged spec file", "b2t-synth",
          lambda ws, d: ((copy(ws.src, d) / "synth.json").write_text("{oops") and None or
                         [str(d / "src"), "--sessions", "2"], [str(d / "src")])),
]


# --- FIFOs and devices as inputs ----------------------------------------------------------------------

def _fifo(path: Path) -> Path:
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


def _fifo_session_file(ws: Workspace, d: Path) -> Case:
    src = copy(ws.src, d)
    return preprocess_args(src, d / "out"), [str(_fifo(next(src.glob("*/data_val.hdf5"))))]


FIFO_PROBES = [
    Probe("a FIFO named data_val.hdf5 (case 16)", "b2t-preprocess", _fifo_session_file, timeout=300),
    Probe("--config a FIFO", "b2t-plan", lambda ws, d: (["--config", str(_fifo(d / "c.yaml"))],
                                                         [str(d / "c.yaml"), "FIFO"]), timeout=300),
    Probe("b2t-lm build on a FIFO corpus", "b2t-lm",
          lambda ws, d: (["build", str(_fifo(d / "c.txt")), "-o", str(d / "lm.arpa")], [str(d / "c.txt")]), timeout=300),
    Probe("--lexicon a FIFO", "b2t-eval",
          lambda ws, d: (eval_args(ws, ws.shards, "--lexicon", str(_fifo(d / "lex.txt"))), [str(d / "lex.txt")]),
          timeout=300),
    Probe("manifest.json a FIFO", "b2t-train",
          lambda ws, d: (train_args(copy(ws.shards, d), d / "run"), [str(_fifo(d / "shards" / "manifest.json"))]),
          timeout=300),
    Probe("a shard a FIFO", "b2t-train",
          lambda ws, d: (train_args(copy(ws.shards, d), d / "run"),
                         [_fifo(sorted((d / "shards").glob("train-*.tar"))[0]).name]), timeout=300),
    Probe("--init-from /dev/zero", "b2t-train",
          lambda ws, d: (train_args(ws.shards, d / "run", "--init-from", "/dev/zero"), ["/dev/zero"]), timeout=300),
    Probe("last.safetensors a FIFO, --resume", "b2t-train",
          lambda ws, d: (train_args(ws.shards, copy(ws.run, d), "--resume"),
                         [str(_fifo(d / "run" / "last.safetensors"))]), timeout=300),
]


