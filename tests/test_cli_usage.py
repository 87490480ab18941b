"""Every b2t command ends a usage or input error with exit code 2 (click's own usage errors
and b2t's one-line errors alike), and `b2t-lm` writes its outputs atomically."""

from __future__ import annotations

import errno
import os
from importlib.metadata import entry_points

import click
import pytest
from click.testing import CliRunner

from b2t import launch
from b2t.atomic import is_temp_name
from b2t.cli.lm import main as lm_main
from preprocess.cli import main as preprocess_main

SCRIPTS = {ep.name: ep for ep in entry_points(group="console_scripts") if ep.value.split(".")[0] in ("b2t", "preprocess")}
COMMANDS = {name: launch.command(name) for name in SCRIPTS}


def _needs_arguments(command: click.Command) -> bool:
    return isinstance(command, click.Group) or any(isinstance(p, click.Argument) and p.required
                                                   for p in command.params)


def invocations() -> list[tuple[str, list[str]]]:
    """Each command line (group subcommands included) with a bad option, and with no argument
    where it needs one (b2t-plan without DATASET plans for the competition's data)."""
    cases = []
    for name in sorted(COMMANDS):
        command = COMMANDS[name]
        subs = [([], command)] + ([([s], c) for s, c in command.commands.items()] if isinstance(command, click.Group)
                                  else [])
        for sub, sub_command in subs:
            cases += [(name, [*sub, "--no-such-option"])] + [(name, sub)] * _needs_arguments(sub_command)
    return cases


def test_every_installed_command_is_checked_and_starts_under_the_stop_policy():
    assert {"b2t-synth", "b2t-preprocess", "b2t-train", "b2t-lm", "b2t-eval", "b2t-import-baseline",
            "b2t-report"} <= set(SCRIPTS) == set(launch.SCRIPTS)
    assert all(ep.value.startswith("b2t.launch:") for ep in SCRIPTS.values()), "each script enters through b2t.launch"


@pytest.mark.parametrize(("name", "args"), invocations(), ids=lambda v: v if isinstance(v, str) else " ".join(v) or "-")
def test_usage_errors_exit_2(name, args):
    result = CliRunner().invoke(COMMANDS[name], args)
    assert result.exit_code == 2, (name, args, result.output)
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("name", "args"), [
    ("b2t-eval", ["--word-score", "nan"]), ("b2t-eval", ["--lm-weight", "nan"]), ("b2t-eval", ["--sil-score", "inf"]),
    ("b2t-eval", ["--neural-weight", "inf"]), ("b2t-synth", ["--noise-std", "nan"]), ("b2t-synth", ["--drift-std", "inf"]),
    ("b2t-synth", ["--structured-noise-std", "inf"]),
    ("b2t-eval", ["--lm-weight", "1e308"]), ("b2t-eval", ["--word-score", "-1e300"]),  # inf in float32: empty decodes
])
def test_a_weight_or_std_that_is_not_finite_is_refused(name, args, tmp_path):
    """click's float reads "nan" and "inf": the search ran (a NaN score per word), the synth wrote NaN data."""
    operands = ["ckpt", "dataset"] if name == "b2t-eval" else [str(tmp_path / "synth")]
    result = CliRunner().invoke(COMMANDS[name], [*operands, *args])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "finite" in result.output, result.output
    assert not (tmp_path / "synth").exists()


def help_invocations() -> list[tuple[str, list[str]]]:
    """Each command line (group subcommands included) with -h."""
    cases = []
    for name in sorted(COMMANDS):
        command = COMMANDS[name]
        subs = [[]] + ([[s] for s in command.commands] if isinstance(command, click.Group) else [])
        cases += [(name, [*sub, "-h"]) for sub in subs]
    return cases


@pytest.mark.parametrize(("name", "args"), help_invocations(), ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_every_command_takes_dash_h(name, args):
    result = CliRunner().invoke(COMMANDS[name], args)
    assert result.exit_code == 0 and "Usage:" in result.output, (name, args, result.output)


@pytest.mark.parametrize(("name", "args", "says"), [
    ("b2t-lm", ["build", "corpus.txt", "-o", "lm.arpa", "--order", "1"], "1 is not in the range 2<=x<=6"),
    ("b2t-lm", ["build", "corpus.txt", "-o", "lm.arpa", "--order", "7"], "7 is not in the range 2<=x<=6"),
    ("b2t-eval", ["ckpt", "dataset", "--beam-size", "10000000000"], "is not in the range 1<=x<=2147483647"),
])
def test_values_the_decoder_cannot_take_are_refused_at_once(name, args, says, tmp_path, monkeypatch):
    """An order-1 or order-7 LM was written (exit 0) for b2t-eval to refuse; a beam of 10**10 was
    pybind's dump (exit 70)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text("a b c\n")
    result = CliRunner().invoke(COMMANDS[name], args)
    assert result.exit_code == 2 and says in result.output, result.output
    assert not (tmp_path / "lm.arpa").exists()


def test_a_negative_compile_limit_is_refused_before_start_up(tmp_path):
    """`--max-compiles -1` was refused by the run, after loading the data and the model."""
    result = CliRunner().invoke(COMMANDS["b2t-train"], ["--max-compiles", "-1", str(tmp_path), str(tmp_path / "run")])
    assert result.exit_code == 2 and "-1 is not in the range x>=0" in result.output, result.output


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("args", [["--help"], ["build", "--help"]])
def test_help_to_a_full_disk_is_one_line(args):
    """`b2t-lm --help > /dev/full` printed two tracebacks (click's echo, then the exit's flush)."""
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-c", "from b2t.launch import lm; lm()", *args], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "No space left on device" in proc.stderr, proc.stderr


def test_input_errors_exit_2(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello world\n")
    runner = CliRunner()
    for command, args, says in [
        (lm_main, ["build", empty, "-o", tmp_path / "lm.arpa"], "no words"),
        (lm_main, ["lexicon", corpus, "-o", tmp_path / "lex.txt", "--source", empty], "holds no entries"),
        (lm_main, ["lexicon", empty, "-o", tmp_path / "lex.txt"], "empty.txt holds no words"),  # "no pronunciation"
        (preprocess_main, ["build", tmp_path, tmp_path.with_name(tmp_path.name + "-out")], "no session found"),
    ]:
        result = runner.invoke(command, [str(a) for a in args])
        assert result.exit_code == 2 and says in result.output, result.output


def test_lm_build_replaces_its_output_whole_or_not_at_all(tmp_path, monkeypatch):
    corpus, out = tmp_path / "corpus.txt", tmp_path / "lm.arpa"
    corpus.write_text("the cat sat\nthe dog sat\n")
    out.write_text("the earlier model\n")

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    result = CliRunner().invoke(lm_main, ["build", str(corpus), "-o", str(out)])
    assert result.exit_code == 2 and "the disk is full" in result.output, result.output
    assert out.read_text() == "the earlier model\n"
    assert not [p for p in tmp_path.iterdir() if is_temp_name(p.name)], "no temp file left behind"
    monkeypatch.undo()
    assert CliRunner().invoke(lm_main, ["build", str(corpus), "-o", str(out)]).exit_code == 0
    assert out.read_text().lstrip().startswith("\\data\\")
