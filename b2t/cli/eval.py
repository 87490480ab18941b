"""`b2t-eval`: checkpoints -> PER, WER, the competition CSV.

This module parses options, checks their combinations and runs the stages in order: the
model(s) over the split (`b2t.ensemble`, `b2t.evaluate`), the word beam's n-best lists,
their rescoring by a causal LM (`b2t.words.rescore`), the weights tuned on val
(`b2t.words.tune`) or read from a file, the chosen sentences; then it prints and writes
what `b2t.eval_output` describes.
"""

from __future__ import annotations

import time
import typing
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from b2t.cli.options import Finite
from b2t.cli.rule import Command
from b2t.config import BACKENDS, ConfigError, check_value
from b2t.data.dataset import Dataset
from b2t.data.manifest import SPLITS
from b2t.decoding import TrialResult, summarize
from b2t.engine.backend import backend_class
from b2t.engine.devices import use_compile_cache
from b2t.ensemble import Member, evaluate_checkpoints
from b2t.errors import InputFileError, UsageError
from b2t.eval_output import (
    merge_compilations,
    print_samples,
    print_summary,
    write_csv,
    write_outputs,
)
from b2t.evaluate import WordRecipe, choose, decode_words, excluded_trials, rescore, submission_rows, tune_weights
from b2t.paths import DECODED_NAME, SUMMARY_NAME, TRIALS_NAME, WEIGHTS_NAME, Place, RegularFile, refuse_clashes, work_kind
from b2t.run_lock import reading_dataset
from b2t.words.beam import BeamOptions, load_lm
from b2t.words.nbest import Weights
from b2t.words.ngram import check_arpa, is_kenlm_binary
from b2t.words.tune import ALPHA, TuneResult, WeightsFile, load_weights, save_weights

RESCORE_NBEST = 32
"""--nbest when --rescore or --tune is given without it."""
SEARCH_OPTIONS = ("beam_size", "beam_threshold", "lm_weight", "word_score", "sil_score")
"""BeamOptions' fields b2t-eval sets (and a weights file records)."""


@dataclass(frozen=True)
class WordPlan:
    """How words are decoded and chosen: the beam (or spelling) recipe, the weights that choose
    among its n-best lists, the causal LM that rescores them, and whether to tune the weights."""

    recipe: WordRecipe
    weights: Weights
    rescore: Path | None = None
    tune: bool = False
    tune_alpha: float = ALPHA
    weights_file: Path | None = None

    @property
    def beam(self) -> bool:
        return not self.recipe.spell

    def describe(self) -> dict[str, Any]:
        r = self.recipe
        return {"decoder": "spell" if r.spell else "beam", "lexicon": str(r.lexicon or "cmudict"),
                "lm": None if r.lm is None else str(r.lm), "options": search_dict(r.options), "nbest": r.nbest,
                "rescore": None if self.rescore is None else str(self.rescore),
                "weights": self.weights.to_dict() if self.beam else None,
                "weights_file": None if self.weights_file is None else str(self.weights_file)}


def search_dict(options: BeamOptions) -> dict[str, Any]:
    return {k: getattr(options, k) for k in SEARCH_OPTIONS}


def _given(ctx: click.Context, *names: str) -> list[str]:
    """The options among `names` set on the command line (or the environment), as --flags."""
    sources = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    return [f"--{n.replace('_', '-')}" for n in names if ctx.get_parameter_source(n) in sources]


