"""An output never overwrites or mixes with an input, and inputs are regular files (`b2t.paths`):
issue 35, cases 2, 3, 4 and 21, and their variants on every command that writes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from b2t.cli.eval import eval_main
from b2t.cli.import_baseline import import_main
from b2t.cli.lm import main as lm_main
from b2t.cli.report import main as report_main
from b2t.cli.train import train_main
from b2t.config import TINY_CONFIG
from b2t.paths import Place, clash, refuse_clashes
from preprocess.cli import main as preprocess_main
from preprocess.synth import main as synth_main


def _refused(command, args, *names: object) -> str:
    """The one line `command args` exits 2 with, checked to name `names`; the files are untouched."""
    files = [Path(a) for a in args if isinstance(a, Path) and Path(a).is_file()]
    before = {p: p.read_bytes() for p in files}
    result = CliRunner().invoke(command, [str(a) for a in args])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert all(str(n) in result.output for n in names), result.output
    assert {p: p.read_bytes() for p in files} == before, "an input was changed"
    return result.output


def test_02_eval_csv_onto_its_checkpoint(tiny_dataset, tmp_path):
    """Exit 0, "wrote ...: 36 rows": the model became a CSV."""
    ckpt = tmp_path / "best.safetensors"
    ckpt.write_bytes(b"weights")
    lexicon = tiny_dataset[0] / "lexicon.txt"
    out = _refused(eval_main, [ckpt, tiny_dataset[1], "--split", "test", "--lexicon", lexicon, "--csv", ckpt],
                   f"--csv {ckpt} is CHECKPOINT {ckpt}")
    assert "writing it would destroy that input" in out
    _refused(eval_main, [ckpt, tiny_dataset[1], "--split", "val", "--out", tiny_dataset[1] / "eval"],
             f"--out {tiny_dataset[1] / 'eval'} is inside DATASET")


def test_02_a_hard_link_is_the_same_file(tmp_path):
    (tmp_path / "corpus.txt").write_text("a b c\n")
    os.link(tmp_path / "corpus.txt", tmp_path / "link.txt")
    assert clash(Place("-o", tmp_path / "link.txt"), Place("CORPUS", tmp_path / "corpus.txt")) is not None
    (tmp_path / "sub").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "sub")
    assert clash(Place("OUT", tmp_path / "alias" / "x", tree=True), Place("SRC", tmp_path / "sub", tree=True))
    refuse_clashes([Place("-o", tmp_path / "other.txt")], [Place("CORPUS", tmp_path / "corpus.txt")])


def test_03_lm_build_onto_its_corpus(tmp_path):
    """Exit 0: the corpus was now the LM."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat\nthe dog sat\n")
    _refused(lm_main, ["build", corpus, "-o", corpus], f"-o {corpus} is CORPUS {corpus}")
    _refused(lm_main, ["lexicon", corpus, "-o", corpus], f"-o {corpus} is CORPUS")
    (tmp_path / "src.txt").write_text("cat K AE T\n")
    _refused(lm_main, ["lexicon", corpus, "-o", tmp_path / "src.txt", "--source", tmp_path / "src.txt"], "--source")


def test_an_output_never_replaces_work_of_another_kind(tmp_path):
    """`b2t-report RUN -o RUN/best.safetensors` would have made the model a PNG."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 1.0}\n')
    (run / "best.safetensors").write_bytes(b"weights")
    _refused(report_main, [run, "-o", run / "best.safetensors"], "exists and is a run's best checkpoint")
    _refused(report_main, [run, "-o", run / "metrics.jsonl"], "is RUN")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat\n")
    (tmp_path / "data_train.hdf5").write_bytes(b"data")
    _refused(lm_main, ["build", corpus, "-o", tmp_path / "data_train.hdf5"], "exists and is an HDF5 data file")


def test_04_synth_overwrite_keeps_what_it_did_not_write(tmp_path):
    """--overwrite deleted everything in OUT, the user's own files and runs included."""
    out = tmp_path / "hdf5"
    args = [out, "--sessions", "1", "--train-trials", "2", "--val-trials", "1", "--test-trials", "0",
            "--corpus-sentences", "3"]
    assert CliRunner().invoke(synth_main, [str(a) for a in args]).exit_code == 0
    (out / "runs").mkdir()
    (out / "runs" / "notes.txt").write_text("mine")
    session = next(p for p in out.iterdir() if p.name.startswith("t15."))
    (session / "README").write_text("mine too")
    output = _refused(synth_main, [*args, "--seed", "9", "--overwrite"], "2 entries b2t-synth did not write",
                      f"{session.name}/README", "runs")
    assert (out / "runs" / "notes.txt").read_text() == "mine" and "--overwrite replaces only its own" in output
    shutil.rmtree(out / "runs")
    (session / "README").unlink()
    assert CliRunner().invoke(synth_main, [str(a) for a in [*args, "--seed", "9", "--overwrite"]]).exit_code == 0


def test_21_preprocess_out_inside_src(tiny_dataset, tmp_path):
    """OUT was recorded in the manifest as an "empty folder ... skipped" of SRC."""
    src = tiny_dataset[0]
    _refused(preprocess_main, [src, src / "shards"], f"OUT {src / 'shards'} is inside SRC {src}")
    _refused(preprocess_main, [src, src], f"OUT {src} is SRC")
    assert not (src / "shards").exists()


def test_train_run_dir_inside_its_dataset(tiny_dataset):
    shards = tiny_dataset[1]
    _refused(train_main, [shards, shards / "run", "--config", TINY_CONFIG, "--backend", "eager"],
             f"RUN_DIR {shards / 'run'} is inside DATASET {shards}")
    assert not (shards / "run").exists()


def test_import_baseline_onto_its_own_files(tmp_path):
    (tmp_path / "best_checkpoint").write_bytes(b"pickle")
    (tmp_path / "args.yaml").write_text("model: {}\n")
    _refused(import_main, [tmp_path, "-o", tmp_path / "best_checkpoint"], "is PATH")
    _refused(import_main, [tmp_path / "best_checkpoint", "-o", tmp_path / "args.yaml"], "is --args")
    run = tmp_path / "run"
    run.mkdir()
    (run / "last.safetensors").write_bytes(b"a run's resumable state")
    _refused(import_main, [tmp_path, "-o", run / "last.safetensors"],  # exit 0: the run's state was gone
             "exists and is a run's resumable checkpoint, which this command does not write")


@pytest.mark.parametrize("which", ["config", "corpus", "lexicon", "init-from"])
def test_a_fifo_named_as_an_input_is_refused_not_read(tiny_dataset, tmp_path, which):
    """A FIFO blocked the reader for ever (case 16's data_val.hdf5, and any other input file)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    ckpt = tmp_path / "c.safetensors"
    ckpt.write_bytes(b"x")
    command, args = {
        "config": (preprocess_main, [tiny_dataset[0], tmp_path / "out", "--config", fifo]),
        "corpus": (lm_main, ["build", fifo, "-o", tmp_path / "lm.arpa"]),
        "lexicon": (eval_main, [ckpt, tiny_dataset[1], "--split", "val", "--lexicon", fifo]),
        "init-from": (train_main, [tiny_dataset[1], tmp_path / "run", "--init-from", fifo]),
    }[which]
    _refused(command, args, f"{fifo} is a FIFO (named pipe), not a regular file")
