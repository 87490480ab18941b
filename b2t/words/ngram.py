"""Word n-gram language models written as ARPA text, built from a sentence corpus.

No LM can be downloaded here, so we estimate one ourselves; the decoder reads the ARPA
text through KenLM (or the binary `b2t.words.kenlm_binary` converts it to). The smoothing
is interpolated Kneser-Ney with one absolute discount per order (Chen & Goodman 1998, "An
empirical study of smoothing techniques for language modeling", section 3.6; Kneser & Ney 1995):

    p_n(w | h) = max(a(hw) - D_n, 0) / A(h) + gamma(h) * p_{n-1}(w | h')
    gamma(h)   = D_n * N1+(h .) / A(h)          A(h) = sum_w a(hw)

where h' drops the oldest word of h, N1+(h .) is the number of distinct words seen after
h, and p_0 is uniform over the vocabulary (every word seen, `</s>` and `<unk>`). The
adjusted count a(g) is the raw count at the highest order and for n-grams starting with
`<s>` (they have no left context), and otherwise the number of distinct words seen
before g (the continuation count that makes lower orders model "how many contexts does
this word complete"). D_n = n1 / (n1 + 2 n2) from the numbers of order-n n-grams with
adjusted count 1 and 2, or FALLBACK_DISCOUNT when either number is zero (tiny corpora).

ARPA stores, for each seen n-gram, log10 p_n(w | h) and, for each n-gram that is itself
a context, log10 gamma as its backoff weight. A reader that backs off (p(w|h) =
bow(h) * p(w|h') for unseen hw) then reproduces the interpolated model exactly, so every
context's distribution sums to one. `<s>` is never predicted (log10 prob -99).
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

from b2t.errors import InputFileError, UsageError
from b2t.text import normalize_text

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
FALLBACK_DISCOUNT = 0.5
NEVER_LOG10 = -99.0
"""The conventional ARPA log10 probability of `<s>`, which is only ever a context."""

Gram = tuple[str, ...]


def sentence_words(sentences: Iterable[str]) -> Iterator[list[str]]:
    """Each sentence's normalised words; empty sentences are skipped."""
    for sentence in sentences:
        words = normalize_text(sentence).split()
        if words:
            yield words


def corpus_vocabulary(sentences: Iterable[str]) -> set[str]:
    """The distinct normalised words of a corpus."""
    return {w for words in sentence_words(sentences) for w in words}


def _raw_counts(sentences: Iterable[str], order: int) -> list[Counter[Gram]]:
    """counts[n - 1][g]: occurrences of each n-gram g in the `<s> ... </s>` padded corpus."""
    counts: list[Counter[Gram]] = [Counter() for _ in range(order)]
    for words in sentence_words(sentences):
        padded = (BOS, *words, EOS)
        for n in range(1, order + 1):
            counts[n - 1].update(padded[i:i + n] for i in range(len(padded) - n + 1))
    return counts


def _adjusted_counts(raw: list[Counter[Gram]]) -> list[dict[Gram, int]]:
    """Kneser-Ney counts: raw at the top order or after `<s>`, else distinct left words."""
    adjusted: list[dict[Gram, int]] = [dict(raw[-1])]
    for n in range(len(raw) - 1, 0, -1):  # orders len(raw)-1 .. 1
        left_words: Counter[Gram] = Counter(g[1:] for g in raw[n])
        adjusted.insert(0, {g: c if g[0] == BOS else left_words[g] for g, c in raw[n - 1].items()})
    adjusted[0].pop((BOS,), None)  # `<s>` is only a context, never an event to predict
    return adjusted


def _discount(counts: Iterable[int]) -> float:
    histogram = Counter(counts)
    n1, n2 = histogram[1], histogram[2]
    return n1 / (n1 + 2 * n2) if n1 and n2 else FALLBACK_DISCOUNT


def _interpolate(adjusted: dict[Gram, int], lower: dict[Gram, float] | None,
                 n_vocab: int) -> tuple[dict[Gram, float], dict[Gram, float]]:
    """One order's probabilities p_n(g) and its contexts' gamma (see module docstring).

    `lower` holds p_{n-1} for every suffix g[1:] (None at order 1: uniform over n_vocab).
    """
    discount = _discount(adjusted.values())
    totals: defaultdict[Gram, int] = defaultdict(int)  # A(h)
    types: defaultdict[Gram, int] = defaultdict(int)  # N1+(h .)
    for g, a in adjusted.items():
        totals[g[:-1]] += a
        types[g[:-1]] += 1
    gamma = {h: discount * types[h] / totals[h] for h in totals}
    probs = {
        g: max(a - discount, 0.0) / totals[g[:-1]]
        + gamma[g[:-1]] * (1.0 / n_vocab if lower is None else lower[g[1:]])
        for g, a in adjusted.items()
    }
    return probs, gamma