def word_plan(ctx: click.Context, p: dict[str, Any]) -> WordPlan | None:
    """The words the options ask for (None: phonemes only); a combination that cannot work is a usage error."""
    lexicon, cmudict, lm, spell = p["lexicon"], p["cmudict"], p["lm"], p["spell"]
    beam_flags = [flag for flag, on in (("--nbest", p["nbest"] is not None), ("--rescore", p["rescore"] is not None),
                                        ("--neural-weight", bool(_given(ctx, "neural_weight"))),
                                        ("--tune", p["tune"]), ("--weights", p["weights"] is not None)) if on]
    if lexicon is not None and cmudict:
        raise click.UsageError("pass --lexicon FILE or --cmudict, not both")
    if lexicon is None and not cmudict:
        needs = ["--lm"] * (lm is not None) + ["--spell"] * spell + beam_flags
        if needs:
            raise click.UsageError(f"{needs[0]} needs a lexicon to decode words with: pass --lexicon FILE or --cmudict")
        return None
    if spell and lm is not None:
        raise click.UsageError("--spell uses no language model: drop --lm (or --spell for the beam search)")
    if spell and beam_flags:
        raise click.UsageError(f"{beam_flags[0]} needs the beam search's n-best lists: drop --spell")
    if "--neural-weight" in beam_flags and p["rescore"] is None:
        raise click.UsageError("--neural-weight weighs the scores of --rescore DIR: pass --rescore too")
    if _given(ctx, "tune_alpha") and not p["tune"]:
        raise click.UsageError("--tune-alpha is the chance level of --tune's choice: pass --tune too")
    if p["tune"] and p["weights"] is not None:
        raise click.UsageError("--tune searches the weights that --weights applies: pass one of them")
    if p["tune"] and p["split"] == "test":
        raise click.UsageError("--tune needs reference sentences, which the test split has none of: tune on --split val")
    if p["tune"] and p["out"] is None:
        raise click.UsageError(f"--tune writes the weights to DIR/{WEIGHTS_NAME}: pass --out DIR")
    if p["weights"] is not None:
        return _plan_from_file(ctx, p)
    options = BeamOptions(**{k: p[k] for k in SEARCH_OPTIONS})
    nbest = p["nbest"] or (RESCORE_NBEST if p["rescore"] is not None or p["tune"] else 1)
    if nbest > options.beam_size:
        raise click.UsageError(f"--nbest {nbest} is more than --beam-size {options.beam_size}, the most the "
                               "search's final beam holds")
    recipe = WordRecipe(lexicon=lexicon, lm=lm, options=options, spell=spell, nbest=nbest)
    neural = p["neural_weight"] if p["rescore"] is not None else 0.0
    return WordPlan(recipe=recipe, weights=replace(recipe.searched, neural_weight=neural), rescore=p["rescore"],
                    tune=p["tune"], tune_alpha=p["tune_alpha"])


def _plan_from_file(ctx: click.Context, p: dict[str, Any]) -> WordPlan:
    """The plan a --weights file sets: its beam settings, n-best size and weights."""
    path: Path = p["weights"]
    clash = _given(ctx, *SEARCH_OPTIONS, "nbest", "neural_weight")
    if clash:
        raise click.UsageError(f"--weights {path} sets the search and the weights: drop {', '.join(clash)}")
    wf = load_weights(path)
    unknown = sorted(set(wf.search) - set(SEARCH_OPTIONS))
    if unknown:
        raise InputFileError(f"{path}: search settings b2t-eval does not use: {', '.join(unknown)}")
    types = typing.get_type_hints(BeamOptions)
    try:
        options = BeamOptions(**{k: check_value(f"search.{k}", wf.search[k], types[k]) for k in SEARCH_OPTIONS})
    except (KeyError, TypeError, UsageError, ConfigError) as e:
        raise InputFileError(f"{path}: its search settings are not ones b2t-eval uses ({e})") from None
    for flag, used, given in (("--lm", wf.lm, p["lm"]), ("--rescore", wf.rescore, p["rescore"])):
        if used is not None and given is None:
            raise click.UsageError(f"{path} was tuned with {flag} {used}: pass {flag} (the same model)")
        if used is None and given is not None:
            raise click.UsageError(f"{path} was tuned without {flag}: drop {flag}, or tune again with it")
    if wf.lm is not None and p["lm"] is not None and Path(wf.lm).resolve() != Path(p["lm"]).resolve():
        click.echo(f"note: {path} was tuned with --lm {wf.lm}, this run searches with {p['lm']}: its weights were "
                   "chosen for the other LM", err=True)
    if wf.nbest > options.beam_size:
        raise InputFileError(f"{path}: nbest {wf.nbest} is more than its beam_size {options.beam_size}")
    recipe = WordRecipe(lexicon=p["lexicon"], lm=p["lm"], options=options, nbest=wf.nbest)
    return WordPlan(recipe=recipe, weights=wf.weights, rescore=p["rescore"], weights_file=path)


