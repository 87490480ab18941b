"""KenLM binary LMs from `b2t-lm build -o lm.bin`: the decoder scores and searches exactly as on
the ARPA text, a corrupt binary is one clean error naming the file, and the write is atomic."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner
from flashlight.lib.text.decoder.kenlm import KenLM
from flashlight.lib.text.dictionary import Dictionary

from b2t.cli.eval import eval_main
from b2t.cli.lm import main
from b2t.words import kenlm_binary
from b2t.words.beam import WordDecoder
from b2t.words.kenlm_binary import BuildBinaryError, kenlm_reason, write_binary_lm
from b2t.words.ngram import KENLM_BINARY_MAGIC, UNK, build_arpa, check_arpa
from tests.words.test_beam import LEXICON, confused, emissions, phonemes_of, sentences


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple:
    """(ARPA path, binary path) of one 3-gram model of the test grammar."""
    root = tmp_path_factory.mktemp("lms")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(sentences(400, seed=0)) + "\n")
    for name in ("lm.arpa", "lm.bin"):
        result = CliRunner().invoke(main, ["build", str(corpus), "-o", str(root / name)])
        assert result.exit_code == 0, result.output
    return root / "lm.arpa", root / "lm.bin"


def test_build_writes_a_kenlm_binary_by_suffix(models) -> None:
    arpa, binary = models
    assert binary.read_bytes().startswith(KENLM_BINARY_MAGIC)
    assert arpa.read_text().startswith("\n\\data\\")
    check_arpa(binary)  # b2t-eval's up-front check lets it through


def test_the_binary_scores_every_sentence_exactly_as_the_arpa(models) -> None:
    words = Dictionary([*LEXICON.words, UNK])
    lms = [KenLM(str(path), words) for path in models]
    for sentence in [*sentences(50, seed=9), "cap the the sun near", "friend"]:  # seen and unseen n-grams
        totals = []
        for lm in lms:
            state, total = lm.start(False), 0.0
            for word in sentence.split():
                state, score = lm.score(state, words.get_index(word))
                total += score
            totals.append(total + lm.finish(state)[1])
        assert totals[0] == totals[1], sentence


def test_the_beam_search_decodes_alike_on_either(models) -> None:
    arpa, binary = (WordDecoder(LEXICON, path) for path in models)
    rng = np.random.default_rng(10)
    for sentence in sentences(20, seed=11):
        truth = phonemes_of(sentence)
        log_probs = emissions(confused(truth, rng, rate=0.3), truth, rng, margin=1.5)
        assert binary.decode(log_probs) == arpa.decode(log_probs)


@pytest.mark.parametrize("keep", [0.5, 0.05])  # tables cut short; the header itself cut short
def test_a_truncated_binary_is_a_clean_error_naming_it(models, tmp_path, keep: float) -> None:
    data = models[1].read_bytes()
    path = tmp_path / "cut.bin"
    path.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(ValueError, match=r"cut\.bin: KenLM cannot read it: ") as caught:
        WordDecoder(LEXICON, path)
    assert "\n" not in str(caught.value) and ".cc:" not in str(caught.value)


def test_b2t_eval_refuses_a_truncated_binary_before_the_model_runs(models, tmp_path) -> None:
    data = models[1].read_bytes()
    (tmp_path / "cut.bin").write_bytes(data[:len(data) // 2])
    (tmp_path / "lexicon.txt").write_text("cat K AE T\n")
    (tmp_path / "ckpt").write_bytes(b"never read")  # the LM is checked first
    result = CliRunner().invoke(eval_main, [str(tmp_path / "ckpt"), str(tmp_path), "--split", "val", "--lexicon",
                                            str(tmp_path / "lexicon.txt"), "--lm", str(tmp_path / "cut.bin"),
                                            "--workers", "2"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path / 'cut.bin'}: KenLM cannot read it: "), lines
    assert f"Binary file has size {len(data) // 2} but the headers say" in lines[0]


def test_a_failed_build_leaves_the_old_model_and_no_temp(tmp_path, monkeypatch) -> None:
    corpus, out = tmp_path / "corpus.txt", tmp_path / "lm.bin"
    corpus.write_text("a b c d e f g h\n")
    assert CliRunner().invoke(main, ["build", str(corpus), "-o", str(out)]).exit_code == 0
    before = out.read_bytes()
    failing = tmp_path.parent / f"{tmp_path.name}-build_binary"  # fails as KenLM's does: a message, exit 1
    failing.write_text("#!/bin/sh\necho 'This model has order 7 but KenLM was compiled to support up to 6.' >&2\n"
                       "exit 1\n")
    failing.chmod(0o755)
    monkeypatch.setattr(kenlm_binary, "find_build_binary", lambda: failing)
    result = CliRunner().invoke(main, ["build", str(corpus), "-o", str(out)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "lm.bin" in result.output and "order 7" in result.output and len(result.output.strip().splitlines()) == 1
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "lm.bin"]


def test_without_build_binary_the_error_says_what_to_do(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(kenlm_binary, "find_build_binary", lambda: None)
    with pytest.raises(BuildBinaryError, match=r"build_binary is not installed .*make install.*-o .*lm\.arpa"):
        write_binary_lm(build_arpa(["a b"]), tmp_path / "lm.bin")
    assert not list(tmp_path.iterdir())


def test_kenlm_reason_keeps_the_human_line() -> None:
    message = ("lm/binary_format.cc:160 in void* LoadBinary(std::size_t) threw FormatLoadException because `x'.\n"
               "Binary file has size 727 but the headers say it should be at least 1392\nERROR\n")
    assert kenlm_reason(message) == "Binary file has size 727 but the headers say it should be at least 1392"
    assert kenlm_reason("just one line") == "just one line" and kenlm_reason("") == "no reason given"
