"""Weights tuned over kept n-best lists (b2t.words.tune): never worse than the defaults, the
right weights where they are known, and a weights file that says what is wrong with it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from b2t.words.nbest import Hypothesis, Weights, best
from b2t.words.tune import Grid, NBestTable, WeightsFile, load_weights, save_weights, sign_flip_p, tune

SEARCHED = Weights(lm_weight=1.0)


def hyp(acoustic: float, ngram: float, n_words: int, neural: float | None = None) -> Hypothesis:
    return Hypothesis(f"w{acoustic}{ngram}{n_words}", acoustic=acoustic, ngram=ngram, n_words=n_words,
                      beam=acoustic + SEARCHED.lm_weight * ngram, neural=neural)


def test_errors_are_the_edits_of_what_each_point_chooses():
    nbests = [[hyp(-1.0, -5.0, 2), hyp(-2.0, -1.0, 2)], [hyp(-1.0, -1.0, 3)]]
    edits = [[3, 0], [1]]
    table = NBestTable(nbests, edits, SEARCHED)
    points = [Weights(lm_weight=0.0), SEARCHED, Weights(lm_weight=2.0)]
    assert table.errors(points).tolist() == [3 + 1, 0 + 1, 0 + 1]
    for point, errors in zip(points, table.errors(points)):  # the same choice as nbest.best, trial by trial
        assert errors == sum(e[best(n, point, SEARCHED)] for n, e in zip(nbests, edits))


def test_tuning_finds_the_lm_weight_that_fixes_the_trials():
    # each trial: the right sentence scores lower acoustically, higher by the n-gram: only a > 1.5 picks it
    nbests = [[hyp(-1.0, -4.0, 3), hyp(-2.5, -3.0, 3)] for _ in range(5)]
    result = tune(NBestTable(nbests, [[2, 0]] * 5, SEARCHED), reference_words=15)
    assert result.default_errors == 10 and result.best_errors == 0 and result.best.lm_weight > 1.5
    assert result.best_wer == 0.0 and result.default_wer == pytest.approx(10 / 15)
    assert result.best.neural_weight == 0.0  # no neural scores: not searched


def test_the_coordinate_search_walks_past_the_grids_edge():
    # each right sentence has 2 more words and 11.4-14.4 nats less acoustically: word_score > 5.7 ... 7.2 picks it
    nbests = [[hyp(-1.0, -3.0, 3), hyp(-1.0 - gap, -3.0, 5)] for gap in (11.4, 12.4, 13.4, 14.4)]
    result = tune(NBestTable(nbests, [[2, 0]] * 4, SEARCHED), reference_words=20, alpha=1.0)
    assert max(Grid().word_score) < 7.2 < result.best.word_score and result.best_errors == 0


def test_ties_keep_the_default_weights_even_off_the_grid():
    default = Weights(lm_weight=0.37, word_score=0.11)  # on no grid line
    nbests = [[hyp(-1.0, -1.0, 2), hyp(-9.0, -9.0, 2)]]
    result = tune(NBestTable(nbests, [[0, 2]], Weights(lm_weight=0.37, word_score=0.11)), 2, default)
    assert result.best == default and result.best_errors == result.default_errors == 0
    assert result.kept_default and result.to_dict()["kept_default"]  # weights.json said false beside "defaults kept"


def test_default_weights_that_only_they_get_right_are_kept():
    """Right in both trials only for 0.91 < lm_weight < 0.92, between the grid's points and the
    coordinate search's: the default 0.915 must still win."""
    nbests = [[hyp(0.0, -10.0, 2), hyp(-0.91, -9.0, 2)],  # the second is right: needs lm_weight > 0.91
              [hyp(0.0, -10.0, 2), hyp(-0.92, -9.0, 2)]]  # the first is right: needs lm_weight < 0.92
    table = NBestTable(nbests, [[1, 0], [0, 1]], SEARCHED)
    default = Weights(lm_weight=0.915)
    result = tune(table, 4, default)
    assert result.best == default and result.best_errors == 0
    assert min(table.errors([Weights(lm_weight=a) for a in Grid().lm_weight])) == 1


def test_the_neural_weight_is_searched_when_every_hypothesis_has_a_score():
    nbests = [[hyp(-1.0, -2.0, 2, neural=-30.0), hyp(-1.5, -2.0, 2, neural=-10.0)] for _ in range(3)]
    result = tune(NBestTable(nbests, [[1, 0]] * 3, SEARCHED), 6, alpha=1.0)
    assert result.default_errors == 3 and result.best_errors == 0 and result.best.neural_weight > 0
    with pytest.raises(ValueError, match="neural LM score"):
        tune(NBestTable([[hyp(-1.0, -2.0, 2)]], [[0]], SEARCHED), 2, Weights(lm_weight=1.0, neural_weight=0.5))