def split_paths(paths: Sequence[Path]) -> tuple[list[Path], Path]:
    """CHECKPOINT... DATASET: the checkpoint files, then the dataset directory."""
    if len(paths) < 2:
        raise click.UsageError("pass one or more checkpoints, then the dataset: CHECKPOINT... DATASET")
    *checkpoints, dataset = paths
    for c in checkpoints:
        if c.is_dir():
            raise click.UsageError(f"{c} is a directory: every path before the dataset is a checkpoint file")
    if not dataset.is_dir():
        raise click.UsageError(f"{dataset} is not a directory: the last path is the dataset (a b2t-preprocess output)")
    return checkpoints, dataset


def check_lm(lm: Path | None) -> None:
    """Read the n-gram LM before the model runs: KenLM's own errors name no file."""
    if lm is None:
        return
    if is_kenlm_binary(lm):
        load_lm(lm)  # a binary maps at once: a corrupt one stops here, not in the decode workers
    else:
        check_arpa(lm)


def tuned_file(plan: WordPlan, result: TuneResult, checkpoints: Sequence[Path], dataset: Path, split: str,
               n_trials: int) -> WeightsFile:
    r = plan.recipe
    return WeightsFile(weights=result.best, search=search_dict(r.options), nbest=r.nbest,
                       lm=None if r.lm is None else str(r.lm),
                       rescore=None if plan.rescore is None else str(plan.rescore),
                       tuned_on={"checkpoints": [str(c) for c in checkpoints], "dataset": str(dataset),
                                 "split": split, "trials": n_trials, **result.to_dict()})


@click.command(cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, required=True, metavar="CHECKPOINT... DATASET", type=RegularFile(dir_okay=True))
@click.option("--split", type=click.Choice(SPLITS[1:]), required=True, help="Which preprocessed split to decode.")
@click.option("--backend", type=click.Choice(BACKENDS), default=None,
              help="How to compile the eval step (default: the backend each checkpoint was trained with).")
@click.option("--device", default=None, help="Device override, e.g. cuda:1.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help=f"Directory for {TRIALS_NAME} (per trial), {DECODED_NAME} (every trial, readable) and "
                   f"{SUMMARY_NAME} (PER/WER tables, compilations, times); --tune also writes {WEIGHTS_NAME}.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, readable=False, path_type=Path), default=None,
              help="Write the competition submission (id,text; one row per trial) here. Needs words.")
@click.option("--lexicon", type=RegularFile(), default=None,
              help="Decode words with this lexicon (`word PH1 PH2 ...` lines, e.g. from `b2t-lm lexicon`).")
@click.option("--cmudict", is_flag=True, help="Decode words with the whole CMU pronouncing dictionary.")
@click.option("--lm", type=RegularFile(), default=None,
              help="n-gram word LM for the beam search: ARPA text or a KenLM binary (from `b2t-lm build`; "
                   "a binary loads at once).")
@click.option("--spell", is_flag=True,
              help="Spell the greedy phonemes into the nearest lexicon words (no search, no LM): the baseline to beat.")
@click.option("--beam-size", type=click.IntRange(min=1, max=2**31 - 1), default=BeamOptions.beam_size, show_default=True,
              help="Hypotheses kept after each frame.")
@click.option("--beam-threshold", type=Finite(min=0, min_open=True), default=BeamOptions.beam_threshold,
              show_default=True, help="Drop hypotheses this far below the best of a frame.")
@click.option("--lm-weight", type=Finite(min=0), default=BeamOptions.lm_weight, show_default=True,
              help="Scale of the LM's log10 word probabilities against the log phoneme probabilities.")
@click.option("--word-score", type=Finite(), default=BeamOptions.word_score, show_default=True,
              help="Added per word (higher favours more, shorter words).")
@click.option("--sil-score", type=Finite(), default=BeamOptions.sil_score, show_default=True,
              help="Added per SIL (word boundary) frame.")
@click.option("--nbest", type=click.IntRange(min=1), default=None,
              help=f"Word hypotheses kept per trial, with their scores, in {TRIALS_NAME} [default: 1; "
                   f"{RESCORE_NBEST} with --rescore or --tune].")
@click.option("--rescore", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="Rescore the n-best with the causal LM in this local Hugging Face directory (OPT, Llama, Mistral, "
                   "GPT-2 ...; nothing is downloaded): score = acoustic + lm_weight x n-gram + neural_weight x "
                   "neural LM + word_score x words. Needs the `rescore` extra.")
@click.option("--neural-weight", type=Finite(min=0), default=0.5, show_default=True,
              help="Scale of the --rescore LM's natural-log sentence probabilities.")
