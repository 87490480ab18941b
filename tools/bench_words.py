"""Words as the field gets them, measured on `b2t-synth --preset realistic`: val and test WER of
greedy phonemes spelled into words, the n-gram beam at its default weights, the same beam with
its weights tuned on val, the n-best rescored by a small causal LM (weights tuned with it), and
an ensemble of the seeds' checkpoints; the time each stage adds per 100 trials.

Steps, each kept in WORKDIR and skipped when done (a re-run resumes):
1. the realistic preset (5 sessions, --val-trials/--test-trials per session) and its tiny-recipe
   shards (`tools/compare_families.make_dataset`); a 3-gram KenLM binary of its corpus.txt
   (`b2t-lm build`); two tiny GPT-2s (`tools/tiny_causal_lm.py`): one trained on the same
   corpus.txt, one on --lm-corpus-factor times as many sentences of the same word model
   (`preprocess.synth.draw_corpus`; corpus.txt's come first), as an LLM has read more text
   than the n-gram was built from;
2. the tiny GRU trained --steps steps per seed, eager, f32 (`compare_families.train_run`);
3. per seed and for the ensemble of all seeds, `b2t-eval` run as a user runs it: on val
   `--spell`, `--lm --tune` and `--lm --rescore --tune` (each writing weights.json), then on test
   `--spell`, `--lm`, `--lm --weights` and `--lm --rescore --weights` with the val weights.
The test files carry no sentences (as the competition's); the test WER scores each run's
decoded words against the sentences the synth drew (`preprocess.synth.split_sentences`).
Every b2t-eval run's summary.json holds its stage times; WORKDIR/results.jsonl one line per run
(runs of other --steps in the same WORKDIR share its dataset and LMs).

    python tools/bench_words.py --workdir /tmp/bench_words --steps 250 --seeds 0 --seeds 1 --seeds 2
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from b2t.metrics import ErrorRate
from b2t.text import words_of

BIN = Path(sys.executable).parent
RUNS: dict[str, tuple[str, list[str], str | None]] = {
    # name -> (split, b2t-eval options, the val run whose weights.json it applies)
    "val_spell": ("val", ["--spell"], None),
    "val_ngram": ("val", ["--lm", "{lm}", "--tune"], None),
    "val_rescored": ("val", ["--lm", "{lm}", "--rescore", "{causal_lm}", "--tune"], None),
    "test_spell": ("test", ["--spell"], None),
    "test_ngram_default": ("test", ["--lm", "{lm}"], None),
    "test_ngram_tuned": ("test", ["--lm", "{lm}"], "val_ngram"),
    "test_rescored": ("test", ["--lm", "{lm}", "--rescore", "{causal_lm}"], "val_rescored"),
    "val_rescored_more": ("val", ["--lm", "{lm}", "--rescore", "{causal_lm_more}", "--tune"], None),
    "test_rescored_more": ("test", ["--lm", "{lm}", "--rescore", "{causal_lm_more}"], "val_rescored_more"),
}


def _run(cmd: list[str]) -> float:
    """Run a b2t command; its wall time. A failure stops the benchmark with the command's output."""
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stdout}\n{done.stderr}")
    return time.perf_counter() - start


def prepare(work: Path, steps: int, seeds: list[int], val_trials: int, test_trials: int, lm_steps: int,
            lm_corpus_factor: int) -> tuple[Path, Path, dict[str, list[Path]]]:
    """Dataset, n-gram LM, causal LMs and the trained checkpoints; the models to evaluate by name."""
    from preprocess.synth import draw_corpus, read_spec
    from tools.compare_families import make_dataset, train_run
    from tools.tiny_causal_lm import train_causal_lm

    hdf5, shards = make_dataset(work, "words", 4, val_trials=val_trials, test_trials=test_trials)
    if not (work / "lm.bin").exists():
        _run([str(BIN / "b2t-lm"), "build", str(hdf5 / "corpus.txt"), "-o", str(work / "lm.bin")])
    spec = read_spec(hdf5)
    corpora = {"causal_lm": (hdf5 / "corpus.txt").read_text().splitlines(),
               "causal_lm_more": [" ".join(s) for s in draw_corpus(spec, n=lm_corpus_factor * spec.corpus_sentences)]}
    for name, corpus in corpora.items():
        if not (work / name / "config.json").exists():
            start = time.perf_counter()
            train_causal_lm(corpus, work / name, steps=lm_steps, width=128)
            print(f"{name}: {len(corpus)} sentences, {lm_steps} steps in {time.perf_counter() - start:.0f} s", flush=True)
    models = {}
    for seed in seeds:
        run = work / "runs" / f"gru-{seed}-{steps}"
        result = train_run(shards, run, "gru", seed, steps, steps, False)
        print(f"seed {seed}: val PER {result['per']:.4f} after {steps} steps "
              f"({result['steps_per_s']:.2f} steps/s)", flush=True)
        models[f"seed {seed}"] = [run / "best.safetensors"]
    if len(seeds) > 1:
        models[f"ensemble of {len(seeds)}"] = [m for ms in list(models.values()) for m in ms]
    return hdf5, shards, models


