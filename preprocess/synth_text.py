"""The synthetic sentences' text models, chosen by `b2t-synth --text`.

- `bigram` (the default): `synth_core.WordModel`, a sparse word bigram. A 3-gram LM of
  corpus.txt captures all of it, so a neural LM trained on the same text knows nothing more.
- `topics`: text with long-range structure that an n-gram of order 3 (`b2t-lm build`'s
  default) cannot see, and a neural LM of the whole sentence can, as real English has topics
  whose words recur far apart. The vocabulary's first `FUNCTION_WORDS` words (the, a, an,
  and, ... after: English function words) are function words; the rest, content words, are
  split at random into `TOPICS` topics. Each sentence draws one topic; its words alternate one
  content word of that topic (Zipf-weighted within it) with `GAP` function words, which follow
  a bigram of their own (local structure an n-gram learns) and are drawn independently of the
  topic: C F F C F F C F. The two words before every content word are function words, so a
  3-gram's context never holds the previous content word and says nothing about the topic;
  a model of the whole history knows it from the first content word on (a 4-gram would too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from preprocess.synth_core import SynthSpec, TextModel, WordModel, _rng, _zipf, build_word_model

TOPICS = 8
FUNCTION_WORDS = 24
"""The built-in vocabulary's first words (the ... after), the function words."""
GAP = 2
"""Function words between two content words: one less than the n-gram order that cannot see across it."""
FUNCTION_SUCCESSORS = 4


@dataclass(frozen=True)
class TopicModel:
    """Topic sentences (see the module docstring)."""

    words: tuple[str, ...]
    topics: tuple[tuple[int, ...], ...]  # each topic's content-word indices into `words`, most frequent first
    function: WordModel  # the function words' bigram (its own word list)

    def sample(self, rng: np.random.Generator, n_words: tuple[int, int]) -> tuple[str, ...]:
        n = int(rng.integers(n_words[0], n_words[1] + 1))
        topic = self.topics[int(rng.integers(len(self.topics)))]
        weights = _zipf(len(topic))
        out: list[str] = []
        while len(out) < n:
            out.append(self.words[topic[int(rng.choice(len(topic), p=weights))]])
            if gap := min(GAP, n - len(out)):
                out += [self.function.words[i] for i in self.function.sample_ids(rng, gap)]
        return tuple(out)


def build_topic_model(words: Sequence[str], rng: np.random.Generator) -> TopicModel:
    """Function words first (FUNCTION_WORDS of them), the rest split at random into TOPICS topics."""
    if len(words) < FUNCTION_WORDS + TOPICS:
        raise ValueError(f"a topic model needs more than {FUNCTION_WORDS + TOPICS} words, got {len(words)}")
    content = rng.permutation(np.arange(FUNCTION_WORDS, len(words)))
    topics = tuple(tuple(int(i) for i in part) for part in np.array_split(content, TOPICS))
    function = build_word_model(words[:FUNCTION_WORDS], rng, n_successors=FUNCTION_SUCCESSORS)
    return TopicModel(tuple(words), topics, function)


def build_text_model(spec: SynthSpec, words: Sequence[str]) -> TextModel:
    """The spec's text model over `words` (the lexicon's, in file order), from the seed's own stream."""
    if spec.text == "topics":
        return build_topic_model(words, _rng(spec.seed, 12))
    return build_word_model(list(words), _rng(spec.seed, 0))
