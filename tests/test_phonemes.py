"""The phoneme vocabulary (b2t.phonemes): 41 classes, blank 0, SIL 40 printed as the word boundary."""

from b2t.phonemes import BLANK_ID, N_CLASSES, PHONEME_IDS, PHONEMES, SILENCE_ID, phoneme_string


def test_ids_and_names_are_the_data_s():
    assert (N_CLASSES, BLANK_ID, SILENCE_ID) == (41, 0, 40)
    assert PHONEMES[1] == "AA" and PHONEMES[39] == "ZH" and PHONEME_IDS["SIL"] == 40
    assert phoneme_string([0, 16, 3, 40, 0, 36]) == "HH AH | W"
