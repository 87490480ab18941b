"""Words as the field gets them, measured on `b2t-synth --preset realistic`: per seed and for the
seeds' ensemble, val and test WER of greedy phonemes spelled into words, the n-gram beam at its
default weights, the same beam with its weights tuned on val, and its n-best rescored by a small
causal LM (weights tuned on val with it); val and test PER of every member and the ensemble;
the time each stage adds per 100 trials.

Steps, each kept in WORKDIR/words-TEXT and skipped when done (a re-run resumes):
1. the realistic preset with `--text TEXT` (5 sessions, --val-trials/--test-trials per
   session; `topics`, the default here, has long-range structure a 3-gram misses, see
   preprocess/synth_text.py) and its tiny-recipe shards (`tests/realistic_runs.make_dataset`);
   from the dataset's corpus.txt alone, a 3-gram KenLM binary (`b2t-lm build`) and a tiny GPT-2
   (`tests/tiny_causal_lm.py`): both LMs read the same 3,000 sentences and nothing else.
   Their log-probability per word of the test sentences (drawn apart from the corpus; a short
   one may occur in it too, for both LMs alike) is printed
   (`--lms-only` stops here);
2. the tiny GRU trained --steps steps per seed (same shards and steps, train.seed = the
   seed; eager, f32, `compare_families.train_run`);
3. per seed and for the ensemble of all seeds, `b2t-eval` run as a user runs it: on val
   `--spell`, `--lm --tune` and `--lm --rescore --tune` (each writing weights.json), then on test
   `--spell`, `--lm`, `--lm --weights` and `--lm --rescore --weights` with the val weights.
The test files carry no sentences or phonemes (as the competition's); test WER and PER score
each run's decoded words and phonemes against what the synth drew (`split_sentences`).
Every b2t-eval run's summary.json holds its stage times; results.jsonl one line per run.

    python -m tools.bench_words --workdir /tmp/bench_words --steps 600 --seeds 0 --seeds 1 --seeds 2   # from the repo root
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from rapidfuzz.distance import Levenshtein

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
}
COLUMNS = [  # table column -> (val run, its WER untuned?, test run)
    ("greedy + spell", "val_spell", False, "test_spell"),
    ("n-gram, default", "val_ngram", True, "test_ngram_default"),
    ("n-gram, tuned", "val_ngram", False, "test_ngram_tuned"),
    ("+ rescored, tuned", "val_rescored", False, "test_rescored"),
]


def _run(cmd: list[str]) -> float:
    """Run a b2t command; its wall time. A failure stops the benchmark with the command's output."""
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stdout}\n{done.stderr}")
    return time.perf_counter() - start


def prepare_lms(data: Path, text: str, val_trials: int, test_trials: int, lm_steps: int) -> tuple[Path, Path]:
    """The dataset, its shards, and both LMs of its corpus.txt."""
    from tests.realistic_runs import make_dataset
    from tests.tiny_causal_lm import train_causal_lm

    hdf5, shards = make_dataset(data.parent, data.name, 4, val_trials=val_trials, test_trials=test_trials, text=text)
    corpus = hdf5 / "corpus.txt"
    if not (data / "lm.bin").exists():
        _run([str(BIN / "b2t-lm"), "build", str(corpus), "-o", str(data / "lm.bin")])
    if not (data / "causal_lm" / "config.json").exists():
        start = time.perf_counter()
        train_causal_lm(corpus.read_text().splitlines(), data / "causal_lm", steps=lm_steps, width=128)
        print(f"causal LM: {lm_steps} steps in {time.perf_counter() - start:.0f} s", flush=True)
    return hdf5, shards


def train_models(data: Path, shards: Path, steps: int, seeds: list[int]) -> dict[str, list[Path]]:
    """The seeds' checkpoints, and their ensemble, by name."""
    from tools.compare_families import train_run

    models = {}
    for seed in seeds:
        run = data / "runs" / f"gru-{seed}-{steps}"
        result = train_run(shards, run, "gru", seed, steps, steps, False)
        print(f"seed {seed}: val PER {result['per']:.4f} after {steps} steps "
              f"({result['steps_per_s']:.2f} steps/s)", flush=True)
        models[f"seed {seed}"] = [run / "best.safetensors"]
    if len(seeds) > 1:
        models[f"ensemble of {len(seeds)}"] = [m for ms in list(models.values()) for m in ms]
    return models