def build_arpa(sentences: Iterable[str], order: int = 3) -> str:
    """An interpolated Kneser-Ney `order`-gram model of `sentences` as ARPA text.

    Sentences are normalised like the competition text (`normalize_text`) and padded with
    `<s>` and `</s>`; the vocabulary is every word seen plus `</s>` and `<unk>`.
    """
    if order < 1:
        raise UsageError(f"order must be >= 1, got {order}")
    adjusted = _adjusted_counts(_raw_counts(sentences, order))
    if not adjusted[0]:
        raise InputFileError("the corpus holds no words after normalisation (lower case letters and apostrophes)")
    n_vocab = len(adjusted[0]) + 1  # seen words and </s>, plus <unk>

    probs: list[dict[Gram, float]] = []
    backoffs: dict[Gram, float] = {}  # gamma of every n-gram that is a context
    for n, counts in enumerate(adjusted, start=1):
        p, gamma = _interpolate(counts, probs[-1] if probs else None, n_vocab)
        if n == 1:
            p[(UNK,)] = gamma[()] / n_vocab  # only the uniform share: never seen
        probs.append(p)
        backoffs.update((h, b) for h, b in gamma.items() if h)

    sections = []
    for n, p in enumerate(probs, start=1):
        rows = {g: math.log10(v) for g, v in p.items()}
        if n == 1:
            rows[(BOS,)] = NEVER_LOG10
        lines = [
            f"{rows[g]:.7f}\t{' '.join(g)}" + (f"\t{math.log10(backoffs[g]):.7f}" if g in backoffs else "")
            for g in sorted(rows)
        ]
        sections.append((n, lines))

    header = ["", "\\data\\", *(f"ngram {n}={len(lines)}" for n, lines in sections)]
    body = [line for n, lines in sections for line in ("", f"\\{n}-grams:", *lines)]
    return "\n".join([*header, *body, "", "\\end\\", ""])


KENLM_BINARY_MAGIC = b"mmap lm http://kheafield.com/code"
"""How a KenLM binary model begins (KenLM reads those as well as ARPA text)."""


def is_kenlm_binary(path: str | Path) -> bool:
    """Whether `path` begins like a KenLM binary model (from `b2t-lm build -o lm.bin`)."""
    with open(path, "rb") as f:
        return f.read(len(KENLM_BINARY_MAGIC)) == KENLM_BINARY_MAGIC


def check_arpa(path: str | Path) -> None:
    """Raise ValueError naming `path` unless it begins like an ARPA model (a `\\data\\` line, then
    `ngram N=COUNT` lines) or a KenLM binary: KenLM's own errors name neither file nor format,
    and a binary file makes its message undecodable."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if head.startswith(KENLM_BINARY_MAGIC):
        return
    expected = ("expected an ARPA language model or a KenLM binary (from `b2t-lm build`): "
                "a '\\data\\' line, then 'ngram N=COUNT' lines")
    try:
        lines = [line.strip() for line in head.decode("utf-8").splitlines()]
    except UnicodeDecodeError as e:
        if e.start < len(head) - 4:  # not just a character cut by the read's end
            raise InputFileError(f"{path}: not UTF-8 text (byte {head[e.start]:#04x} at offset {e.start}): "
                                 f"{expected}") from None
        lines = [line.strip() for line in head[: e.start].decode("utf-8").splitlines()]
    lines = [line for line in lines if line]
    if not lines or lines[0] != "\\data\\":
        first = repr(lines[0][:40]) if lines else "nothing"
        raise InputFileError(f"{path}: its first line is {first}: {expected}")
    if len(lines) < 2 or not re.fullmatch(r"ngram [1-9][0-9]*=[0-9]+", lines[1]):
        raise InputFileError(f"{path}: line after '\\data\\' is {lines[1][:40] if len(lines) > 1 else 'missing'!r}: {expected}")