@click.option("--rescore-batch", type=click.IntRange(min=1), default=16, show_default=True,
              help="Hypotheses per forward pass of the --rescore LM.")
@click.option("--rescore-device", default=None,
              help="Device of the --rescore LM [default: cuda when there is one (bf16), else cpu (f32)].")
@click.option("--tune", is_flag=True,
              help=f"Search lm_weight, word_score (and neural_weight with --rescore) for the lowest WER over the "
                   f"split's n-best lists (no new search per point; the untuned weights are a point and win ties), "
                   f"kept only when their gain over the untuned weights is not chance (see --tune-alpha); writes "
                   f"--out DIR/{WEIGHTS_NAME} for --weights.")
@click.option("--tune-alpha", type=Finite(min=0, max=1), default=ALPHA, show_default=True,
              help="--tune replaces the untuned weights only when a paired sign-flip test over the trials gives its "
                   "gain a chance below this; a small val split's few-word gains often reverse on test. "
                   "1 takes the best point always.")
@click.option("--weights", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="Search and choose with the weights --tune wrote (its beam settings and n-best size too).")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Processes decoding words in parallel (each builds its own decoder).")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
@click.option("--compile-cache", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="Persistent compilation cache shared with b2t-train --compile-cache (torch_xla 2.9 stores "
                   "graphs but cannot load them back: pytorch/xla#9094; the warm-up says what it did).")
@click.option("--compile-jobs", type=click.IntRange(min=0), default=None, metavar="N",
              help="openxla: compile up to N buckets' eval graphs at once, while the next are traced (default: "
                   "half this machine's cores). 0 compiles each as its first batch runs, one after another.")
@click.pass_context
def eval_main(ctx: click.Context, **p: Any) -> None:
    """Decode SPLIT of DATASET (a b2t-preprocess output) with CHECKPOINT(s): PER, and words with a lexicon.

    Every batch runs once through the training step's fixed-shape eval graph, compiled once
    per bucket before the first batch. Several checkpoints (same sessions and patching) are
    an ensemble: their per-frame log-probabilities are averaged before decoding. Without
    --lexicon/--cmudict only greedy phonemes are decoded; with one, a lexicon-constrained
    CTC beam search (plus --lm) gives words, WER where the split has sentences, and --csv.
    The beam's n best hypotheses can be rescored by a causal LM (--rescore) and chosen
    among with weights tuned on val (--tune, then --weights on test).
    """
    checkpoints, dataset = split_paths(p["paths"])
    plan = word_plan(ctx, p)
    if p["csv_path"] is not None and plan is None:
        raise click.UsageError("--csv needs words: pass --lexicon FILE or --cmudict (and --lm)")
    refuse_output_clashes(p, checkpoints, dataset)
    ctx.with_resource(reading_dataset(dataset))  # no b2t-preprocess rewrites it meanwhile
    check_lm(p["lm"])
    scorer, load_s = load_scorer(plan, p)
    data = Dataset.open(dataset)  # a missing shard is named when the split is read
    results, members, tuned, seconds = run_stages(plan, checkpoints, data, scorer, p)
    if scorer is not None:
        seconds = {"rescore_load": load_s, **seconds}
    split, out = p["split"], p["out"]
    excluded = excluded_trials(data.manifest, split)
    if excluded:
        click.secho(f"warning: b2t-preprocess left out {len(excluded)} {split} trials (e.g. {excluded[0][0]} "
                    f"{excluded[0][1]}: {excluded[0][2]}); they have no decode and an empty CSV row",
                    fg="yellow", err=True)
    summary = summarize(results)
    if len(members) > 1 and summary.loss is not None:
        click.echo("ensemble members: " + ", ".join(f"{m.checkpoint} PER {m.summary.per.rate():.4f}" for m in members))
    compilations = merge_compilations([m.compiles.to_dict() for m in members])
    print_summary(summary, split, compilations, any(backend_class(m.backend).xla for m in members),
                  len(data.buckets))
    print_samples(results)
    if tuned is not None:
        click.echo(f"tuned on {summary.n_trials} {split} trials ({tuned.points} points over the n-best lists): "
                   + tuned.describe())
    if out is not None:
        report = {"checkpoints": [str(c.resolve()) for c in checkpoints], "dataset": str(dataset.resolve()),  # any cwd
                  "split": split,
                  **summary.to_dict(), "members": [m.to_dict() for m in members], "compilations": compilations,
                  "buckets": len(data.buckets), "excluded": [list(e) for e in excluded],
                  "words": None if plan is None else plan.describe(),
                  "tune": None if tuned is None else tuned.to_dict(), "seconds": seconds}
        title = f"b2t-eval {split} of {dataset}: {summary.n_trials} trials decoded by {', '.join(map(str, checkpoints))}"
        write_outputs(out, results, report, title)
        click.echo(f"wrote {out / TRIALS_NAME}, {out / DECODED_NAME} and {out / SUMMARY_NAME}")
        if tuned is not None and plan is not None:
            save_weights(out / WEIGHTS_NAME, tuned_file(plan, tuned, checkpoints, dataset, split, summary.n_trials))
            click.echo(f"wrote {out / WEIGHTS_NAME}: apply with --weights {out / WEIGHTS_NAME}")
    if p["csv_path"] is not None:
        rows = submission_rows(results, excluded, data.sessions)
        write_csv(p["csv_path"], rows)
        click.echo(f"wrote {p['csv_path']}: {len(rows)} rows")


