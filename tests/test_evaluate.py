"""b2t.evaluate: the competition's trial order, PER/WER as scored, words from a lexicon + LM
against spelled greedy phonemes, and one compilation per bucket on the XLA CPU device."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import numpy as np
import pytest

from b2t.data.manifest import Manifest
from b2t.decoding import TrialResult, summarize
from b2t.evaluate import Evaluator, WordRecipe, competition_order, decode_words, submission_rows

if TYPE_CHECKING:
    from tests.fixtures import TrainedRun

pytest_plugins = ["tests.fixtures"]  # the session-wide `trained_run` fixture

S1, S2 = "t15.2023.08.11", "t15.2023.08.13"


def result(session: str, group: str, phonemes=(), reference=(), words=None, sentence=None) -> TrialResult:
    """A hand-made decode of trial `group` of `session` (loss 1 when labelled)."""
    return TrialResult(session=session, block=1, trial=int(group.rpartition("_")[2]), group=group,
                       phonemes=list(phonemes), reference=list(reference), loss=1.0 if reference else 0.0,
                       edits=0, sentence=sentence, words=words)


def test_competition_order_is_sessions_by_day_then_trials_in_file_order():
    want = [result(S1, "trial_0000"), result(S1, "trial_0002"), result(S1, "trial_9999"),
            result(S1, "trial_10000"), result(S2, "trial_0000"), result(S2, "trial_0001")]
    shuffled = want[:]
    random.Random(0).shuffle(shuffled)
    assert competition_order(shuffled, [S1, S2]) == want
    assert competition_order(shuffled, [S2, S1])[0] == result(S2, "trial_0000")
    with pytest.raises(ValueError, match=r"t15\.2023\.08\.13.*not in the session list"):
        competition_order(shuffled, [S1])


def test_submission_keeps_a_row_for_trials_preprocessing_left_out():
    results = [result(S1, "trial_0000", words="Good, morning!"), result(S2, "trial_0001", words="bye")]
    excluded = [(S2, "trial_0000", "shorter than one patch"), (S1, "trial_0001", "unreadable")]
    assert submission_rows(results, excluded, [S1, S2]) == [(0, "good morning"), (1, ""), (2, ""), (3, "bye")]


def test_beam_search_needs_log_probs():
    with pytest.raises(ValueError, match="log_probs=True"):
        decode_words([result(S1, "trial_0000", [1])], WordRecipe(lexicon=None))
    with pytest.raises(ValueError, match="no language model"):
        WordRecipe(lexicon=None, lm="lm.arpa", spell=True)


def test_words_with_lexicon_and_lm_beat_spelling_the_greedy_phonemes(trained_run: TrainedRun):
    results, _ = Evaluator(trained_run.checkpoint, "eager").run(trained_run.shards, "val", log_probs=True,
                                                                 progress=False)
    assert all(r.log_probs.shape == (len(r.log_probs), 41) and r.log_probs.dtype == np.float32 for r in results)
    searched = summarize(decode_words(results, WordRecipe(trained_run.lexicon, trained_run.lm), progress=False))
    spelled = summarize(decode_words(results, WordRecipe(trained_run.lexicon, spell=True), progress=False))
    print(f"val PER {searched.per.rate():.4f}; WER with lexicon + 3-gram LM {searched.wer.rate():.4f}, "
          f"greedy phonemes spelled into words {spelled.wer.rate():.4f}")
    assert searched.per.rate() < 0.5, "the fixture's model did not learn"
    assert searched.wer.rate() <= 0.5 * spelled.wer.rate()
    assert spelled.wer.rate() - searched.wer.rate() >= 0.1


def test_eval_compiles_once_per_bucket_on_xla_and_decodes_as_eager(trained_run: TrainedRun):
    n_buckets = len(Manifest.load(trained_run.shards).buckets)
    results, compiles = Evaluator(trained_run.checkpoint, "xla").run(trained_run.shards, "val", log_probs=True,
                                                                      progress=False)
    count = compiles.to_dict()
    print(f"XLA compilations: {count['warm_up']} warming {n_buckets} buckets, {count['during_split']} during the split")
    assert count["during_split"] == 0
    assert 1 <= count["warm_up"] <= n_buckets
    assert count["fallbacks"] == {}
    eager, _ = Evaluator(trained_run.checkpoint, "eager").run(trained_run.shards, "val", progress=False)
    assert [(r.session, r.group) for r in results] == [(r.session, r.group) for r in eager]
    assert abs(summarize(results).per.rate() - summarize(eager).per.rate()) <= 0.03  # bf16 argmax ties
