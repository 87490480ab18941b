"""The word decoder on synthetic phoneme log-probabilities: it recovers sentences, beats the
no-LM greedy spelling, and its options reach the search."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from b2t.phonemes import BLANK_ID, N_CLASSES, PHONEME_IDS, SILENCE_ID
from b2t.words.beam import MAX_HOMOPHONES, BeamOptions, WordDecoder, _edit_distances, _padded
from b2t.words.lexicon import Lexicon
from b2t.words.ngram import build_arpa

# Grammar words, then distractors that sound alike (never in the corpus). "sun" is listed
# before its homophone "son", so spelling without an LM writes "sun".
PRONUNCIATIONS = """
the DH AH; a AH; my M AY; her HH ER
cat K AE T; dog D AO G; man M AE N; sun S AH N; son S AH N; king K IH NG; friend F R EH N D
boat B OW T; hat HH AE T; bed B EH D; ship SH IH P
sat S AE T; ran R AE N; saw S AO; fed F EH D; met M EH T; hit HH IH T; had HH AE D; got G AA T
on AA N; in IH N; by B AY; near N IH R
cap K AE P; cut K AH T; set S EH T; sit S IH T; men M EH N; bat B AE T; bag B AE G; pan P AE N
dig D IH G; fit F IH T; hid HH IH D; bit B IH T; mat M AE T; rat R AE T; bad B AE D; kit K IH T
"""
DET, NOUN = ["the", "a", "my", "her"], ["cat", "dog", "man", "son", "king", "friend", "boat", "hat", "bed", "ship"]
VERB, PREP = ["sat", "ran", "saw", "fed", "met", "hit", "had", "got"], ["on", "in", "by", "near"]


def ids(phonemes: str) -> tuple[int, ...]:
    return tuple(PHONEME_IDS[p] for p in phonemes.split())


LEXICON = Lexicon({
    word: (ids(pron),)
    for entry in PRONUNCIATIONS.replace("\n", ";").split(";") if entry.strip()
    for word, pron in [entry.split(maxsplit=1)]
})


def sentences(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    pick = lambda words: str(rng.choice(words))  # noqa: E731
    return [
        " ".join([pick(DET), pick(NOUN), pick(VERB)]
                 + ([pick(PREP)] if rng.random() < 0.5 else []) + [pick(DET), pick(NOUN)])
        for _ in range(n)
    ]


def phonemes_of(sentence: str) -> list[int]:
    """The label sequence as the data writes it: each word's phonemes, then SIL."""
    return [p for w in sentence.split() for p in (*LEXICON.pronunciations[w][0], SILENCE_ID)]


def emissions(shown: list[int], truth: list[int], rng: np.random.Generator, margin: float) -> np.ndarray:
    """(P, 41) log-probs: 1-2 frames peaked on each `shown` phoneme, `truth` `margin` below
    it when they differ, blanks between, unit Gaussian noise on every logit."""
    rows = []
    for s, t in zip(shown, truth):
        for _ in range(rng.integers(1, 3)):
            row = rng.normal(0.0, 1.0, N_CLASSES)  # (41,)
            row[s] += 10.0
            if t != s:
                row[t] += 10.0 - margin
            rows.append(row)
        for _ in range(rng.integers(1, 3)):
            row = rng.normal(0.0, 1.0, N_CLASSES)
            row[BLANK_ID] += 10.0
            rows.append(row)
    logits = np.stack(rows)  # (P, 41)
    return (logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)).astype(np.float32)


def confused(truth: list[int], rng: np.random.Generator, rate: float) -> list[int]:
    """`truth` with each non-SIL phoneme replaced by a random other one with probability `rate`."""
    others = [i for i in range(1, SILENCE_ID)]
    return [int(rng.choice([o for o in others if o != t])) if t != SILENCE_ID and rng.random() < rate else t
            for t in truth]


def greedy(log_probs: np.ndarray) -> list[int]:
    """Argmax per frame, repeats merged, blanks dropped."""
    best = log_probs.argmax(axis=1)
    return [int(b) for k, b in enumerate(best) if b != BLANK_ID and (k == 0 or b != best[k - 1])]


