"""b2t-synth --text topics: deterministic, and long-range structure a 3-gram's context does not hold."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import asdict, replace
from pathlib import Path

import h5py
import pytest
from click.testing import CliRunner

from preprocess.synth import draw_corpus, main, read_spec, split_sentences, write_dataset
from preprocess.synth_core import SPEC_NAME, SynthSpec, load_lexicon
from preprocess.synth_text import FUNCTION_WORDS, GAP, TOPICS, TopicModel, build_text_model

SPEC = SynthSpec(sessions=1, train_trials=4, val_trials=3, test_trials=2, corpus_sentences=30, text="topics")


def model(spec: SynthSpec = SPEC) -> TopicModel:
    m = build_text_model(spec, list(load_lexicon()))
    assert isinstance(m, TopicModel)
    return m


def topics(m: TopicModel) -> dict[str, int]:
    """Content word -> its topic."""
    return {m.words[i]: k for k, topic in enumerate(m.topics) for i in topic}


def test_topics_are_drawn_the_same_for_a_seed_and_otherwise_for_another(tmp_path: Path) -> None:
    a, b = model(), model()
    assert a.topics == b.topics and (a.function.successors == b.function.successors).all()
    assert model(replace(SPEC, seed=1)).topics != a.topics
    assert draw_corpus(SPEC, n=200) == draw_corpus(SPEC, n=200)
    assert draw_corpus(replace(SPEC, seed=1), n=200) != draw_corpus(SPEC, n=200)
    assert draw_corpus(replace(SPEC, text="bigram"), n=200) != draw_corpus(SPEC, n=200)
    for name in ("a", "b"):
        write_dataset(SPEC, tmp_path / name)
    for path in sorted((tmp_path / "a").rglob("*")):
        if path.is_file():
            assert path.read_bytes() == (tmp_path / "b" / path.relative_to(tmp_path / "a")).read_bytes(), path


def test_every_sentence_has_one_topic_and_function_words_between_its_content_words() -> None:
    m = model()
    topic = topics(m)
    vocabulary = load_lexicon()
    function = set(list(vocabulary)[:FUNCTION_WORDS])
    assert set(m.function.words) == function
    assert sorted(i for t in m.topics for i in t) == list(range(FUNCTION_WORDS, len(vocabulary)))
    assert len(m.topics) == TOPICS and max(map(len, m.topics)) - min(map(len, m.topics)) <= 1
    sentences = draw_corpus(SPEC, n=2000)
    assert {len(s) for s in sentences} == set(range(SPEC.words[0], SPEC.words[1] + 1))
    for s in sentences:
        assert all((w in function) == (i % (GAP + 1) != 0) for i, w in enumerate(s)), s
        assert len({topic[w] for w in s[::GAP + 1]}) == 1, s


def test_the_topic_is_invisible_to_a_3gram_context_and_known_from_the_first_content_word() -> None:
    """The topic of the second content word (position GAP + 1), guessed as the most frequent
    topic seen with the same context in one half of a corpus, scored on the other half: from
    the two words before it (a 3-gram's context) no better than a guess among TOPICS; from the
    first content word, three words back, always right."""
    topic = topics(model())
    sentences = [s for s in draw_corpus(SPEC, n=8000) if len(s) > GAP + 1]
    train, held_out = sentences[::2], sentences[1::2]

    def accuracy(context: slice) -> float:
        seen: dict[tuple[str, ...], Counter[int]] = defaultdict(Counter)
        for s in train:
            seen[s[context]][topic[s[GAP + 1]]] += 1
        guessed = [seen[s[context]].most_common(1)[0][0] == topic[s[GAP + 1]] for s in held_out if s[context] in seen]
        assert len(guessed) > 0.8 * len(held_out)
        return sum(guessed) / len(guessed)

    assert accuracy(slice(1, GAP + 1)) < 1.5 / TOPICS
    assert accuracy(slice(0, 1)) == 1.0


def test_the_dataset_speaks_the_topic_sentences_and_records_the_text(tmp_path: Path) -> None:
    out = tmp_path / "synth"
    args = [str(out), "--sessions", "1", "--train-trials", "3", "--val-trials", "2", "--test-trials", "2",
            "--corpus-sentences", "20", "--text", "topics", "--preset", "realistic"]
    runner = CliRunner()
    assert runner.invoke(main, args).exit_code == 0
    spec = read_spec(out)
    assert spec is not None and spec.text == "topics"
    topic = topics(model(spec))
    corpus = [tuple(line.split()) for line in (out / "corpus.txt").read_text().splitlines()]
    assert corpus == draw_corpus(spec) and all(len({topic[w] for w in s[::GAP + 1]}) == 1 for s in corpus)
    with h5py.File(next(out.glob("*/data_val.hdf5"))) as f:
        written = [g.attrs["sentence_label"] for g in f.values()]
    assert written == list(split_sentences(spec, "val").values())
    assert all(len({topic[w] for w in s.split()[::GAP + 1]}) == 1 for s in written)
    assert "nothing to do" in runner.invoke(main, args).output
    changed = runner.invoke(main, [*args[:-4], "--text", "bigram", "--preset", "realistic"])
    assert changed.exit_code == 2 and "--overwrite" in changed.output


@pytest.mark.parametrize("value", ["trigram", ""])
def test_an_unknown_text_is_one_line_and_writes_nothing(tmp_path: Path, value: str) -> None:
    result = CliRunner().invoke(main, [str(tmp_path / "synth"), "--text", value])
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert result.exit_code == 2 and len(errors) == 1 and "--text" in errors[0], result.output
    assert not (tmp_path / "synth").exists()
    with pytest.raises(ValueError, match="text must be one of bigram, topics"):
        SynthSpec(text=value)


def test_a_spec_written_before_text_models_reads_as_bigram(tmp_path: Path) -> None:
    spec = replace(SPEC, text="bigram")
    (tmp_path / SPEC_NAME).write_text(json.dumps({k: v for k, v in asdict(spec).items() if k != "text"}))
    assert read_spec(tmp_path) == spec  # so rerunning b2t-synth over an old dataset does nothing
