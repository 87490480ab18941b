"""The beam's n-best lists (b2t.words.beam, b2t.words.nbest): distinct sentences best first,
scores that add up to the search's own, and a choice that moves as its weights do."""

from __future__ import annotations

import numpy as np
import pytest

from b2t.phonemes import SILENCE_ID
from b2t.words.beam import BeamOptions, WordDecoder
from b2t.words.nbest import Hypothesis, Weights, best, total
from tests.words.test_beam import LEXICON, confused, emissions, phonemes_of, sentences


def noisy_trials(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [emissions(confused(phonemes_of(s), rng, rate=0.25), phonemes_of(s), rng, margin=1.5)
            for s in sentences(n, seed=seed)]


@pytest.mark.parametrize("options", [BeamOptions(), BeamOptions(lm_weight=0.5, word_score=0.7, sil_score=-0.3)])
def test_nbest_is_distinct_best_first_and_its_first_is_decode(lm_path: str, options: BeamOptions) -> None:
    decoder = WordDecoder(LEXICON, lm_path, options)
    searched = Weights(lm_weight=options.lm_weight, word_score=options.word_score)
    for log_probs in noisy_trials(8, seed=11):
        hyps = decoder.nbest(log_probs, 10)
        assert 1 < len(hyps) <= 10 and len({h.words for h in hyps}) == len(hyps)
        assert hyps[0].words == decoder.decode(log_probs)
        assert [h.beam for h in hyps] == sorted((h.beam for h in hyps), reverse=True)
        for h in hyps:
            assert h.n_words == len(h.words.split())
            # the search's total is its parts under its own weights, plus sil_score per SIL emitted
            sils = (h.beam - h.acoustic - options.lm_weight * h.ngram - options.word_score * h.n_words)
            if options.sil_score:
                assert sils / options.sil_score == pytest.approx(round(sils / options.sil_score), abs=1e-6)
            else:
                assert sils == pytest.approx(0.0, abs=1e-9)
        assert best(hyps, searched, searched) == 0  # the beam's own weights keep the beam's choice
        assert [total(h, searched, searched) for h in hyps] == [h.beam for h in hyps]  # bit for bit


def test_reranking_with_another_lm_weight_is_the_beam_with_it(lm_path: str) -> None:
    """Choosing among a wide n-best with lm_weight a gives what the beam searching with a gives
    (a > 0: at 0, homophones tie and either order is right)."""
    wide = WordDecoder(LEXICON, lm_path, BeamOptions(lm_weight=1.0))
    searched = Weights(lm_weight=1.0)
    for a in (0.3, 2.0):
        other = WordDecoder(LEXICON, lm_path, BeamOptions(lm_weight=a))
        for log_probs in noisy_trials(6, seed=12):
            hyps = wide.nbest(log_probs, 64)
            assert hyps[best(hyps, Weights(lm_weight=a), searched)].words == other.decode(log_probs)


def test_a_hypothesis_the_neural_lm_prefers_wins_as_its_weight_grows() -> None:
    searched = Weights(lm_weight=1.0)
    hyps = [Hypothesis("the cap sat", acoustic=-5.0, ngram=-4.0, n_words=3, beam=-9.0, neural=-20.0),
            Hypothesis("the cat sat", acoustic=-6.0, ngram=-4.0, n_words=3, beam=-10.0, neural=-12.0),
            Hypothesis("cat sat", acoustic=-9.0, ngram=-3.0, n_words=2, beam=-12.0, neural=-11.0)]
    chosen = [best(hyps, Weights(lm_weight=1.0, neural_weight=b), searched) for b in (0.0, 0.1, 0.2, 1.0, 10.0)]
    assert chosen == [0, 0, 1, 1, 2]
    neural = [hyps[i].neural for i in chosen]
    assert neural == sorted(neural)  # the chosen sentence's LM score never falls as its weight grows
    assert best(hyps, Weights(lm_weight=1.0, word_score=5.0), searched) == 0  # more words win ties of words
    with pytest.raises(ValueError, match="no neural LM score"):
        best([Hypothesis("a", 0.0, 0.0, 1, 0.0)], Weights(lm_weight=1.0, neural_weight=1.0), searched)


def test_nbest_of_no_frames_and_bad_n(lm_path: str) -> None:
    decoder = WordDecoder(LEXICON, lm_path)
    assert decoder.nbest(np.zeros((0, 41), np.float32), 5) == [Hypothesis("", 0.0, 0.0, 0, 0.0)]
    truth = [*phonemes_of("the cat sat"), SILENCE_ID]
    with pytest.raises(ValueError, match="n must be >= 1"):
        decoder.nbest(emissions(truth, truth, np.random.default_rng(0), margin=0.0), 0)


def test_hypothesis_round_trips_through_its_record() -> None:
    h = Hypothesis("a b", acoustic=-1.5, ngram=-2.25, n_words=2, beam=-3.75, neural=-4.0)
    assert Hypothesis.from_dict(h.to_dict()) == h