def test_a_gain_within_chance_keeps_the_defaults_and_a_clear_one_replaces_them():
    """Every trial the same pair: 1.5 nats less acoustically and 1 more by the n-gram for the
    second, chosen once lm_weight > 1.5. Where it is right a higher weight fixes the trial, where
    the first is right it breaks it: 6 fixed and 4 broken is a gain of 2 words that random signs
    reach with p = 386/1024; 9 fixed and 1 broken, p = 11/1024."""
    pair = [hyp(-1.0, -4.0, 3), hyp(-2.5, -3.0, 3)]

    def result(n_fixed: int, n_broken: int, alpha: float = 0.05):
        table = NBestTable([pair] * (n_fixed + n_broken), [[1, 0]] * n_fixed + [[0, 1]] * n_broken, SEARCHED)
        return tune(table, 30, alpha=alpha)

    unclear, clear = result(6, 4), result(9, 1)
    assert unclear.found_errors == 4 < unclear.default_errors == 6 and unclear.found.lm_weight > 1.5
    assert unclear.kept_default and unclear.best == unclear.default and unclear.best_errors == 6
    assert unclear.p_value == pytest.approx(386 / 1024) and "kept the defaults" in unclear.describe()
    assert not clear.kept_default and clear.best == clear.found and clear.best_errors == 1
    assert clear.p_value == pytest.approx(11 / 1024) and "chose the best point" in clear.describe()
    assert result(6, 4, alpha=1.0).best_errors == 4  # alpha 1: the best point whatever its gain


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=1, max_size=12))
def test_the_sign_flip_p_value_is_the_exact_share_of_sign_patterns(gains: list[int]):
    g = np.array(gains)
    nonzero = g[g != 0]
    patterns = np.array(np.meshgrid(*[[-1, 1]] * len(nonzero))).reshape(len(nonzero), -1) if len(nonzero) else None
    if g.sum() <= 0:
        assert sign_flip_p(g) == 1.0
    else:
        sums = (np.abs(nonzero)[:, None] * patterns).sum(0)
        assert sign_flip_p(g) == pytest.approx(np.mean(sums >= g.sum()))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.booleans())
def test_tuning_is_never_worse_than_the_defaults(seed: int, neural: bool):
    rng = np.random.default_rng(seed)
    nbests, edits = [], []
    for _ in range(int(rng.integers(1, 8))):
        n = int(rng.integers(1, 6))
        nbests.append([hyp(float(rng.normal(-5, 2)), float(rng.normal(-5, 2)), int(rng.integers(1, 6)),
                           float(rng.normal(-20, 5)) if neural else None) for _ in range(n)])
        edits.append([int(e) for e in rng.integers(0, 4, n)])
    default = Weights(lm_weight=float(rng.uniform(0, 2)), neural_weight=float(rng.uniform(0, 1)) if neural else 0.0,
                      word_score=float(rng.normal()))
    table = NBestTable(nbests, edits, SEARCHED)
    result = tune(table, 10, default, Grid(rounds=2), alpha=float(rng.choice([0.05, 1.0])))
    assert result.best_errors <= result.default_errors and result.found_errors <= result.best_errors
    assert result.best in (result.default, result.found) and (result.best == result.found) == (
        result.p_value < result.alpha and result.found != result.default or result.found == result.default)
    assert result.default_errors == sum(e[best(n, default, SEARCHED)] for n, e in zip(nbests, edits))
    assert result.best_errors == table.errors([result.best])[0]


def test_a_weights_file_round_trips_and_bad_ones_say_why(tmp_path):
    wf = WeightsFile(weights=Weights(lm_weight=1.5, neural_weight=0.3, word_score=-0.5),
                     search={"beam_size": 64, "lm_weight": 1.0}, nbest=32, lm="lm.bin", rescore="lm_dir",
                     tuned_on={"split": "val"})
    save_weights(tmp_path / "w.json", wf)
    assert load_weights(tmp_path / "w.json") == wf
    with pytest.raises(FileNotFoundError, match="absent.json does not exist"):
        load_weights(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"bad\.json: not a weights file"):
        load_weights(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"kind": "something else"}))
    with pytest.raises(ValueError, match=r"other\.json: not a weights file"):
        load_weights(tmp_path / "other.json")
    d = wf.to_dict()
    del d["weights"]["lm_weight"]
    (tmp_path / "partial.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match=r"partial\.json: a weights file with a missing or malformed field"):
        load_weights(tmp_path / "partial.json")


@pytest.mark.parametrize("field, value, message", [
    ("lm_weight", "nan", r"weights.lm_weight='nan' \(str\): expected a number"),  # float("nan"): accepted
    ("lm_weight", float("nan"), r"weights.lm_weight=nan: expected a finite number"),  # summary.json held NaN
    ("lm_weight", -50, r"the LM weights must be >= 0"),  # accepted: a worse WER
    ("word_score", True, r"weights.word_score=True \(bool\): expected a number"),
    ("nbest", 2.7, r"nbest=2.7 \(float\): expected an integer"),  # int(): 2
    ("nbest", True, r"nbest=True \(bool\): expected an integer"),  # int(): 1
    ("neural_weight", 0.5, r"neural_weight 0.5 without a --rescore LM"),  # exit 70 in the choice
])
def test_a_weights_file_value_of_the_wrong_type_or_range_is_refused(tmp_path, field, value, message):
    d = WeightsFile(weights=Weights(lm_weight=1.5), search={"beam_size": 64}, nbest=8, lm="lm.bin",
                    rescore=None).to_dict()
    (d if field == "nbest" else d["weights"])[field] = value
    (tmp_path / "w.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match=rf"w\.json: {message}"):
        load_weights(tmp_path / "w.json")
