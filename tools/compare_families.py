"""GRU family vs noise-separating family and its ablations, on the realistic synthetic preset.

Two datasets (`b2t-synth --preset realistic`, with the structured non-speech component and
with `--structured-noise-rank 0`), preprocessed once each with the tiny recipe; then every
variant trains the same number of steps per seed (train.seed; same data, same batches per
seed), eager on the CPU, one run after the other, computing in f32 unless --bf16 (on a CPU
without AVX512-BF16, torch's bf16 matmuls run about 15x slower than f32: 20 s against 1.4 s
for a tiny-recipe step on the 2-core AVX2 box). Every noise-family run that ends is also
measured against the ground truth (`b2t.separation`: R^2 of the noise estimate, the
speech it takes with it, both heads' PER). Each finished run is appended to
WORKDIR/results.jsonl, and a re-run skips runs already there, so the comparison can be
stopped and resumed. Prints a markdown table: mean (and each seed's) final val PER.

    nice -n 10 python -m tools.compare_families --workdir /tmp/compare --steps 300 --seeds 0 1 2

Calibration of the preset (the tiny GRU at 150 and 600 steps):

    python -m tools.compare_families --workdir /tmp/compare --variants gru --steps 600 --val-every 150
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from b2t.config import load_config
from b2t.run_dir import RunDir
from tests.realistic_runs import CONDITIONS, NOISE_TINY, VARIANTS, make_dataset, run_settings


def _records(run: Path) -> list[dict[str, Any]]:
    return RunDir(run).records()


def train_run(shards: Path, run: Path, variant: str, seed: int, steps: int, val_every: int,
              bf16: bool) -> dict[str, Any]:
    """One eager run (or the one already finished in `run`); its val PER at each validation,
    steps/s and wall time (None for a run finished before)."""
    from b2t.train.loop import RunOptions, train

    config, sets = run_settings(variant, seed, steps, val_every, "bf16" if bf16 else "f32")
    wall = None
    if not any(r["kind"] == "summary" and r["steps"] == steps for r in _records(run)):
        shutil.rmtree(run, ignore_errors=True)
        start = time.perf_counter()
        train(shards, run, load_config(config, sets), RunOptions(progress=False, device="cpu"))
        wall = time.perf_counter() - start
    records = _records(run)
    rates = [r["steps_per_s"] for r in records if r["kind"] == "train"]  # stepping time only (b2t.train.rates)
    val = {r["step"]: r["per"] for r in records if r["kind"] == "val"}
    return {"val_per": val, "per": val[max(val)], "steps_per_s": statistics.median(rates), "wall_s": wall}


def separation(run: Path, hdf5: Path) -> dict[str, float]:
    """The separation report of a noise-family run's last checkpoint on the val split, pooled over sessions."""
    from b2t.separation import load_model, separation_report

    return asdict(separation_report(load_model(run / "last.safetensors"), hdf5, "val")["all"])


def _read(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    mean = statistics.mean(values)
    spread = f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else ""
    return f"{mean:.3f}{spread} ({' / '.join(f'{v:.3f}' for v in values)})"


def print_table(results: list[dict[str, Any]], conditions: list[str], variants: list[str]) -> None:
    keys = ("per", "r2", "leakage", "noisy_per")
    print("| data | variant | val PER | R^2 of estimate | speech leakage | noisy head PER | steps/s | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for condition in conditions:
        for variant in variants:
            rows = [r for r in results if r["condition"] == condition and r["variant"] == variant]
            if not rows:
                continue
            cells = [_cell([r[k] for r in rows if k in r]) for k in keys]
            rate = statistics.mean(r["steps_per_s"] for r in rows)
            walls = [r["wall_s"] for r in rows if r["wall_s"] is not None]
            wall = f"{statistics.mean(walls):.0f}" if walls else "-"
            print(f"| {condition} | {variant} | {' | '.join(cells)} | {rate:.2f} | {wall} |")


@click.command()
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Datasets, runs and results.jsonl (kept: a re-run resumes).")
@click.option("--steps", default=300, show_default=True, help="Optimizer steps per run.")
@click.option("--val-every", default=0, help="Validate every N steps (default: at the end only).")
@click.option("--seeds", type=int, multiple=True, default=(0, 1, 2), show_default=True, help="train.seed values.")
@click.option("--variants", type=click.Choice(list(VARIANTS)), multiple=True, default=tuple(VARIANTS),
              show_default=True)
@click.option("--conditions", type=click.Choice(list(CONDITIONS)), multiple=True, default=tuple(CONDITIONS),
              show_default=True)
@click.option("--bf16", is_flag=True, help="Compute in bf16 under autocast, as the recipe does (slow on AVX2 CPUs).")
def main(workdir: Path, steps: int, val_every: int, seeds: tuple[int, ...], variants: tuple[str, ...],
         conditions: tuple[str, ...], bf16: bool) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "results.jsonl"
    for condition in conditions:
        hdf5, shards = make_dataset(workdir, condition, CONDITIONS[condition])
        for seed in seeds:
            for variant in variants:
                key = {"condition": condition, "variant": variant, "seed": seed, "steps": steps, "bf16": bf16}
                results = _read(log)  # another process may share the workdir
                if any(all(r.get(k) == v for k, v in key.items()) for r in results):
                    continue
                run = workdir / "runs" / f"{condition}-{variant}-{seed}-{steps}"
                row = {**key, **train_run(shards, run, variant, seed, steps, val_every or steps, bf16)}
                if VARIANTS[variant][0] == NOISE_TINY:
                    row.update(separation(run, hdf5))
                with log.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
    done = [r for r in _read(log) if r["steps"] == steps and r["seed"] in seeds and r["bf16"] == bf16]
    print(f"\n{steps} steps per run, eager on the CPU ({'bf16' if bf16 else 'f32'}), train.seed {', '.join(map(str, seeds))}; "
          "mean ± sd (per seed)\n")
    print_table(done, list(conditions), list(variants))


if __name__ == "__main__":
    main()
