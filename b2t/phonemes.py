"""The 41 CTC output classes of the Brain-to-Text '25 data and their printed forms."""

from __future__ import annotations

from collections.abc import Iterable

from b2t.contract import BLANK_ID, N_CLASSES, SILENCE_ID

PHONEMES: tuple[str, ...] = (
    "BLANK",
    "AA", "AE", "AH", "AO", "AW", "AY", "B", "CH", "D", "DH",
    "EH", "ER", "EY", "F", "G", "HH", "IH", "IY", "JH", "K",
    "L", "M", "N", "NG", "OW", "OY", "P", "R", "S", "SH",
    "T", "TH", "UH", "UW", "V", "W", "Y", "Z", "ZH", "SIL",
)
assert len(PHONEMES) == N_CLASSES and PHONEMES[BLANK_ID] == "BLANK" and PHONEMES[SILENCE_ID] == "SIL"

PHONEME_IDS: dict[str, int] = {p: i for i, p in enumerate(PHONEMES)}


def phoneme_string(ids: Iterable[int]) -> str:
    """Space-separated phonemes with SIL printed as the word boundary `|` (blanks dropped)."""
    return " ".join("|" if i == SILENCE_ID else PHONEMES[i] for i in ids if i != BLANK_ID)