def lm_log_probs(data: Path, sentences: Sequence[str]) -> dict[str, float]:
    """Natural-log probability per word (the sentence end counted as a word) of `sentences` under
    the n-gram and under the causal LM: how much better the causal LM predicts unseen text."""
    from flashlight.lib.text.dictionary import Dictionary

    from b2t.words.beam import load_lm
    from b2t.words.ngram import UNK
    from b2t.words.rescore import CausalLMScorer

    rows = [words_of(s) for s in sentences]
    vocabulary = sorted({w for r in rows for w in r})
    lm = load_lm(data / "lm.bin", Dictionary([*vocabulary, UNK]))
    index = {w: i for i, w in enumerate(vocabulary)}
    ngram = 0.0
    for row in rows:
        state = lm.start(False)
        for w in row:
            state, score = lm.score(state, index[w])
            ngram += score
        ngram += lm.finish(state)[1]
    neural = sum(CausalLMScorer(data / "causal_lm", "cpu").score([" ".join(r) for r in rows], progress=False))
    tokens = sum(len(r) + 1 for r in rows)
    return {"ngram": ngram * math.log(10) / tokens, "causal_lm": neural / tokens, "sentences": len(rows)}


def _test_truth(hdf5: Path) -> dict[tuple[str, int, int], tuple[str, str]]:
    """(session, block, trial) -> (sentence, phoneme string) of every test trial, drawn again from the spec."""
    from b2t.phonemes import phoneme_string
    from preprocess.synth import load_lexicon, read_spec, split_sentences
    from preprocess.synth_core import sentence_phonemes

    lexicon = load_lexicon()
    return {k: (s, phoneme_string(sentence_phonemes(s.split(), lexicon)))
            for k, s in split_sentences(read_spec(hdf5), "test").items()}


def scores(out: Path, truth: dict[tuple[str, int, int], tuple[str, str]]) -> dict[str, float]:
    """A run's PER and WER and its phoneme errors by kind (insertions, deletions, substitutions),
    against trials.jsonl's references, or on test, which has none, against what the synth drew."""
    per, wer = ErrorRate(), ErrorRate()
    kinds = {"delete": 0, "insert": 0, "replace": 0}  # turning the decoded phonemes into the reference
    for line in (out / "trials.jsonl").read_text().splitlines():
        t = json.loads(line)
        sentence, phonemes = ((t["reference_words"], t["reference_phonemes"]) if t["reference_phonemes"] is not None
                              else truth[(t["session"], t["block"], t["trial"])])
        hyp = t["decoded_phonemes"].split()
        per.add(t["session"], hyp, phonemes.split())
        wer.add(t["session"], words_of(t["decoded_words"]), words_of(sentence))
        for op in Levenshtein.editops(hyp, phonemes.split()):
            kinds[op.tag] += 1
    return {"per": per.rate(), "wer": wer.rate(),
            "errors": (kinds["delete"], kinds["insert"], kinds["replace"])}  # decoded: inserted, deleted, substituted