def test_wer(out: Path, sentences: dict[tuple[str, int, int], str]) -> float:
    """WER of a test run's decoded words against the sentences the synth drew."""
    wer = ErrorRate()
    for line in (out / "trials.jsonl").read_text().splitlines():
        t = json.loads(line)
        wer.add(t["session"], words_of(t["decoded_words"]), words_of(sentences[(t["session"], t["block"], t["trial"])]))
    return wer.rate()


def evaluate(work: Path, hdf5: Path, shards: Path, models: dict[str, list[Path]], steps: int,
             runs: Sequence[str]) -> list[dict[str, Any]]:
    from preprocess.synth import read_spec, split_sentences

    log = work / "results.jsonl"
    done = [r for r in map(json.loads, log.read_text().splitlines()) if r["steps"] == steps] if log.exists() else []
    sentences = split_sentences(read_spec(hdf5), "test")
    paths = {"lm": str(work / "lm.bin"), "causal_lm": str(work / "causal_lm"),
             "causal_lm_more": str(work / "causal_lm_more")}
    for model, checkpoints in models.items():
        tag = f"{steps}-{model.replace(' ', '_')}"
        for name in [n for n in RUNS if n in runs]:  # val runs before the test runs applying their weights
            split, options, weights_from = RUNS[name]
            if any(r["model"] == model and r["run"] == name for r in done):
                continue
            out = work / "eval" / tag / name
            cmd = [str(BIN / "b2t-eval"), *map(str, checkpoints), str(shards), "--split", split,
                   "--backend", "eager", "--lexicon", str(hdf5 / "lexicon.txt"),
                   *(o.format(**paths) for o in options), "--out", str(out), "--no-progress"]
            if weights_from is not None:
                cmd += ["--weights", str(work / "eval" / tag / weights_from / "weights.json")]
            wall = _run(cmd)
            summary = json.loads((out / "summary.json").read_text())
            row = {"model": model, "steps": steps, "run": name, "split": split, "wall_s": wall, "trials": summary["n_trials"],
                   "seconds": summary["seconds"], "per": summary["per"],
                   "members_per": [m["per"] for m in summary["members"]],
                   "wer": summary["wer"] if split == "val" else test_wer(out, sentences),
                   "tune": summary["tune"], "command": " ".join(cmd)}
            with log.open("a") as f:
                f.write(json.dumps(row) + "\n")
            done.append(row)
            print(f"{model} {name}: WER {row['wer']:.4f} ({wall:.0f} s)", flush=True)
    return done


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    mean = statistics.mean(values)
    spread = f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else ""
    return f"{mean:.3f}{spread} ({' / '.join(f'{v:.3f}' for v in values)})" if len(values) > 1 else f"{mean:.3f}"


