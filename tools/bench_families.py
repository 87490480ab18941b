"""The GRU and noise-separating families side by side on structured-noise synthetic data.

One b2t-synth dataset with a slowly drifting low-rank non-speech component per trial
(`--structured-noise-rank`), preprocessed once; then each family's tiny config trains the
same number of steps on the same batches, with the same backend, one after the other in
this process (so both meet the same machine load). Prints a markdown table: best val PER
(greedy, chance is 1.0), median steps/s over the logged intervals, parameters.

    python tools/bench_families.py --backend eager --steps 200
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from pathlib import Path

import click

from b2t.config import CONFIG_DIR, TINY_CONFIG, load_config
from b2t.run_dir import RunDir

FAMILY_CONFIGS = {"gru": TINY_CONFIG, "noise_separating": CONFIG_DIR / "noise_tiny.yaml"}


def make_dataset(work: Path, rank: int, std: float, timescale: float) -> Path:
    from preprocess.synth import SynthSpec, read_spec, write_dataset
    from preprocess.writer import prepare_dataset

    spec = SynthSpec(sessions=5, seed=0, structured_noise_rank=rank, structured_noise_std=std,
                     structured_noise_timescale=timescale)
    if read_spec(work / "hdf5") != spec:  # a kept --workdir reuses a finished dataset of the same options
        shutil.rmtree(work / "hdf5", ignore_errors=True)
        shutil.rmtree(work / "shards", ignore_errors=True)
        write_dataset(spec, work / "hdf5")
    prepare_dataset(work / "hdf5", work / "shards", load_config(TINY_CONFIG), workers=1, progress=False)
    return work / "shards"


def train_family(shards: Path, run: Path, config: Path, backend: str, steps: int) -> dict[str, float]:
    from b2t.data.manifest import Manifest
    from b2t.model.registry import count_parameters
    from b2t.train.loop import RunOptions, train

    sets = [f"train.backend={backend}", f"train.steps={steps}", f"optim.decay_steps={steps}",
            f"train.val_every={steps // 2}", "train.log_every=10", f"train.checkpoint_every={steps}"]
    cfg = load_config(config, sets)
    shutil.rmtree(run, ignore_errors=True)  # a fresh run each time (a kept --workdir keeps only the dataset)
    device = "cpu" if backend in ("eager", "inductor") else None
    summary = train(shards, run, cfg, RunOptions(progress=False, device=device))
    records = RunDir(run).records()
    rates = [r["steps_per_s"] for r in records if r["kind"] == "train"]  # stepping time only (b2t.train.rates)
    n_days = len(Manifest.load(shards).sessions)
    return {"per": summary["best_per"], "steps_per_s": statistics.median(rates),
            "params": count_parameters(cfg.model, n_days)["total"], "compilations": summary["final"]["compilations"]}


@click.command()
@click.option("--backend", default="eager", show_default=True, help="Backend both families train with.")
@click.option("--steps", default=200, show_default=True, help="Optimizer steps per family (the tiny recipe's 200).")
@click.option("--rank", default=4, show_default=True, help="b2t-synth --structured-noise-rank.")
@click.option("--std", default=1.0, show_default=True, help="b2t-synth --structured-noise-std.")
@click.option("--timescale", default=50.0, show_default=True, help="b2t-synth --structured-noise-timescale.")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Keep the dataset and runs here (default: a temporary directory).")
def main(backend: str, steps: int, rank: int, std: float, timescale: float, workdir: Path | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = workdir or Path(tmp)
        shards = make_dataset(work, rank, std, timescale)
        results = {name: train_family(shards, work / f"run_{name}", cfg, backend, steps)
                   for name, cfg in FAMILY_CONFIGS.items()}
    print(f"# model families on structured-noise synthetic data (rank {rank}, std {std}, timescale {timescale} bins)")
    print(f"{steps} steps each, backend {backend}, same batches\n")
    print("| family | best val PER | steps/s (median) | parameters | XLA compilations |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['per']:.3f} | {r['steps_per_s']:.2f} | {r['params']:,} | {r['compilations']} |")


if __name__ == "__main__":
    main()
