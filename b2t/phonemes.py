"""The phoneme vocabulary: the 41 CTC output classes of the Brain-to-Text '25 data, ids and names.

Index 0 is the CTC blank, 1..39 are ARPAbet phonemes and 40 is SIL, the silence between
words (printed as the word boundary `|`). Every id or name used elsewhere comes from here.
"""

from __future__ import annotations

from collections.abc import Iterable

PHONEMES: tuple[str, ...] = (
    "BLANK",
    "AA", "AE", "AH", "AO", "AW", "AY", "B", "CH", "D", "DH",
    "EH", "ER", "EY", "F", "G", "HH", "IH", "IY", "JH", "K",
    "L", "M", "N", "NG", "OW", "OY", "P", "R", "S", "SH",
    "T", "TH", "UH", "UW", "V", "W", "Y", "Z", "ZH", "SIL",
)
N_CLASSES = len(PHONEMES)
"""CTC outputs: blank plus phoneme classes 1..40."""
BLANK_ID = PHONEMES.index("BLANK")
SILENCE_ID = PHONEMES.index("SIL")
PHONEME_IDS: dict[str, int] = {p: i for i, p in enumerate(PHONEMES)}


def phoneme_string(ids: Iterable[int]) -> str:
    """Space-separated phonemes with SIL printed as the word boundary `|` (blanks dropped)."""
    return " ".join("|" if i == SILENCE_ID else PHONEMES[i] for i in ids if i != BLANK_ID)
