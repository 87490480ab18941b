"""`b2t-eval` (a checkpoint -> PER, WER, the competition CSV) and `b2t-import-baseline`.

b2t-eval writes, with `--out DIR`: `trials.jsonl` (one line per trial in the competition's
id order: id, session, block, trial, phonemes, reference, edits, words, sentence) and
`summary.json` (PER and WER per session and aggregate, XLA compilations, settings); with
`--csv FILE`: the `id,text` submission, one row per trial of the split. The work lives in
`b2t.evaluate` and `b2t.import_baseline`; this module parses options and writes files.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from b2t.atomic import atomic_write_text
from b2t.cli import config_option, fail, set_option
from b2t.cli_errors import Command
from b2t.config import BACKENDS, XLA_BACKENDS, ConfigError, load_config
from b2t.data.manifest import MANIFEST_NAME, SPLITS, Manifest
from b2t.decoding import EvalSummary, TrialResult, summarize
from b2t.evaluate import Evaluator, WordRecipe, decode_words, excluded_trials, submission_rows
from b2t.paths import Place, RegularFile, refuse_clashes
from b2t.run_lock import reading_dataset
from b2t.train.devices import use_compile_cache
from b2t.words.beam import BeamOptions, load_lm
from b2t.words.lexicon import LexiconError
from b2t.words.ngram import check_arpa, is_kenlm_binary

TRIALS_NAME, SUMMARY_NAME = "trials.jsonl", "summary.json"


def write_csv(path: Path, rows: Sequence[tuple[int, str]]) -> None:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["id", "text"])
    writer.writerows(rows)
    atomic_write_text(path, text.getvalue())


def write_outputs(out: Path, results: Sequence[TrialResult], report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    lines = (json.dumps({"id": i, **r.to_dict()}) + "\n" for i, r in enumerate(results))
    atomic_write_text(out / TRIALS_NAME, "".join(lines))
    atomic_write_text(out / SUMMARY_NAME, json.dumps(report, indent=1) + "\n")


def print_summary(summary: EvalSummary, split: str, compilations: dict[str, Any], backend: str,
                  n_buckets: int) -> None:
    if math.isnan(summary.per.rate()):
        click.echo(f"{split}: {summary.n_trials} trials without reference phonemes (no PER)")
    else:
        click.echo(f"PER on {split} ({summary.n_trials} trials, mean CTC loss {summary.loss:.3f}):")
        click.echo(summary.per.table("PER"))
    if summary.wer is not None:
        click.echo(f"WER on {split}:")
        click.echo(summary.wer.table("WER"))
    if backend in XLA_BACKENDS:
        fallbacks = json.dumps(compilations["fallbacks"]) if compilations["fallbacks"] else "none"
        click.echo(f"XLA compilations: {compilations['warm_up']} warming {n_buckets} buckets, "
                   f"{compilations['during_split']} during the split; host fallbacks: {fallbacks}")


def _word_recipe(lexicon: Path | None, cmudict: bool, lm: Path | None, spell: bool,
                 options: BeamOptions) -> WordRecipe | None:
    if lexicon is not None and cmudict:
        raise click.UsageError("pass --lexicon FILE or --cmudict, not both")
    if lexicon is None and not cmudict:
        if lm is not None or spell:
            raise click.UsageError("--lm and --spell decode words: pass --lexicon FILE or --cmudict too")
        return None
    if spell and lm is not None:
        raise click.UsageError("--spell uses no language model: drop --lm (or --spell for the beam search)")
    return WordRecipe(lexicon=lexicon, lm=lm, options=options, spell=spell)


@click.command(cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("checkpoint", type=RegularFile())
@click.argument("dataset", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--split", type=click.Choice(SPLITS[1:]), required=True, help="Which preprocessed split to decode.")
@click.option("--backend", type=click.Choice(BACKENDS), default=None,
              help="How to compile the eval step (default: the backend the checkpoint was trained with).")
@click.option("--device", default=None, help="Device override, e.g. cuda:1.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help=f"Directory for {TRIALS_NAME} (per trial) and {SUMMARY_NAME} (PER/WER tables, compilations).")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the competition submission (id,text; one row per trial) here. Needs words.")
@click.option("--lexicon", type=RegularFile(), default=None,
              help="Decode words with this lexicon (`word PH1 PH2 ...` lines, e.g. from `b2t-lm lexicon`).")
@click.option("--cmudict", is_flag=True, help="Decode words with the whole CMU pronouncing dictionary.")
@click.option("--lm", type=RegularFile(), default=None,
              help="n-gram word LM for the beam search: ARPA text or a KenLM binary (from `b2t-lm build`; "
                   "a binary loads at once).")
@click.option("--spell", is_flag=True,
              help="Spell the greedy phonemes into the nearest lexicon words (no search, no LM): the baseline to beat.")
@click.option("--beam-size", type=click.IntRange(min=1), default=BeamOptions.beam_size, show_default=True,
              help="Hypotheses kept after each frame.")
@click.option("--beam-threshold", type=click.FloatRange(min=0, min_open=True), default=BeamOptions.beam_threshold,
              show_default=True, help="Drop hypotheses this far below the best of a frame.")
@click.option("--lm-weight", type=click.FloatRange(min=0), default=BeamOptions.lm_weight, show_default=True,
              help="Scale of the LM's log10 word probabilities against the log phoneme probabilities.")
@click.option("--word-score", type=float, default=BeamOptions.word_score, show_default=True,
              help="Added per word (higher favours more, shorter words).")
@click.option("--sil-score", type=float, default=BeamOptions.sil_score, show_default=True,
              help="Added per SIL (word boundary) frame.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Processes decoding words in parallel (each builds its own decoder).")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
@click.option("--compile-cache", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="Persistent compilation cache shared with b2t-train --compile-cache: graphs compiled once are "
                   "loaded from DIR (on TPU and GPU runtimes; the CPU runtime only writes them).")
def eval_main(checkpoint: Path, dataset: Path, split: str, backend: str | None, device: str | None,
              out: Path | None, csv_path: Path | None, lexicon: Path | None, cmudict: bool, lm: Path | None,
              spell: bool, beam_size: int, beam_threshold: float, lm_weight: float, word_score: float,
              sil_score: float, workers: int, no_progress: bool, compile_cache: Path | None) -> None:
    """Decode SPLIT of DATASET (a b2t-preprocess output) with CHECKPOINT: PER, and words with a lexicon.

    Every batch runs once through the training step's fixed-shape eval graph, compiled once
    per bucket before the first batch. Without --lexicon/--cmudict only greedy phonemes are
    decoded; with one, a lexicon-constrained CTC beam search (plus --lm) gives words, WER
    where the split has sentences, and --csv.
    """
    options = BeamOptions(beam_size=beam_size, beam_threshold=beam_threshold, lm_weight=lm_weight,
                          word_score=word_score, sil_score=sil_score)
    recipe = _word_recipe(lexicon, cmudict, lm, spell, options)
    if csv_path is not None and recipe is None:
        raise click.UsageError("--csv needs words: pass --lexicon FILE or --cmudict (and --lm)")
    progress = not no_progress
    refuse_clashes([*([Place("--csv", csv_path)] if csv_path else []),
                    *([Place("--out", out, tree=True), Place("--out", out / TRIALS_NAME),
                       Place("--out", out / SUMMARY_NAME)] if out else [])],
                   [Place("CHECKPOINT", checkpoint), Place("DATASET", dataset, tree=True),
                    *([Place("--lexicon", lexicon)] if lexicon else []), *([Place("--lm", lm)] if lm else [])])
    click.get_current_context().with_resource(reading_dataset(dataset))  # no b2t-preprocess rewrites it meanwhile
    try:
        if lm is not None:
            if is_kenlm_binary(lm):
                load_lm(lm)  # a binary maps at once: a corrupt one stops here, not in the decode workers
            else:
                check_arpa(lm)  # before the model runs: KenLM's own errors name no file
        if compile_cache is not None:
            use_compile_cache(compile_cache)
        evaluator = Evaluator(checkpoint, backend, device)
        manifest = Manifest.load(dataset)
        results, compiles = evaluator.run(dataset, split, log_probs=recipe is not None and not recipe.spell,
                                          progress=progress)
        if recipe is not None:
            results = decode_words(results, recipe, workers=workers, progress=progress)
    except (ConfigError, LexiconError, FileNotFoundError, ValueError) as e:
        fail(str(e))
    excluded = excluded_trials(manifest, split)
    if excluded:
        click.secho(f"warning: b2t-preprocess left out {len(excluded)} {split} trials (e.g. {excluded[0][0]} "
                    f"{excluded[0][1]}: {excluded[0][2]}); they have no decode and an empty CSV row",
                    fg="yellow", err=True)
    summary = summarize(results)
    print_summary(summary, split, compiles.to_dict(), evaluator.backend.name, len(manifest.buckets))
    if out is not None:
        report = {"checkpoint": str(checkpoint), "dataset": str(dataset), "split": split,
                  "backend": evaluator.backend.name, **summary.to_dict(), "compilations": compiles.to_dict(),
                  "buckets": len(manifest.buckets), "excluded": [list(e) for e in excluded],
                  "words": None if recipe is None else {
                      "decoder": "spell" if recipe.spell else "beam", "lexicon": str(lexicon or "cmudict"),
                      "lm": None if lm is None else str(lm), "options": options.__dict__}}
        write_outputs(out, results, report)
        click.echo(f"wrote {out / TRIALS_NAME} and {out / SUMMARY_NAME}")
    if csv_path is not None:
        rows = submission_rows(results, excluded, manifest.sessions)
        write_csv(csv_path, rows)
        click.echo(f"wrote {csv_path}: {len(rows)} rows")


@click.command(cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("path", type=RegularFile(dir_okay=True))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The b2t checkpoint (.safetensors) to write.")
@click.option("--sessions-from", "sessions_path", type=RegularFile(dir_okay=True), default=None,
              help="A b2t-preprocess output (or an args.yaml) whose session list numbers the output's day layers "
                   "[default: the baseline's own list from its args.yaml].")
@click.option("--args", "args_path", type=RegularFile(), default=None,
              help="The baseline's args.yaml [default: the one beside the checkpoint]: model sizes and sessions.")
@config_option
@set_option
def import_main(path: Path, output: Path, sessions_path: Path | None, args_path: Path | None,
                config_path: Path | None, overrides: tuple[str, ...]) -> None:
    """Convert the public baseline checkpoint at PATH (the file, or its release directory) to b2t's format.

    The file is a torch pickle: it is loaded with torch.load(weights_only=True), which only
    rebuilds tensors and plain data and refuses any other object. Model sizes and the recipe
    come from args.yaml beside it (else from --config); each day layer is placed at its
    session's day index in the --sessions-from list.
    """
    from b2t.import_baseline import ARGS_NAME, BaselineError, find_checkpoint, import_baseline

    try:
        source = find_checkpoint(path)
        sessions = Path(sessions_path) / MANIFEST_NAME if sessions_path and Path(sessions_path).is_dir() else sessions_path
        refuse_clashes([Place("-o", output, kind="a checkpoint")],
                       [Place("PATH", source), Place("--args", args_path or source.parent / ARGS_NAME),
                        *([Place("--sessions-from", sessions)] if sessions else [])])
        base = load_config(config_path, overrides)
        report = import_baseline(path, output, sessions_path=sessions_path, args_path=args_path, base=base)
    except (ConfigError, BaselineError, FileNotFoundError, ValueError) as e:
        fail(str(e))
    per = "not stored" if report.val_per is None else f"{report.val_per:.4f}"
    click.echo(f"loaded {path} with torch.load(weights_only=True); model sizes from {report.config_source}")
    click.echo(f"wrote {report.output}: {report.n_days} day layers (of the baseline's {report.baseline_days}); "
               f"the baseline's own val PER: {per}")
