"""Phoneme log-probabilities -> words: a lexicon-constrained CTC beam search with a word LM.

The search itself is flashlight-text's `LexiconDecoder` (C++; KenLM reads the LM, ARPA or binary);
this module only wires our classes into it and reads the final beam as an n-best list
(`b2t.words.nbest`). The data writes SIL after every word,
including the last, so each word is spelled in the trie as its phonemes followed by SIL:
a word is complete (and scored by the LM) when its closing SIL is emitted, and further
SIL frames between words stay at the trie root. Blank is class 0, as in training.

`WordDecoder.spell_greedy` is the no-LM baseline the beam search is measured against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from flashlight.lib.text.decoder import (
    CriterionType,
    LexiconDecoder,
    LexiconDecoderOptions,
    SmearingMode,
    Trie,
    ZeroLM,
)
from flashlight.lib.text.decoder.kenlm import KenLM
from flashlight.lib.text.dictionary import Dictionary

from b2t.errors import InputFileError, MissingInput, UsageError
from b2t.phonemes import BLANK_ID, N_CLASSES, SILENCE_ID
from b2t.words.kenlm_binary import kenlm_reason
from b2t.words.lexicon import Lexicon, Pronunciation
from b2t.words.nbest import Hypothesis
from b2t.words.ngram import UNK

_FLOAT32_MAX = float(np.finfo(np.float32).max)

MAX_HOMOPHONES = 6
"""Words one flashlight trie node can label (its kTrieMaxLabel); more are not inserted."""


@dataclass(frozen=True, kw_only=True)
class BeamOptions:
    """Search settings; scores add natural-log emissions to lm_weight x log10 LM scores."""

    beam_size: int = 64  # hypotheses kept after each frame
    beam_size_token: int = N_CLASSES  # classes tried per frame (all by default)
    beam_threshold: float = 20.0  # drop hypotheses scoring this far below the frame's best
    lm_weight: float = 1.0  # scale of the LM's log10 word probabilities
    word_score: float = 0.0  # added per word (> 0 favours more, shorter words)
    sil_score: float = 0.0  # added per SIL frame
    unk_score: float = -math.inf  # -inf: only lexicon words (unknown ones never reach the text)
    log_add: bool = False  # merge equal hypotheses by log-sum-exp (True) or max (False)

    def __post_init__(self) -> None:
        if not 1 <= self.beam_size < 2**31:  # the decoder's int
            raise UsageError(f"beam_size must be in 1..2**31-1, got {self.beam_size}")
        if not 1 <= self.beam_size_token <= N_CLASSES:
            raise UsageError(f"beam_size_token must be in 1..{N_CLASSES}, got {self.beam_size_token}")
        if not self.beam_threshold > 0:
            raise UsageError(f"beam_threshold must be > 0, got {self.beam_threshold}")
        if not 0 <= self.lm_weight <= _FLOAT32_MAX:  # the decoder's floats: 1e308 was inf, every trial empty
            raise UsageError(f"lm_weight must be a finite number >= 0, got {self.lm_weight}")
        if not (abs(self.word_score) <= _FLOAT32_MAX and abs(self.sil_score) <= _FLOAT32_MAX):  # nan fails too
            raise UsageError(f"word_score and sil_score must be finite, got {self.word_score} and {self.sil_score}")


def load_lm(path: str | Path, word_dict: Dictionary | None = None) -> KenLM:
    """KenLM's model of `path` (ARPA or binary) over `word_dict`'s words (default: `<unk>` only).

    A file KenLM cannot read, e.g. a truncated binary or a malformed ARPA line, is a ValueError
    naming it: KenLM's own errors name no file.
    """
    if not Path(path).is_file():
        raise MissingInput(f"language model {path} does not exist")
    try:
        return KenLM(str(path), word_dict or Dictionary([UNK]))
    except RuntimeError as e:
        raise InputFileError(f"{path}: KenLM cannot read it: {kenlm_reason(str(e))}") from None


def _padded(sequences: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(W, L) int16 table of the sequences padded with -1, and their (W,) lengths."""
    lengths = np.array([len(s) for s in sequences], dtype=np.int64)  # (W,)
    table = np.full((len(sequences), lengths.max()), -1, dtype=np.int16)  # (W, L)
    for row, seq in zip(table, sequences):
        row[:len(seq)] = seq
    return table, lengths


