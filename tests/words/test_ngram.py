"""The ARPA builder: a valid file whose backed-off distributions sum to one, and KenLM agrees."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from flashlight.lib.text.decoder.kenlm import KenLM
from flashlight.lib.text.dictionary import Dictionary
from hypothesis import given

from b2t.cli.lm import main
from b2t.words.ngram import BOS, EOS, NEVER_LOG10, UNK, build_arpa, corpus_vocabulary
from tests.strategies import corpora

CORPUS = [
    "The cat sat on the mat.",
    "the dog sat on the log",
    "a cat ate the rat",
    "the cat's hat, said the cat!",
    "the dog ate",
]

Gram = tuple[str, ...]


def read_arpa(text: str) -> tuple[dict[int, int], dict[Gram, tuple[float, float]]]:
    """The header's n-gram counts and every entry as gram -> (log10 prob, log10 backoff)."""
    lines = text.splitlines()
    assert "\\data\\" in lines and lines[-1] == "\\end\\"
    header = {int(n): int(c) for n, c in (line[len("ngram "):].split("=") for line in lines if line.startswith("ngram "))}
    entries: dict[Gram, tuple[float, float]] = {}
    order = 0
    for line in lines:
        if line.endswith("-grams:"):
            order = int(line[1:line.index("-")])
        elif order and line and not line.startswith("\\"):
            fields = line.split("\t")
            assert len(fields) in (2, 3), line
            gram = tuple(fields[1].split())
            assert len(gram) == order, line
            entries[gram] = (float(fields[0]), float(fields[2]) if len(fields) == 3 else 0.0)
    return header, entries


def log10_prob(entries: dict[Gram, tuple[float, float]], context: Gram, word: str) -> float:
    """ARPA back-off: p(w | h) = p(hw) if listed, else bow(h) * p(w | h minus its oldest word)."""
    word = word if (word,) in entries else UNK
    penalty = 0.0
    while context + (word,) not in entries:
        penalty += entries.get(context, (0.0, 0.0))[1]
        context = context[1:]
    return penalty + entries[context + (word,)][0]


def distribution_sum(entries: dict[Gram, tuple[float, float]], context: Gram) -> float:
    events = [g[0] for g in entries if len(g) == 1 and g != (BOS,)]
    return sum(10 ** log10_prob(entries, context, w) for w in events)


def test_header_counts_and_special_words() -> None:
    header, entries = read_arpa(build_arpa(CORPUS, order=3))
    for n in (1, 2, 3):
        assert header[n] == sum(1 for g in entries if len(g) == n)
    assert {(BOS,), (EOS,), (UNK,)} <= set(entries)
    assert entries[(BOS,)][0] == NEVER_LOG10
    assert not any(len(g) == 3 and b != 0.0 for g, (_, b) in entries.items())  # top order: no backoff
    assert ("the", "cat", "sat") in entries and (BOS, "the", "cat") in entries


@pytest.mark.parametrize("context", [(), (BOS,), (BOS, "the"), ("the", "cat"), ("sat", "on"),
                                     ("cat",), ("zebra", "the"), ("the", "zebra"), ("ate", EOS)])
def test_each_context_distribution_sums_to_one(context: Gram) -> None:
    _, entries = read_arpa(build_arpa(CORPUS, order=3))
    assert distribution_sum(entries, context) == pytest.approx(1.0, abs=1e-5)


@given(corpus=corpora())
def test_every_listed_context_sums_to_one(corpus: list[str]) -> None:
    _, entries = read_arpa(build_arpa(corpus, order=3))
    contexts = {g[:-1] for g in entries} | {g for g in entries if len(g) < 3 and g[-1] != EOS}
    for context in contexts:
        assert distribution_sum(entries, context) == pytest.approx(1.0, abs=1e-5), context


def test_unigram_values_match_the_formula() -> None:
    # Order 1 keeps raw counts: a 2, b 1, </s> 2 -> n1 = 1, n2 = 2, D = 1/5, A = 5,
    # gamma = D * 3 / 5 = 0.12 spread over 4 words (a, b, </s>, <unk>).
    _, entries = read_arpa(build_arpa(["a b", "a"], order=1))
    expected = {"a": 1.8 / 5 + 0.03, "b": 0.8 / 5 + 0.03, EOS: 1.8 / 5 + 0.03, UNK: 0.03}
    for word, p in expected.items():
        assert 10 ** entries[(word,)][0] == pytest.approx(p, rel=1e-6)


def test_lower_orders_use_continuation_counts() -> None:
    # Both words occur 3 times, but "francisco" only ever follows "san": Kneser-Ney gives it
    # the smaller unigram (back-off) probability, unlike raw-count estimates.
    corpus = ["san francisco"] * 3 + ["red glasses", "blue glasses", "green glasses"]
    _, entries = read_arpa(build_arpa(corpus, order=2))
    assert log10_prob(entries, ("mat",), "francisco") < log10_prob(entries, ("mat",), "glasses")
    assert log10_prob(entries, ("san",), "francisco") > log10_prob(entries, ("san",), "glasses")


def test_text_is_normalised_like_the_competition() -> None:
    assert build_arpa(["The CAT.", "a dog's-bone!"]) == build_arpa(["the cat", "a dog's bone"])
    assert corpus_vocabulary(["The CAT.", "a dog's-bone!", "  "]) == {"the", "cat", "a", "dog's", "bone"}


def test_kenlm_reads_it_and_agrees(tmp_path) -> None:
    arpa = build_arpa(CORPUS, order=3)
    (tmp_path / "lm.arpa").write_text(arpa)
    _, entries = read_arpa(arpa)
    words = sorted(corpus_vocabulary(CORPUS)) + ["zebra", UNK]
    vocab = Dictionary(words)
    lm = KenLM(str(tmp_path / "lm.arpa"), vocab)
    for sentence in ["the cat sat on the log", "a dog ate the zebra", "the rat"]:
        state, total, expected, history = lm.start(False), 0.0, 0.0, (BOS,)
        for word in sentence.split():
            state, score = lm.score(state, vocab.get_index(word))
            total += score
            expected += log10_prob(entries, history[-2:], word)
            history += (word,)
        total += lm.finish(state)[1]
        expected += log10_prob(entries, history[-2:], EOS)
        assert total == pytest.approx(expected, abs=1e-4), sentence


def test_rejects_bad_order_and_empty_corpus() -> None:
    with pytest.raises(ValueError, match="order must be >= 1"):
        build_arpa(CORPUS, order=0)
    with pytest.raises(ValueError, match="no words"):
        build_arpa(["", "!!", "123"])


def test_cli_build(tmp_path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS) + "\n")
    result = CliRunner().invoke(main, ["build", str(corpus), "-o", str(tmp_path / "lm.arpa"), "--order", "2"])
    assert result.exit_code == 0, result.output
    header, _ = read_arpa((tmp_path / "lm.arpa").read_text())
    assert sorted(header) == [1, 2] and f"ngram 2={header[2]}" in result.output
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    result = CliRunner().invoke(main, ["build", str(empty), "-o", str(tmp_path / "x.arpa")])
    assert result.exit_code != 0 and "no words" in result.output