def levenshtein(a: list, b: list) -> int:
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        cur = [i]
        for j, y in enumerate(b, start=1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def wer(hypotheses: list[str], references: list[str]) -> float:
    errors = sum(levenshtein(h.split(), r.split()) for h, r in zip(hypotheses, references))
    return errors / sum(len(r.split()) for r in references)


@pytest.fixture(scope="module")
def decoder(lm_path: str) -> WordDecoder:
    return WordDecoder(LEXICON, lm_path)


def test_clean_log_probs_decode_exactly(decoder: WordDecoder) -> None:
    rng = np.random.default_rng(2)
    for sentence in sentences(10, seed=3):
        truth = phonemes_of(sentence)
        assert decoder.decode(emissions(truth, truth, rng, margin=0.0)) == sentence
        no_final_sil = truth[:-1]  # a model that forgets the closing SIL still gets its last word
        assert decoder.decode(emissions(no_final_sil, no_final_sil, rng, margin=0.0)) == sentence


def test_beam_with_lm_beats_greedy_spelling(decoder: WordDecoder) -> None:
    rng = np.random.default_rng(4)
    references = sentences(30, seed=5)
    lexicon_only = WordDecoder(LEXICON)
    beam, lexicon_beam, spelled, phoneme_errors = [], [], [], 0
    for sentence in references:
        truth = phonemes_of(sentence)
        log_probs = emissions(confused(truth, rng, rate=0.25), truth, rng, margin=1.5)
        beam.append(decoder.decode(log_probs))
        lexicon_beam.append(lexicon_only.decode(log_probs))
        spelled.append(decoder.spell_greedy(greedy(log_probs)))
        phoneme_errors += levenshtein(greedy(log_probs), truth)
    per = phoneme_errors / sum(len(phonemes_of(s)) for s in references)
    scores = {"greedy PER": per, "spell_greedy WER": wer(spelled, references),
              "lexicon beam WER": wer(lexicon_beam, references), "beam+LM WER": wer(beam, references)}
    print(" ".join(f"{k}={v:.3f}" for k, v in scores.items()))
    assert per > 0.1  # the greedy phonemes really are wrong
    assert scores["beam+LM WER"] <= 0.05
    assert scores["beam+LM WER"] < scores["lexicon beam WER"] < scores["spell_greedy WER"]


def test_lm_weight_is_applied(lm_path: str) -> None:
    # The frames favour "cap" (P over T by 0.5 nats); the LM has only seen "cat".
    truth = phonemes_of("the cat sat on the bed")
    shown = phonemes_of("the cap sat on the bed")
    log_probs = emissions(shown, truth, np.random.default_rng(6), margin=0.5)
    assert WordDecoder(LEXICON, lm_path, BeamOptions(lm_weight=0.0)).decode(log_probs) == "the cap sat on the bed"
    assert WordDecoder(LEXICON, lm_path, BeamOptions(lm_weight=1.0)).decode(log_probs) == "the cat sat on the bed"


@pytest.mark.parametrize("options, expected", [
    (BeamOptions(word_score=1.0), "a b"), (BeamOptions(word_score=-1.0), "ab"),
    (BeamOptions(sil_score=1.0), "a b"), (BeamOptions(sil_score=-1.0), "ab"),
])
def test_word_and_sil_scores_are_applied(options: BeamOptions, expected: str) -> None:
    # AH, then a frame equally SIL or blank, then B SIL: "a b" (two words, two SILs) and
    # "ab" (one word, one SIL) explain the frames equally well; the scores decide.
    lexicon = Lexicon({"a": (ids("AH"),), "b": (ids("B"),), "ab": (ids("AH B"),)})
    log_probs = np.full((4, N_CLASSES), -30.0, dtype=np.float32)  # (P, 41)
    log_probs[0, PHONEME_IDS["AH"]] = log_probs[2, PHONEME_IDS["B"]] = log_probs[3, SILENCE_ID] = 0.0
    log_probs[1, [SILENCE_ID, BLANK_ID]] = np.log(0.5)
    assert WordDecoder(lexicon, options=options).decode(log_probs) == expected


def test_inputs_torch_numpy_and_shapes(decoder: WordDecoder) -> None:
    truth = phonemes_of("my dog ran near her boat")
    log_probs = emissions(truth, truth, np.random.default_rng(7), margin=0.0)
    assert decoder.decode(torch.from_numpy(log_probs)) == "my dog ran near her boat"
    assert decoder.decode(torch.from_numpy(log_probs).to(dtype=torch.bfloat16)) == "my dog ran near her boat"
    assert decoder.decode(np.zeros((0, N_CLASSES), dtype=np.float32)) == ""
    with pytest.raises(ValueError, match=r"shape \(P, 41\)"):
        decoder.decode(log_probs[:, :40])


@pytest.mark.parametrize("kwargs, message", [
    ({"beam_size": 0}, "beam_size must be in 1..2\\*\\*31-1"), ({"beam_size_token": 42}, "beam_size_token must be in 1..41"),
    ({"beam_threshold": 0.0}, "beam_threshold must be > 0"), ({"lm_weight": -1.0}, "lm_weight must be a finite number >= 0"),
    ({"lm_weight": float("nan")}, "lm_weight must be a finite"), ({"word_score": float("inf")}, "must be finite"),
    ({"sil_score": 1e300}, "must be finite"),  # finite in float64, inf in the decoder's float32 (a --weights file)
])
def test_options_are_validated(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BeamOptions(**kwargs)


def test_missing_lm_file_and_empty_lexicon(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="absent.arpa"):
        WordDecoder(LEXICON, tmp_path / "absent.arpa")
    with pytest.raises(ValueError, match="lexicon is empty"):
        WordDecoder(Lexicon({}))


def test_spell_greedy(decoder: WordDecoder) -> None:
    sil = [SILENCE_ID]
    assert decoder.spell_greedy([*ids("DH AH"), *sil, *ids("K AE T"), *sil]) == "the cat"
    assert decoder.spell_greedy([*ids("K IH NG Z"), *sil, *ids("SH IH")]) == "king ship"  # nearest
    assert decoder.spell_greedy([*ids("S AH N"), *sil]) == "sun"  # homophones: first listed
    assert decoder.spell_greedy([BLANK_ID, *sil, *sil, *ids("DH AH"), BLANK_ID, *sil, *sil]) == "the"
    assert decoder.spell_greedy([]) == ""


def test_homophones_beyond_the_trie_limit_keep_the_likeliest(tmp_path) -> None:
    words = [f"s{chr(ord('a') + k)}" for k in range(MAX_HOMOPHONES + 2)]
    lexicon = Lexicon({w: (ids("S AH N"),) for w in words})
    (tmp_path / "lm.arpa").write_text(build_arpa([words[-1]] * 3))
    decoder = WordDecoder(lexicon, tmp_path / "lm.arpa")
    assert len(decoder.dropped_homophones) == 2 and words[-1] not in decoder.dropped_homophones
    truth = [*ids("S AH N"), SILENCE_ID]
    assert decoder.decode(emissions(truth, truth, np.random.default_rng(8), margin=0.0)) == words[-1]


def test_the_words_the_trie_cannot_hold_are_said_before_the_search(tmp_path) -> None:
    """dropped_homophones was computed and never shown: with --cmudict 224 words can never be output."""
    from b2t.evaluate import WordRecipe

    words = [f"s{chr(ord('a') + k)}" for k in range(MAX_HOMOPHONES + 2)]
    (tmp_path / "lexicon.txt").write_text("".join(f"{w} S AH N\n" for w in words) + "cat K AE T\n")
    [note] = WordRecipe(lexicon=tmp_path / "lexicon.txt").notes()
    assert note.startswith(f"1 spelling is shared by more than {MAX_HOMOPHONES} words (the most: S AH N, 8 words: "
                           "sa, sb, sc, sd, ...)") and "so 2 of those spellings' words never appear" in note
    assert WordRecipe(lexicon=tmp_path / "lexicon.txt", spell=True).notes() == []


@given(query=st.lists(st.integers(1, 5), max_size=6),
       candidates=st.lists(st.lists(st.integers(1, 5), min_size=1, max_size=6), min_size=1, max_size=5))
def test_edit_distances_match_levenshtein(query: list[int], candidates: list[list[int]]) -> None:
    table, lengths = _padded(candidates)
    assert _edit_distances(query, table, lengths).tolist() == [levenshtein(query, c) for c in candidates]
