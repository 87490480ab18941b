"""`b2t-eval`'s word stages end to end on the trained tiny model: n-best lists in trials.jsonl,
rescoring with a tiny causal LM loaded from disk as `--rescore DIR` loads any, weights tuned on
val and applied with `--weights` (val reproduced, the test CSV chosen by them), readable
sentences, and the option combinations refused with what to do."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from b2t.text import normalize_text
from b2t.words.nbest import Hypothesis, Weights, best
from tests.test_eval_cli import read_lines, run_eval

if TYPE_CHECKING:
    from tests.fixtures import TrainedRun

pytest_plugins = ["tests.fixtures"]  # `trained_run`, `causal_lm`
pytest.importorskip("transformers", reason="the rescore extra is not installed")


def words_args(run: TrainedRun) -> list[object]:
    return [run.checkpoint, run.shards, "--backend", "eager", "--lexicon", run.lexicon, "--lm", run.lm]


def nbest_of(trial: dict) -> list[Hypothesis]:
    return [Hypothesis.from_dict(h) for h in trial["nbest"]]


def test_nbest_lists_and_a_rescoring_lm_that_wins_as_its_weight_grows(trained_run: TrainedRun, causal_lm: Path,
                                                                       tmp_path: Path):
    chosen = {}
    for weight in (0, 1000):
        code, output = run_eval(*words_args(trained_run), "--split", "val", "--nbest", 8, "--rescore", causal_lm,
                                "--neural-weight", weight, "--out", tmp_path / str(weight), "--no-progress")
        assert code == 0, output
        chosen[weight] = read_lines(tmp_path / str(weight) / "trials.jsonl")
    for low, high in zip(chosen[0], chosen[1000]):
        hyps = nbest_of(low)
        assert 1 <= len(hyps) <= 8 and len({h.words for h in hyps}) == len(hyps)
        assert all(isinstance(h.neural, float) and h.neural < 0 for h in hyps)
        assert low["decoded_words"] == hyps[0].words  # weight 0: the beam's own choice
        assert nbest_of(high) == hyps  # the same lists; only the choice moves
        lm_best = max(range(len(hyps)), key=lambda i: (hyps[i].neural, -i))
        assert high["decoded_words"] == hyps[lm_best].words  # a huge weight: the LM's favourite
        by_words = {h.words: h.neural for h in hyps}
        assert by_words[high["decoded_words"]] >= by_words[low["decoded_words"]]
    changed = sum(lo["decoded_words"] != hi["decoded_words"] for lo, hi in zip(chosen[0], chosen[1000]))
    print(f"{changed} of {len(chosen[0])} trials chose another sentence at neural weight 1000")
    assert changed >= 1


def test_tuning_on_val_is_never_worse_and_its_file_decodes_val_and_test(trained_run: TrainedRun, causal_lm: Path,
                                                                         tmp_path: Path):
    val = tmp_path / "val"
    code, output = run_eval(*words_args(trained_run), "--split", "val", "--rescore", causal_lm, "--tune",
                            "--out", val, "--no-progress")
    assert code == 0, output
    summary = json.loads((val / "summary.json").read_text())
    tuned = summary["tune"]
    print(f"val WER {tuned['default']['wer']:.4f} at the default weights, {tuned['best']['wer']:.4f} tuned "
          f"({tuned['points']} points)")
    assert tuned["best"]["wer"] <= tuned["default"]["wer"]
    assert summary["wer"] == pytest.approx(tuned["best"]["wer"])  # the trials written are the tuned choice
    assert f"WER {tuned['default']['wer']:.4f} at the default weights" in output
    weights = json.loads((val / "weights.json").read_text())
    assert weights["nbest"] == 32 and weights["rescore"] == str(causal_lm) and weights["weights"] == {
        k: tuned["best"][k] for k in ("lm_weight", "neural_weight", "word_score")}

    again = tmp_path / "again"  # the file on the same split gives what tuning reported
    code, output = run_eval(*words_args(trained_run), "--split", "val", "--rescore", causal_lm,
                            "--weights", val / "weights.json", "--out", again, "--no-progress")
    assert code == 0, output
    assert json.loads((again / "summary.json").read_text())["wer"] == pytest.approx(tuned["best"]["wer"])
    assert [t["decoded_words"] for t in read_lines(again / "trials.jsonl")] == [
        t["decoded_words"] for t in read_lines(val / "trials.jsonl")]

    test = tmp_path / "test"
    code, output = run_eval(*words_args(trained_run), "--split", "test", "--rescore", causal_lm,
                            "--weights", val / "weights.json", "--out", test, "--csv", test / "submission.csv",
                            "--no-progress")
    assert code == 0, output
    w, searched = Weights(**weights["weights"]), Weights(lm_weight=1.0, word_score=0.0)
    trials = read_lines(test / "trials.jsonl")
    for t in trials:
        hyps = nbest_of(t)
        assert t["decoded_words"] == hyps[best(hyps, w, searched)].words
    with (test / "submission.csv").open(newline="") as f:
        rows = list(csv.reader(f))[1:]
    assert [r[1] for r in rows] == [normalize_text(t["decoded_words"]) for t in trials]


def test_sentences_are_printed_beside_their_references_and_written_for_reading(trained_run: TrainedRun,
                                                                               tmp_path: Path):
    code, output = run_eval(*words_args(trained_run), "--split", "val", "--out", tmp_path)  # with progress bars
    assert code == 0, output
    assert "decoding words: 100%" in output  # the bar ends at its total
    trials = read_lines(tmp_path / "trials.jsonl")
    assert "sentences (worst, median, best):" in output
    rates = [t["word_edits"] / len(t["reference_words"].split()) for t in trials]
    worst = max(range(len(trials)), key=lambda i: (rates[i], -i))
    assert f"worst: #{worst} {trials[worst]['session']}" in output
    assert f"  decoded:   {trials[worst]['decoded_words']}\n  reference: {trials[worst]['reference_words']}" in output
    text = (tmp_path / "decoded.txt").read_text()
    for i, t in enumerate(trials):
        assert (f"#{i} {t['session']} block {t['block']} trial {t['trial']} ({t['group']})  words wrong "
                f"{t['word_edits']}/{len(t['reference_words'].split())}\n  decoded:   {t['decoded_words']}\n"
                f"  reference: {t['reference_words']}\n") in text

    code, output = run_eval(*words_args(trained_run), "--split", "test", "--out", tmp_path / "test", "--no-progress")
    assert code == 0, output
    assert "sentences (no references in this split):" in output and "reference:" not in output


@pytest.mark.parametrize("args, message", [
    (["--spell"], "--spell needs a lexicon to decode words with: pass --lexicon FILE or --cmudict"),
    (["--nbest", "4"], "--nbest needs a lexicon"),
    (["--lexicon", "LEX", "--spell", "--nbest", "4"], "--nbest needs the beam search's n-best lists: drop --spell"),
    (["--lexicon", "LEX", "--nbest", "65"], "--nbest 65 is more than --beam-size 64"),
    (["--lexicon", "LEX", "--neural-weight", "1"], "--neural-weight weighs the scores of --rescore DIR"),
    (["--lexicon", "LEX", "--tune-alpha", "0.1"], "--tune-alpha is the chance level of --tune's choice: pass --tune"),
    (["--lexicon", "LEX", "--tune"], "--tune writes the weights to DIR/weights.json: pass --out DIR"),
    (["--lexicon", "LEX", "--tune", "--split", "test", "--out", "OUT"], "the test split has none of"),
    (["--lexicon", "LEX", "--tune", "--weights", "W", "--out", "OUT"], "pass one of them"),
    (["--lexicon", "LEX", "--weights", "W", "--lm-weight", "2"], "sets the search and the weights: drop --lm-weight"),
    (["--lexicon", "LEX", "--weights", "W"], "was tuned with --lm"),
])
def test_word_options_that_cannot_work_together_say_what_to_do(trained_run: TrainedRun, tmp_path: Path,
                                                              args: list[str], message: str):
    (tmp_path / "w.json").write_text(json.dumps({
        "kind": "b2t-eval n-best weights", "version": 1, "weights": {"lm_weight": 1, "neural_weight": 0,
                                                                     "word_score": 0},
        "search": {"beam_size": 64, "beam_threshold": 20, "lm_weight": 1, "word_score": 0, "sil_score": 0},
        "nbest": 4, "lm": "lm.bin", "rescore": None}))
    swap = {"LEX": trained_run.lexicon, "W": tmp_path / "w.json", "OUT": tmp_path / "out"}
    args = [swap.get(a, a) for a in args]
    split = [] if "--split" in args else ["--split", "val"]
    code, output = run_eval(trained_run.checkpoint, trained_run.shards, *split, *args)
    assert code == 2 and message in output, output
    assert "PER" not in output  # refused before the model ran


@pytest.mark.parametrize("search, message", [
    ({"beam_size": 64.5}, "search.beam_size=64.5 (float): expected an integer"),  # pybind's dump, exit 70
    ({"beam_size": 10**30}, "search.beam_size=1000000000000000000000000000000: out of range"),
    ({"beam_size": 2**31}, "beam_size must be in 1..2**31-1"),
    ({"beam_threshold": "Infinity"}, "search.beam_threshold='Infinity' (str): expected a number"),
    ({"beam_width": 8}, "search settings b2t-eval does not use: beam_width"),  # ignored
])
def test_a_weights_files_search_settings_are_checked_like_the_options(trained_run: TrainedRun, tmp_path: Path,
                                                                       search: dict, message: str):
    settings = {"beam_size": 64, "beam_threshold": 20, "lm_weight": 1, "word_score": 0, "sil_score": 0, **search}
    (tmp_path / "w.json").write_text(json.dumps({
        "kind": "b2t-eval n-best weights", "version": 1, "weights": {"lm_weight": 1, "neural_weight": 0,
                                                                     "word_score": 0},
        "search": settings, "nbest": 4, "lm": None, "rescore": None}))
    code, output = run_eval(trained_run.checkpoint, trained_run.shards, "--split", "val", "--lexicon",
                            trained_run.lexicon, "--weights", tmp_path / "w.json")
    assert code == 2 and message in output and "PER" not in output, output


def test_a_bad_lexicon_is_refused_before_the_model_runs(trained_run: TrainedRun, tmp_path: Path):
    """It was read only after the model's pass over the split (and, on a TPU, its warm-up)."""
    (tmp_path / "lexicon.txt").write_text("cat K AE T\nDog D AO G\n")
    code, output = run_eval(trained_run.checkpoint, trained_run.shards, "--split", "val", "--lexicon",
                            tmp_path / "lexicon.txt", "--no-progress")
    assert code == 2 and "not normalised" in output and "warm-up" not in output and "PER" not in output, output
