"""The one text rule: how sentences become the competition's words.

Used everywhere words are compared or written: WER (`b2t.metrics`), lexicon entries and
LM corpora (`b2t.words`) and the submission CSV (`b2t.evaluate`), so a word scored is a
word the decoder could have produced and the CSV writes.

The rule: lower case; hyphens and dashes separate words ("well-known" -> "well known");
every other character that is not a letter, an apostrophe or white space is dropped
("U.S." -> "us"); tokens made of apostrophes only are dropped; words are separated by one
space.
"""

from __future__ import annotations

import re

_SEPARATORS = re.compile(r"[-\u2010-\u2015]")  # hyphen-minus, Unicode hyphens and dashes
_NOT_KEPT = re.compile(r"[^a-z'\s]")
_WORD = re.compile(r"[a-z']*[a-z][a-z']*")


def words_of(text: str) -> list[str]:
    """The words of `text` under the rule above."""
    text = _NOT_KEPT.sub("", _SEPARATORS.sub(" ", text.lower()))
    return [w for w in text.split() if w.strip("'")]


def normalize_text(text: str) -> str:
    """`text` in the competition's form: its words joined by single spaces."""
    return " ".join(words_of(text))


def is_word(token: str) -> bool:
    """True when `token` is one word in normalised form (what a lexicon and an LM may hold)."""
    return _WORD.fullmatch(token) is not None
