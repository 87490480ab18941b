"""Lexicon files and the packaged CMU dictionary, in our phoneme ids, with clear errors."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from b2t.cli.lm import main
from b2t.phonemes import PHONEME_IDS
from b2t.words.lexicon import Lexicon, LexiconError, cmu_lexicon, load_lexicon


def ids(phonemes: str) -> tuple[int, ...]:
    return tuple(PHONEME_IDS[p] for p in phonemes.split())


def test_load_keeps_alternatives_and_strips_stress(tmp_path) -> None:
    path = tmp_path / "lexicon.txt"
    path.write_text("the DH AH\n\nthe DH IY0\ncat K AE1 T\nthe DH AH\ndon't D OW N T\n")
    lexicon = load_lexicon(path)
    assert lexicon.pronunciations == {
        "the": (ids("DH AH"), ids("DH IY")), "cat": (ids("K AE T"),), "don't": (ids("D OW N T"),)}
    assert lexicon.words == ("the", "cat", "don't") and len(lexicon) == 3 and "cat" in lexicon


@pytest.mark.parametrize("line, message", [
    ("cat K AE QQ", r"lexicon.txt:2: unknown phoneme\(s\) \['QQ'\] for word 'cat'"),
    ("cat K AE SIL", r"lexicon.txt:2: unknown phoneme\(s\) \['SIL'\]"),
    ("Cat K AE T", r"lexicon.txt:2: word 'Cat' is not normalised .* e.g. 'cat'"),
    ("cat", r"lexicon.txt:2: word 'cat' has no phonemes"),
])
def test_malformed_lines_name_file_and_line(tmp_path, line: str, message: str) -> None:
    path = tmp_path / "lexicon.txt"
    path.write_text(f"the DH AH\n{line}\n")
    with pytest.raises(LexiconError, match=message):
        load_lexicon(path)


def test_missing_and_empty_files(tmp_path) -> None:
    with pytest.raises(LexiconError, match="does not exist"):
        load_lexicon(tmp_path / "absent.txt")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(LexiconError, match="holds no entries"):
        load_lexicon(tmp_path / "empty.txt")
    with pytest.raises(LexiconError, match="not normalised"):
        Lexicon({"a.m.": (ids("EY EH M"),)})


def test_restrict_missing_and_write_round_trip(tmp_path) -> None:
    lexicon = Lexicon({"the": (ids("DH AH"), ids("DH IY")), "cat": (ids("K AE T"),), "dog": (ids("D AO G"),)})
    small = lexicon.restrict(["the", "cat", "zebra"])
    assert small.words == ("the", "cat")
    assert lexicon.missing(["the", "zebra", "apple"]) == ["apple", "zebra"]
    small.write(tmp_path / "lexicon.txt")
    assert (tmp_path / "lexicon.txt").read_text() == "the DH AH\nthe DH IY\ncat K AE T\n"
    assert load_lexicon(tmp_path / "lexicon.txt") == small


@pytest.fixture(scope="module")
def cmu() -> Lexicon:
    return cmu_lexicon()


def test_cmu_dictionary_in_our_ids(cmu: Lexicon) -> None:
    assert len(cmu) > 100_000
    assert cmu.pronunciations["hello"] == (ids("HH AH L OW"), ids("HH EH L OW"))
    assert ids("K AE N T") in cmu.pronunciations["can't"]
    assert "a.m." not in cmu and "able-bodied" not in cmu  # not one normalised word


def test_cli_lexicon_from_cmu_and_from_file(tmp_path, cmu: Lexicon) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Hello world.\nthe qqzx world\n")
    out = tmp_path / "lexicon.txt"
    result = CliRunner().invoke(main, ["lexicon", str(corpus), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert load_lexicon(out) == cmu.restrict(["hello", "world", "the"])
    assert "3 of 4 corpus words" in result.output and "qqzx" in result.output

    source = tmp_path / "source.txt"
    source.write_text("world W ER L D\n")
    result = CliRunner().invoke(main, ["lexicon", str(corpus), "-o", str(out), "--source", str(source)])
    assert result.exit_code == 0 and load_lexicon(out).words == ("world",)
    source.write_text("world W ER L DD\n")
    result = CliRunner().invoke(main, ["lexicon", str(corpus), "-o", str(out), "--source", str(source)])
    assert result.exit_code != 0 and "source.txt:1: unknown phoneme" in result.output


def test_a_byte_order_mark_is_not_part_of_the_first_word(tmp_path) -> None:
    """Windows editors write one: the first word was '\ufeffcat', refused as not normalised."""
    (tmp_path / "lex.txt").write_bytes("\ufeffcat K AE T\r\ndog D AO G\r\n".encode())
    assert load_lexicon(tmp_path / "lex.txt").words == ("cat", "dog")