def evaluate(data: Path, hdf5: Path, shards: Path, models: dict[str, list[Path]], steps: int, runs: Sequence[str],
             truth: dict[tuple[str, int, int], tuple[str, str]]) -> list[dict[str, Any]]:
    """Every b2t-eval run not yet in results.jsonl, appended to it; all of its rows for `steps`, with
    their phoneme errors by kind (not kept in results.jsonl: counted again from each run's trials)."""
    log = data / "results.jsonl"
    done = [r for r in map(json.loads, log.read_text().splitlines()) if r["steps"] == steps] if log.exists() else []
    paths = {"lm": str(data / "lm.bin"), "causal_lm": str(data / "causal_lm")}
    for model, checkpoints in models.items():
        tag = f"{steps}-{model.replace(' ', '_')}"
        for name in [n for n in RUNS if n in runs]:  # val runs before the test runs applying their weights
            split, options, weights_from = RUNS[name]
            if any(r["model"] == model and r["run"] == name for r in done):
                continue
            out = data / "eval" / tag / name
            cmd = [str(BIN / "b2t-eval"), *map(str, checkpoints), str(shards), "--split", split,
                   "--backend", "eager", "--lexicon", str(hdf5 / "lexicon.txt"),
                   *(o.format(**paths) for o in options), "--out", str(out), "--no-progress"]
            if weights_from is not None:
                cmd += ["--weights", str(data / "eval" / tag / weights_from / "weights.json")]
            wall = _run(cmd)
            summary = json.loads((out / "summary.json").read_text())
            found = scores(out, truth)
            row = {"model": model, "steps": steps, "run": name, "split": split, "wall_s": wall,
                   "trials": summary["n_trials"], "seconds": summary["seconds"], "per": found["per"],
                   "members": [m["checkpoint"] for m in summary["members"]], "wer": found["wer"],
                   "tune": summary["tune"], "command": " ".join(cmd)}
            with log.open("a") as f:
                f.write(json.dumps(row) + "\n")
            done.append(row)
            print(f"{model} {name}: PER {row['per']:.4f} WER {row['wer']:.4f} ({wall:.0f} s)", flush=True)
    for row in done:
        row["errors"] = scores(data / "eval" / f"{steps}-{row['model'].replace(' ', '_')}" / row["run"], truth)["errors"]
    return done


def print_tables(rows: list[dict[str, Any]], models: list[str]) -> None:
    """The WER table (a row per model), the verdicts on rescoring and the ensemble, and the stage times."""
    def get(model: str, run: str) -> dict[str, Any] | None:
        return next((r for r in rows if r["model"] == model and r["run"] == run), None)

    def value(model: str, run: str, key: str = "wer", default: bool = False) -> float | None:
        r = get(model, run)
        return None if r is None else r["tune"]["default"]["wer"] if default else r[key]

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    header = " | ".join(f"{c}: val | test" for c, *_ in COLUMNS)
    print(f"| model | PER: val | test | WER, {header} |\n|---|" + "---|---|" * (len(COLUMNS) + 1))
    for m in models:
        cells = [value(m, "val_spell", "per"), value(m, "test_spell", "per")]
        for _, val_run, default, test_run in COLUMNS:
            cells += [value(m, val_run, default=default), value(m, test_run)]
        print(f"| {m} | " + " | ".join(map(fmt, cells)) + " |")
    print()
    for m in models:
        for split in ("val", "test"):
            default = value(m, "val_ngram", default=True) if split == "val" else value(m, "test_ngram_default")
            tuned, rescored = value(m, f"{split}_ngram" + ("_tuned" if split == "test" else "")), \
                value(m, f"{split}_rescored")
            if default is not None and tuned is not None:
                t = get(m, "val_ngram")["tune"]
                how = (f" (the search's best on val {t['found']['wer']:.4f}, sign-flip p = {t['p_value']:.3g}: "
                       f"{'defaults kept' if t['kept_default'] else 'chosen' if t['p_value'] < 1 else 'no point better'})")
                print(f"{m}, {split}: tuned n-gram WER {tuned:.4f} <= default {default:.4f}: "
                      f"{'met' if tuned <= default else 'NOT met'}{how}")
            if tuned is not None and rescored is not None:
                print(f"{m}, {split}: rescored WER {rescored:.4f} < tuned n-gram {tuned:.4f}: "
                      f"{'met' if rescored < tuned else 'NOT met'}")
    seeds = [m for m in models if m.startswith("seed")]
    for e in (m for m in models if not m.startswith("seed")):
        for split in ("val", "test"):
            run = f"{split}_spell"
            own, members = value(e, run, "per"), [value(s, run, "per") for s in seeds]
            if own is not None and None not in members:
                best = min(members)
                print(f"{e}, {split} PER {own:.4f}, members {' / '.join(f'{p:.4f}' for p in members)}: "
                      f"<= best member {best:.4f}: {'met' if own <= best else 'NOT met'}")
                kinds = [" ".join(map(str, get(m, run)["errors"])) for m in (e, *seeds)]
                print(f"  phoneme errors inserted deleted substituted: ensemble {kinds[0]}, members {' / '.join(kinds[1:])}")
    print_times(rows)


