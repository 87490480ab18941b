"""b2t.evaluate: the competition's trial order, PER/WER as scored, words from a lexicon + LM
against spelled greedy phonemes (one compilation per bucket on XLA: tests/test_ensemble.py, per member)."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import numpy as np
import pytest

from b2t.data.dataset import Dataset
from b2t.decoding import TrialResult, summarize
from b2t.evaluate import Evaluator, WordRecipe, competition_order, decode_words, submission_rows

if TYPE_CHECKING:
    from tests.fixtures import TrainedRun

pytest_plugins = ["tests.fixtures"]  # the session-wide `trained_run` fixture

S1, S2 = "t15.2023.08.11", "t15.2023.08.13"


def result(session: str, group: str, phonemes=(), reference=None, words=None, sentence=None,
           nbest=None) -> TrialResult:
    """A hand-made decode of trial `group` of `session` (loss 1 when labelled; None fields where unlabelled)."""
    ref = None if reference is None else list(reference)
    return TrialResult(session=session, block=1, trial=int(group.rpartition("_")[2]), group=group,
                       decoded_phonemes=list(phonemes), reference_phonemes=ref, loss=None if ref is None else 1.0,
                       phoneme_edits=None if ref is None else 0, reference_words=sentence, decoded_words=words,
                       nbest=None if nbest is None else tuple(nbest))


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
    results, _ = Evaluator(trained_run.checkpoint, "eager").run(Dataset.open(trained_run.shards), "val", log_probs=True,
                                                                 progress=False)
    assert all(r.log_probs.shape == (len(r.log_probs), 41) and r.log_probs.dtype == np.float32 for r in results)
    searched = summarize(decode_words(results, WordRecipe(trained_run.lexicon, trained_run.lm), progress=False))
    spelled = summarize(decode_words(results, WordRecipe(trained_run.lexicon, spell=True), progress=False))
    print(f"val PER {searched.per.rate():.4f}; WER with lexicon + 3-gram LM {searched.wer.rate():.4f}, "
          f"greedy phonemes spelled into words {spelled.wer.rate():.4f}")
    assert searched.per.rate() < 0.5, "the fixture's model did not learn"
    assert searched.wer.rate() <= 0.5 * spelled.wer.rate()
    assert spelled.wer.rate() - searched.wer.rate() >= 0.1