def print_tables(rows: list[dict[str, Any]], models: list[str]) -> None:
    seeds = [m for m in models if m.startswith("seed")]
    ensembles = [m for m in models if not m.startswith("seed")]

    def get(model: str, run: str) -> dict[str, Any] | None:
        return next((r for r in rows if r["model"] == model and r["run"] == run), None)

    def wers(ms: list[str], run: str, default: bool = False) -> list[float]:
        found = [get(m, run) for m in ms]
        return [r["tune"]["default"]["wer"] if default else r["wer"] for r in found if r is not None]

    lines = [("greedy phonemes spelled (--spell)", "val_spell", False, "test_spell"),
             ("n-gram beam, default weights", "val_ngram", True, "test_ngram_default"),
             ("n-gram beam, tuned on val", "val_ngram", False, "test_ngram_tuned"),
             ("+ rescored by the causal LM (corpus.txt), tuned on val", "val_rescored", False, "test_rescored"),
             ("+ rescored by a causal LM of more text, tuned on val", "val_rescored_more", False,
              "test_rescored_more")]
    print(f"| words | val WER, {', '.join(seeds)} | test WER | " + " | ".join(
        f"{e}: val WER | test WER" for e in ensembles) + " |")
    print("|---|---|---|" + "---|---|" * len(ensembles))
    pers = []
    for ms in (seeds, *([e] for e in ensembles)):
        found = [get(m, "val_spell") for m in ms]
        pers.append(_cell([r["per"] for r in found if r is not None]))
    print(f"| val PER (greedy phonemes) | {pers[0]} | |" + "".join(f" {p} | |" for p in pers[1:]))
    for label, val_run, default, test_run in lines:
        cells = [_cell(wers(seeds, val_run, default)), _cell(wers(seeds, test_run))]
        for e in ensembles:
            cells += [_cell(wers([e], val_run, default)), _cell(wers([e], test_run))]
        print(f"| {label} | {' | '.join(cells)} |")
    for e in ensembles:
        r = get(e, "val_spell")
        if r is not None:
            members = ", ".join(f"{p:.4f}" for p in r["members_per"])
            print(f"\nval PER: {e} {r['per']:.4f}; its members {members} (best {min(r['members_per']):.4f})")
    print_times(rows)


def print_times(rows: list[dict[str, Any]]) -> None:
    """Seconds per 100 trials of each stage, the mean over the runs that have it (summary.json's stage times)."""
    def mean(values: list[float]) -> str:
        return f"{statistics.mean(values):.2f}" if values else "-"

    def per100(r: dict[str, Any], stage: str) -> float:
        return 100 * r["seconds"][stage] / r["trials"]

    single = [r for r in rows if len(r["members_per"]) == 1]
    ensemble = [r for r in rows if len(r["members_per"]) > 1]
    beam = [r for r in rows if "spell" not in r["run"]]
    stages = [
        ("one checkpoint over the split (warm-up included)", [per100(r, "model") for r in single]),
        (f"an ensemble of {len(ensemble[0]['members_per']) if ensemble else 0} checkpoints",
         [per100(r, "model") for r in ensemble]),
        ("greedy phonemes spelled into words", [per100(r, "words") for r in rows if "spell" in r["run"]]),
        ("n-gram beam, 1 best", [per100(r, "words") for r in rows if r["run"] == "test_ngram_default"]),
        ("n-gram beam, 32 best", [per100(r, "words") for r in beam if r["run"] != "test_ngram_default"]),
        ("tuning over the 32 best (val)", [per100(r, "tune") for r in rows if "tune" in r["seconds"]]),
        ("rescoring the 32 best by the tiny causal LM (CPU, f32)", [per100(r, "rescore") for r in rows
                                                                    if "rescore" in r["seconds"]]),
    ]
    loads = [r["seconds"]["rescore_load"] for r in rows if "rescore_load" in r["seconds"]]
    print("\n| stage | seconds per 100 trials |\n|---|---|")
    for name, values in stages:
        print(f"| {name} | {mean(values)} |")
    print(f"| loading transformers and the causal LM (once per run, s) | {mean(loads)} |")


@click.command()
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Dataset, LMs, runs, evaluations and results.jsonl (kept: a re-run resumes).")
@click.option("--steps", default=250, show_default=True, help="Optimizer steps per training run.")
@click.option("--seeds", type=int, multiple=True, default=(0, 1, 2), show_default=True, help="train.seed values.")
@click.option("--val-trials", default=40, show_default=True, help="Val trials per session (5 sessions).")
@click.option("--test-trials", default=40, show_default=True, help="Test trials per session.")
@click.option("--runs", type=click.Choice(list(RUNS)), multiple=True, default=tuple(RUNS), show_default=True,
              help="The b2t-eval runs to make (a test run with --weights needs its val run).")
@click.option("--lm-steps", default=1500, show_default=True, help="Training steps of each causal LM.")
@click.option("--lm-corpus-factor", default=10, show_default=True,
              help="The second causal LM reads this many times corpus.txt's sentences from the same word model.")
def main(workdir: Path, steps: int, seeds: tuple[int, ...], val_trials: int, test_trials: int, runs: tuple[str, ...],
         lm_steps: int, lm_corpus_factor: int) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    hdf5, shards, models = prepare(workdir, steps, list(seeds), val_trials, test_trials, lm_steps, lm_corpus_factor)
    rows = evaluate(workdir, hdf5, shards, models, steps, runs)
    print()
    print_tables(rows, list(models))


if __name__ == "__main__":
    main()