def print_times(rows: list[dict[str, Any]]) -> None:
    """Seconds per 100 trials of each stage, the median over the runs that have it (summary.json's stage
    times; the median, as other work on a shared machine slows some runs several times over)."""
    def median(values: list[float]) -> str:
        return f"{statistics.median(values):.2f}" if values else "-"

    def per100(r: dict[str, Any], stage: str) -> float:
        return 100 * r["seconds"][stage] / r["trials"]

    single = [r for r in rows if len(r["members"]) == 1]
    ensemble = [r for r in rows if len(r["members"]) > 1]
    beam = [r for r in rows if "spell" not in r["run"]]
    stages = [
        ("one checkpoint over the split (warm-up included)", [per100(r, "model") for r in single]),
        (f"an ensemble of {len(ensemble[0]['members']) if ensemble else 0} checkpoints",
         [per100(r, "model") for r in ensemble]),
        ("greedy phonemes spelled into words", [per100(r, "words") for r in rows if "spell" in r["run"]]),
        ("n-gram beam, 1 best", [per100(r, "words") for r in rows if r["run"] == "test_ngram_default"]),
        ("n-gram beam, 32 best", [per100(r, "words") for r in beam if r["run"] != "test_ngram_default"]),
        ("tuning over the 32 best (val)", [per100(r, "tune") for r in rows if "tune" in r["seconds"]]),
        ("rescoring the 32 best by the tiny causal LM (CPU, f32)", [per100(r, "rescore") for r in rows
                                                                    if "rescore" in r["seconds"]]),
    ]
    loads = [r["seconds"]["rescore_load"] for r in rows if "rescore_load" in r["seconds"]]
    print("\n| stage | seconds per 100 trials (median) |\n|---|---|")
    for name, values in stages:
        print(f"| {name} | {median(values)} |")
    print(f"| loading transformers and the causal LM (once per run, s) | {median(loads)} |")


@click.command()
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Datasets, LMs, runs, evaluations and results (kept: a re-run resumes).")
@click.option("--text", type=click.Choice(["topics", "bigram"]), default="topics", show_default=True,
              help="The synth's text model (b2t-synth --text).")
@click.option("--steps", default=600, show_default=True, help="Optimizer steps per training run.")
@click.option("--seeds", type=int, multiple=True, default=(0, 1, 2), show_default=True, help="train.seed values.")
@click.option("--val-trials", default=60, show_default=True, help="Val trials per session (5 sessions).")
@click.option("--test-trials", default=60, show_default=True, help="Test trials per session.")
@click.option("--runs", type=click.Choice(list(RUNS)), multiple=True, default=tuple(RUNS), show_default=True,
              help="The b2t-eval runs to make (a test run with --weights needs its val run).")
@click.option("--lm-steps", default=1500, show_default=True, help="Training steps of the causal LM.")
@click.option("--lms-only", is_flag=True, help="Stop after the dataset, the LMs and their test-sentence log-probabilities.")
def main(workdir: Path, text: str, steps: int, seeds: tuple[int, ...], val_trials: int, test_trials: int,
         runs: tuple[str, ...], lm_steps: int, lms_only: bool) -> None:
    data = workdir / f"words-{text}"
    data.mkdir(parents=True, exist_ok=True)
    hdf5, shards = prepare_lms(data, text, val_trials, test_trials, lm_steps)
    truth = _test_truth(hdf5)
    held_out = lm_log_probs(data, [s for s, _ in truth.values()])
    print(f"log-probability per word of the {held_out['sentences']} test sentences: 3-gram "
          f"{held_out['ngram']:.3f}, causal LM {held_out['causal_lm']:.3f} (nats)", flush=True)
    if lms_only:
        return
    models = train_models(data, shards, steps, list(seeds))
    rows = evaluate(data, hdf5, shards, models, steps, runs, truth)
    print()
    print_tables(rows, list(models))


if __name__ == "__main__":
    main()