def refuse_output_clashes(p: dict[str, Any], checkpoints: list[Path], dataset: Path) -> None:
    """Refuse, before anything is read, an --out or --csv that would write over an input."""
    out, csv_path, lexicon, lm, weights = p["out"], p["csv_path"], p["lexicon"], p["lm"], p["weights"]
    written = [DECODED_NAME, TRIALS_NAME, SUMMARY_NAME, WEIGHTS_NAME]
    refuse_clashes([*([Place("--csv", csv_path)] if csv_path else []),
                    *([Place("--out", out, tree=True), *(Place("--out", out / n, kind=work_kind(out / n)) for n in written)]
                      if out else [])],
                   [*(Place("CHECKPOINT", c) for c in checkpoints), Place("DATASET", dataset, tree=True),
                    *([Place("--lexicon", lexicon)] if lexicon else []), *([Place("--lm", lm)] if lm else []),
                    *([Place("--rescore", p["rescore"], tree=True)] if p["rescore"] else []),
                    *([Place("--weights", weights)] if weights else [])])


def load_scorer(plan: WordPlan | None, p: dict[str, Any]) -> tuple[Any, float]:
    """The causal LM that rescores the n-best lists, if the plan asks for one, and the seconds it
    took; loaded before anything else, so that a bad directory (or no transformers) stops here."""
    if plan is None or plan.rescore is None:
        return None, 0.0
    from b2t.words.rescore import CausalLMScorer  # transformers: the rescore extra's

    t0 = time.perf_counter()
    return CausalLMScorer(plan.rescore, p["rescore_device"], p["rescore_batch"]), round(time.perf_counter() - t0, 3)


def run_stages(plan: WordPlan | None, checkpoints: Sequence[Path], data: Dataset, scorer: Any,
               p: dict[str, Any]) -> tuple[list[TrialResult], list[Member], TuneResult | None, dict[str, float]]:
    """The model(s) over the split, then the word stages the plan asks for, each timed (seconds by stage)."""
    progress = not p["no_progress"]
    seconds: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        seconds[name], clock = round(time.perf_counter() - clock, 3), time.perf_counter()

    if plan is not None:  # reads the lexicon: its errors come before the model's pass, not after
        for note in plan.recipe.notes():
            click.echo(f"note: {note}", err=True)
    if p["compile_cache"] is not None:
        use_compile_cache(p["compile_cache"])
    results, members = evaluate_checkpoints(checkpoints, data, p["split"], backend=p["backend"],
                                            device=p["device"], log_probs=plan is not None and plan.beam,
                                            progress=progress, compile_jobs=p["compile_jobs"])
    lap("model")
    tuned = None
    if plan is not None:
        results = decode_words(results, plan.recipe, workers=p["workers"], progress=progress)
        lap("words")
    if scorer is not None:
        results = rescore(results, scorer, progress=progress)
        lap("rescore")
    if plan is not None and plan.beam:
        weights = plan.weights
        if plan.tune:
            tuned = tune_weights(results, plan.recipe.searched, plan.weights, alpha=plan.tune_alpha)
            weights = tuned.best
            lap("tune")
        results = choose(results, weights, plan.recipe.searched)
    return results, members, tuned, seconds
