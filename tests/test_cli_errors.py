"""Every b2t command turns an OS error into one line naming the path and exit code 2, and
b2t's own errors (`b2t.errors.B2tError`) into `error: ...`; anything else is a bug and says so.

Each case points a command's output under a regular file (mkdir/open then fail with
ENOTDIR, or EEXIST from mkdir(exist_ok=True)), the probe that used to end in a traceback.
"""

from __future__ import annotations

import ast
import errno
import importlib
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from b2t import launch
from b2t.cli.eval import eval_main
from b2t.cli.import_baseline import import_main
from b2t.cli.lm import main as lm_main
from b2t.cli.rule import DEBUG_ENV, Command, Group, os_error_line
from b2t.cli.train import train_main
from b2t.config import TINY_CONFIG, load_config
from b2t.engine.checkpoint import TrainState, save_checkpoint
from b2t.errors import DatasetError
from b2t.model.registry import build_model
from preprocess.cli import main as preprocess_main
from preprocess.synth import main as synth_main
from tests.test_import_baseline import reference_model, save_release


def _one_clean_line(command, *args: object, path: Path) -> None:
    result = CliRunner().invoke(command, [str(a) for a in args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, OSError)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0], result.output
    assert "Not a directory" in lines[0] or "File exists" in lines[0], result.output


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "a_file"
    path.write_text("not a directory\n")
    return path


def test_os_error_line_names_path_reason_and_what_to_do():
    line = os_error_line(NotADirectoryError(errno.ENOTDIR, "Not a directory", "/x/f/run"))
    assert line.startswith("/x/f/run: Not a directory") and "regular file" in line


def test_synth_out_under_a_file(a_file):
    _one_clean_line(synth_main, a_file / "hdf5", "--sessions", "1", path=a_file)


def test_preprocess_out_under_a_file(a_file, tmp_path):
    (tmp_path / "src").mkdir()  # beside OUT: an OUT inside SRC is refused before any path is made
    _one_clean_line(preprocess_main, tmp_path / "src", a_file / "shards", path=a_file)


def test_train_run_dir_under_a_file(a_file, tiny_dataset):
    _, shards = tiny_dataset
    _one_clean_line(train_main, shards, a_file / "run", "--config", TINY_CONFIG, "--backend", "eager",
                    path=a_file)


def test_train_on_a_folder_that_is_no_dataset_leaves_no_lock_file_in_it(tmp_path):
    """The shared dataset lock was created before the folder was checked: a `.b2t-preprocess.lock`
    stayed in the user's folder (e.g. the HDF5 sessions passed as DATASET)."""
    folder = tmp_path / "hdf5"
    folder.mkdir()
    (folder / "t15.2023.08.11.hdf5").write_bytes(b"sessions")
    result = CliRunner().invoke(train_main, [str(folder), str(tmp_path / "run"), "--config", str(TINY_CONFIG),
                                             "--backend", "eager"])
    assert result.exit_code == 2 and "manifest.json" in result.output, result.output
    assert [p.name for p in folder.iterdir()] == ["t15.2023.08.11.hdf5"]
    assert not (tmp_path / "run").exists()


def test_lm_output_under_a_file(a_file, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a b c\nb c d\n")
    _one_clean_line(lm_main, "build", corpus, "-o", a_file / "lm.arpa", path=a_file)


def test_eval_dataset_manifest_unreadable(tmp_path):
    cfg = load_config(TINY_CONFIG, ["train.backend=eager"])
    model = build_model(cfg.model, 2)
    ckpt = save_checkpoint(tmp_path / "c.safetensors", model, None,
                           TrainState(sessions=["s0", "s1"], config=cfg.to_dict()))
    dataset = tmp_path / "dataset"
    (dataset / "manifest.json").mkdir(parents=True)  # a directory where the manifest file should be
    result = CliRunner().invoke(eval_main, [str(ckpt), str(dataset), "--split", "val", "--device", "cpu",
                                            "--no-progress"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert str(dataset / "manifest.json") in result.output and "is a folder, not a regular file" in result.output


def test_import_baseline_output_under_a_file(a_file, tmp_path):
    save_release(tmp_path / "release", reference_model())
    _one_clean_line(import_main, tmp_path / "release", "-o", a_file / "ours.safetensors", path=a_file)



@pytest.mark.parametrize("command", ["build", "lexicon"])
def test_lm_corpus_that_is_not_text_is_one_line_naming_it(command, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"a b c\n\xff\xfe\x00binary\n")
    result = CliRunner().invoke(lm_main, [command, str(corpus), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and not isinstance(result.exception, UnicodeDecodeError), result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].count(str(corpus)) == 1 and "not UTF-8" in lines[0], result.output


# --- one error base: the CLIs catch B2tError (and OS errors), and a bug says it is one ---------------

CLI_MODULES = sorted({target.split(":")[0] for target in launch.SCRIPTS.values()})


def _wholesale_catches(module: str) -> list[str]:
    """`module`'s `except` clauses that catch a builtin error around more than one statement."""
    wholesale = {"Exception", "BaseException", "ValueError", "RuntimeError", "TypeError", "KeyError",
                 "AttributeError", "FileNotFoundError", "OSError"}
    path = Path(importlib.import_module(module).__file__)
    found = []
    for node in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Try)):
        for handler in node.handlers:
            types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
            caught = {ast.unparse(t) for t in types if t is not None} & wholesale
            if (caught or handler.type is None) and len(node.body) > 1:
                found.append(f"{path.name}:{handler.lineno} catches {sorted(caught) or 'everything'}")
    return found


@pytest.mark.parametrize("module", CLI_MODULES)
def test_a_cli_module_catches_builtin_errors_only_around_one_statement(module):
    """A CLI that caught ValueError around its whole run showed a bug's message as the user's
    mistake; a builtin is caught only around the one statement that parses a user's file."""
    assert not _wholesale_catches(module)


def test_every_command_runs_under_the_one_rule():
    for name in launch.SCRIPTS:
        assert isinstance(launch.command(name), (Command, Group)), name


def _failing(error: BaseException) -> click.Command:
    @click.command(cls=Command)
    def fails() -> None:
        raise error

    return fails


def test_an_expected_error_is_one_line_and_exit_2():
    result = CliRunner().invoke(_failing(DatasetError("shards/x.tar: truncated: rewrite it")))
    assert (result.exit_code, result.output) == (2, "error: shards/x.tar: truncated: rewrite it\n")


def test_a_bug_says_it_is_one_and_b2t_debug_shows_the_traceback(monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    result = CliRunner().invoke(_failing(IndexError("list index out of range")))
    assert result.exit_code == 70
    assert result.output.startswith("internal error: IndexError: list index out of range\n(a bug in b2t")
    monkeypatch.setenv(DEBUG_ENV, "1")
    result = CliRunner().invoke(_failing(IndexError("list index out of range")))
    assert isinstance(result.exception, IndexError)  # raised on, for the traceback
