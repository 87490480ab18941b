"""Per-trial results and their summary (b2t.decoding): PER and WER as the competition scores them."""

from __future__ import annotations

import pytest

from b2t.decoding import summarize
from tests.test_evaluate import S1, S2, result


def test_summary_scores_per_and_wer_as_the_competition_does():
    results = [
        result(S1, "trial_0000", [1, 2, 3], [1, 2, 4, 5], words="hello world", sentence="Hello, world!"),
        result(S2, "trial_0000", [7], [7, 8], words="it's fine", sentence="It is fine."),
        result(S2, "trial_0001", [9, 9], words="no reference"),  # a test trial: counted, not scored
    ]
    s = summarize(results)
    assert s.n_trials == 3 and s.loss == 1.0
    assert s.per.rate() == pytest.approx((2 + 1) / (4 + 2)) and s.per.rate(S2) == pytest.approx(0.5)
    assert s.wer.rate(S1) == 0.0 and s.wer.rate() == pytest.approx(2 / 5)  # it's / fine vs it / is / fine
    d = s.to_dict()
    assert d["wer_session"]["groups"][S2]["edits"] == 2 and d["per_session"]["all"]["ref_len"] == 6
    assert summarize(r for r in results if r.decoded_words is None).wer is None
    test_trial = results[2].to_dict()
    assert test_trial["reference_phonemes"] is None and test_trial["phoneme_edits"] is None
    assert test_trial["loss"] is None and test_trial["reference_words"] is None and test_trial["word_edits"] is None
    assert results[0].to_dict()["word_edits"] == 0 and results[0].to_dict()["decoded_words"] == "hello world"


def test_a_split_without_references_has_no_loss():
    assert summarize([result(S1, "trial_0000", [1, 2], words="hi")]).to_dict()["loss"] is None
