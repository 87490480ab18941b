"""`b2t-eval` end to end on a trained tiny model: val PER table and per-trial lines, the
test-split submission CSV in the HDF5 trial order, and its clean refusals."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import h5py
from click.testing import CliRunner

from b2t.cli.eval import eval_main
from b2t.cli.report import main as report_main
from b2t.data.manifest import Manifest
from b2t.text import normalize_text

if TYPE_CHECKING:
    from tests.fixtures import TrainedRun

pytest_plugins = ["tests.fixtures"]  # the session-wide `trained_run` fixture


def run_eval(*args: object) -> tuple[int, str]:
    out = CliRunner().invoke(eval_main, [str(a) for a in args])
    assert "Traceback" not in out.output
    return out.exit_code, out.output


def hdf5_order(root: Path, split: str) -> list[tuple[str, int, int]]:
    """(session, block, trial) of every trial: sessions sorted, groups in the file's own order."""
    order = []
    for session in sorted(p for p in root.iterdir() if p.is_dir()):
        path = session / f"data_{split}.hdf5"
        if path.exists():
            with h5py.File(path, "r") as f:
                order += [(session.name, int(f[g].attrs["block_num"]), int(f[g].attrs["trial_num"])) for g in f]
    return order


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_val_end_to_end_per_table_and_trial_lines(trained_run: TrainedRun, tmp_path):
    code, output = run_eval(trained_run.checkpoint, trained_run.shards, "--split", "val", "--backend", "eager",
                            "--out", tmp_path, "--no-progress")
    assert code == 0, output
    manifest = Manifest.load(trained_run.shards)
    n_val = manifest.splits["val"]["n_trials"]
    assert f"PER on val ({n_val} trials" in output
    assert all(re.search(rf"^{re.escape(s)}\s+0\.\d{{4}}\s", output, re.M) for s in manifest.sessions)
    assert re.search(r"^all\s+0\.\d{4}\s", output, re.M)

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["checkpoints"] == [str(trained_run.checkpoint.resolve())]  # b2t-report reads it from any folder
    assert summary["per"] < 0.5 and summary["per"] == trained_run.summary["best_per"]  # as the trainer measured
    trials = read_lines(tmp_path / "trials.jsonl")
    assert [t["id"] for t in trials] == list(range(n_val))  # padding rows skipped, every trial once
    assert [(t["session"], t["block"], t["trial"]) for t in trials] == hdf5_order(trained_run.hdf5, "val")
    assert sum(t["phoneme_edits"] for t in trials) == summary["per_session"]["all"]["edits"]
    assert all(t["reference_phonemes"] and t["reference_words"] and t["decoded_words"] is None for t in trials)
    report = CliRunner().invoke(report_main, [str(trained_run.checkpoint.parent), "--eval", str(tmp_path),
                                              "-o", str(tmp_path / "report.png")])  # as `make demo` draws it
    assert report.exit_code == 0, report.output
    again, output = run_eval(trained_run.checkpoint, trained_run.shards, "--split", "val", "--backend", "eager",
                             "--out", tmp_path, "--no-progress")  # refused: "exists and is b2t-eval's decoded trials"
    assert again == 0 and json.loads((tmp_path / "summary.json").read_text())["per"] == summary["per"], output


def test_test_split_submission_has_one_row_per_trial_in_competition_order(trained_run: TrainedRun, tmp_path):
    code, output = run_eval(trained_run.checkpoint, trained_run.shards, "--split", "test", "--backend", "eager",
                            "--lexicon", trained_run.lexicon, "--lm", trained_run.lm, "--workers", "2",
                            "--csv", tmp_path / "submission.csv", "--out", tmp_path, "--no-progress")
    assert code == 0, output
    with (tmp_path / "submission.csv").open(newline="") as f:
        rows = list(csv.reader(f))
    order = hdf5_order(trained_run.hdf5, "test")
    assert rows[0] == ["id", "text"] and len(rows) == 1 + len(order)
    assert [int(r[0]) for r in rows[1:]] == list(range(len(order)))
    trials = read_lines(tmp_path / "trials.jsonl")
    assert [(t["session"], t["block"], t["trial"]) for t in trials] == order
    assert [r[1] for r in rows[1:]] == [normalize_text(t["decoded_words"]) for t in trials]
    for t in trials:  # the test split has no references: nulls, not zeros or empty strings
        assert t["reference_phonemes"] is t["reference_words"] is t["loss"] is None
        assert t["phoneme_edits"] is t["word_edits"] is None
    assert json.loads((tmp_path / "summary.json").read_text())["loss"] is None
    assert all(re.fullmatch(r"[a-z']+( [a-z']+)*", r[1]) for r in rows[1:])
    assert "no PER" in output and "WER" not in output  # test trials carry no sentences