def _edit_distances(query: Sequence[int], table: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Levenshtein distance from `query` to every row of `table`, all rows at once.

    table: (W, L) candidate sequences padded with -1; lengths: (W,) their true lengths.
    The dynamic programme runs over query and candidate positions; each step is one
    vector operation across the W candidates.
    """
    n_words, width = table.shape
    prev = np.tile(np.arange(width + 1, dtype=np.int32), (n_words, 1))  # (W, L + 1)
    for i, symbol in enumerate(query, start=1):
        replace = prev[:, :-1] + (table != symbol)  # (W, L)
        delete = prev[:, 1:] + 1  # (W, L)
        cur = np.empty_like(prev)
        cur[:, 0] = i
        for j in range(width):
            cur[:, j + 1] = np.minimum(np.minimum(replace[:, j], delete[:, j]), cur[:, j] + 1)
        prev = cur
    return prev[np.arange(n_words), lengths]


class WordDecoder:
    """Decodes one trial's phoneme log-probabilities into words.

    Not thread-safe (the C++ decoder keeps state); with several worker processes build
    one per process from the same (lexicon, lm_path, options). `dropped_homophones` lists
    the lexicon words the trie could not hold (see MAX_HOMOPHONES).
    """

    def __init__(self, lexicon: Lexicon, lm_path: str | Path | None = None,
                 options: BeamOptions | None = None) -> None:
        """lm_path: an ARPA or KenLM binary file (`b2t-lm build`); None searches with the lexicon only."""
        if not len(lexicon):
            raise InputFileError("the lexicon is empty; the decoder could output no word")
        self.lexicon = lexicon
        self.options = options or BeamOptions()
        self._words = [*lexicon.words, UNK]  # word index -> text; UNK last
        word_dict = Dictionary(self._words)
        if lm_path is None:
            lm = ZeroLM()
        else:
            lm = load_lm(lm_path, word_dict)
        trie, self.dropped_homophones = self._trie(lm)
        self._decoder = LexiconDecoder(
            self._options(), trie, lm, SILENCE_ID, BLANK_ID, len(self._words) - 1, [], False)
        self._spellings = {pron: word for word, pron in reversed(list(lexicon.entries()))}
        self._entry_words = [word for word, _ in lexicon.entries()]
        self._table, self._lengths = _padded([pron for _, pron in lexicon.entries()])

    def _options(self) -> LexiconDecoderOptions:
        o = self.options
        return LexiconDecoderOptions(
            beam_size=o.beam_size, beam_size_token=o.beam_size_token, beam_threshold=o.beam_threshold,
            lm_weight=o.lm_weight, word_score=o.word_score, unk_score=o.unk_score, sil_score=o.sil_score,
            log_add=o.log_add, criterion_type=CriterionType.CTC)

    def _trie(self, lm: KenLM | ZeroLM) -> tuple[Trie, list[str]]:
        """Every pronunciation + SIL, labelled with its word and that word's unigram score.

        Max-smearing gives every prefix the best score of the words below it, so partial
        words compete in the beam with an LM estimate instead of none. A trie node holds
        at most MAX_HOMOPHONES words: beyond that the words the LM likes least are left out
        (and returned, so callers can see which words the decoder cannot output).
        """
        start = lm.start(False)
        labels: dict[Pronunciation, list[tuple[float, int]]] = {}  # spelling -> (score, word index)
        for index, word in enumerate(self._words[:-1]):
            _, score = lm.score(start, index)
            for pron in self.lexicon.pronunciations[word]:
                labels.setdefault(pron, []).append((score, index))
        trie = Trie(N_CLASSES, SILENCE_ID)
        dropped: list[str] = []
        for pron, words in labels.items():
            ranked = sorted(words, key=lambda sw: -sw[0])  # stable: ties keep lexicon order
            for score, index in ranked[:MAX_HOMOPHONES]:
                trie.insert([*pron, SILENCE_ID], index, score)
            dropped += [self._words[index] for _, index in ranked[MAX_HOMOPHONES:]]
        trie.smear(SmearingMode.MAX)
        return trie, dropped

    def decode(self, log_probs: np.ndarray | torch.Tensor) -> str:
        """The best word sequence for one trial, words joined by spaces.

        log_probs: (P, 41) log-softmax outputs of the trial's valid frames only (padding
        frames would be read as speech).
        """
        return self.nbest(log_probs, 1)[0].words

    def nbest(self, log_probs: np.ndarray | torch.Tensor, n: int) -> list[Hypothesis]:
        """Up to `n` distinct word sequences of the search's final beam, best first, with their scores.

        log_probs as for `decode`. Hypotheses of the beam that spell the same words (other
        alignments, homophones' paths) are merged into the best-scoring one.
        """
        emissions = torch.as_tensor(log_probs, dtype=torch.float32, device="cpu").detach()
        if emissions.ndim != 2 or emissions.shape[1] != N_CLASSES:
            raise ValueError(f"log_probs must have shape (P, {N_CLASSES}), got {tuple(emissions.shape)}")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if emissions.shape[0] == 0:
            return [Hypothesis(words="", acoustic=0.0, ngram=0.0, n_words=0, beam=0.0)]
        frames = np.ascontiguousarray(emissions.numpy())  # (P, 41) float32, kept alive during decode
        results = sorted(self._decoder.decode(frames.ctypes.data, frames.shape[0], N_CLASSES),
                         key=lambda r: -r.score)  # flashlight returns them best first already; stable
        unk = len(self._words) - 1
        out: dict[str, Hypothesis] = {}
        for r in results:
            words = [self._words[i] for i in r.words if 0 <= i < unk]
            text = " ".join(words)
            if text not in out:
                out[text] = Hypothesis(words=text, acoustic=r.emittingModelScore, ngram=r.lmScore,
                                       n_words=len(words), beam=r.score)
                if len(out) == n:
                    break
        return list(out.values())

    def spell_greedy(self, phoneme_ids: Sequence[int]) -> str:
        """Words for a greedy phoneme sequence without any LM (the baseline to beat).

        phoneme_ids: the greedy CTC output (repeats merged; blanks, if any, are ignored).
        It is split at SIL; each chunk becomes the lexicon word with exactly that
        pronunciation, else the word whose pronunciation is nearest in phoneme edit
        distance. Ties (homophones, equal distances) go to the word listed first.
        """
        chunks: list[list[int]] = [[]]
        for i in phoneme_ids:
            if i == SILENCE_ID:
                chunks.append([])
            elif i != BLANK_ID:
                chunks[-1].append(int(i))
        words = []
        for chunk in filter(None, chunks):
            word = self._spellings.get(tuple(chunk))
            if word is None:
                word = self._entry_words[int(np.argmin(_edit_distances(chunk, self._table, self._lengths)))]
            words.append(word)
        return " ".join(words)