def test_refusals_are_clean_and_say_why(trained_run: TrainedRun, tmp_path):
    ckpt, shards = trained_run.checkpoint, trained_run.shards
    code, output = run_eval(ckpt, shards, "--split", "test", "--csv", tmp_path / "x.csv")
    assert code == 2 and "--csv needs words" in output
    for csv_path in (tmp_path / "summary.json", tmp_path / "weights.json"):  # the CSV replaced an output of --out
        code, output = run_eval(ckpt, shards, "--split", "val", "--lexicon", trained_run.lexicon, "--lm", trained_run.lm,
                                "--tune", "--out", tmp_path, "--csv", csv_path)
        assert code == 2 and f"--csv {csv_path} is --out {csv_path}: one would write over the other" in output, output
    other_lm = tmp_path / "other.arpa"  # an LM this run does not read: it became the CSV
    other_lm.write_text("\\data\\\n")
    code, output = run_eval(ckpt, shards, "--split", "test", "--lexicon", trained_run.lexicon, "--csv", other_lm)
    assert code == 2 and "exists and is an n-gram LM, which this command does not write" in output, output
    code, output = run_eval(ckpt, shards, "--split", "val", "--lexicon", trained_run.lexicon, "--cmudict")
    assert code == 2 and "not both" in output
    code, output = run_eval(ckpt, shards, "--split", "val", "--lexicon", trained_run.lexicon, "--spell",
                            "--lm", trained_run.lm)
    assert code == 2 and "--spell uses no language model" in output

    other = tmp_path / "other"  # the same dataset, but its last session is another day
    manifest = Manifest.load(shards)
    manifest.sessions[-1] = "t15.2099.01.01"
    manifest.save(other)
    code, output = run_eval(ckpt, other, "--split", "val", "--backend", "eager", "--no-progress")
    assert code == 2 and "trained on 2 sessions" in output and "t15.2099.01.01" in output


def test_a_noise_separating_checkpoint_evaluates_with_no_flag_on_its_clean_head(trained_run: TrainedRun, tmp_path):
    """The family and sizes come from the checkpoint: b2t-eval decodes the clean head and
    writes the CSV, with the PER the trainer measured."""
    from b2t.config import CONFIG_DIR, load_config
    from b2t.train.loop import RunOptions, train
    from tests.fixtures import DATA_OVERRIDES, TRAIN_OVERRIDES

    cfg = load_config(CONFIG_DIR / "noise_tiny.yaml", DATA_OVERRIDES + TRAIN_OVERRIDES)
    summary = train(trained_run.shards, tmp_path / "run", cfg, RunOptions(progress=False))
    ckpt = tmp_path / "run" / "best.safetensors"
    code, output = run_eval(ckpt, trained_run.shards, "--split", "val", "--backend", "eager", "--out", tmp_path / "val",
                            "--no-progress")
    assert code == 0, output
    per = json.loads((tmp_path / "val" / "summary.json").read_text())["per"]
    assert per == summary["best_per"] and per < 0.9  # chance is 1.0
    code, output = run_eval(ckpt, trained_run.shards, "--split", "test", "--backend", "eager", "--lexicon",
                            trained_run.lexicon, "--lm", trained_run.lm, "--csv", tmp_path / "submission.csv",
                            "--out", tmp_path / "test", "--no-progress")
    assert code == 0, output
    assert len((tmp_path / "submission.csv").read_text().splitlines()) == 1 + len(hdf5_order(trained_run.hdf5, "test"))
