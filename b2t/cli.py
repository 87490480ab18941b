"""Thin click entry points; the work lives in b2t.train and b2t.evaluate."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from b2t.config import ConfigError, load_config
from b2t.train.backend import BACKENDS

config_option = click.option(
    "--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="YAML config (configs/baseline.yaml is the reference recipe, configs/tiny.yaml the demo).",
)
set_option = click.option(
    "--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
    help="Override one config value, e.g. --set train.steps=500 (repeatable).",
)


def fail(message: str) -> None:
    click.secho(f"error: {message}", fg="red", err=True)
    sys.exit(2)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("dataset", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@config_option
@set_option
@click.option("--backend", type=click.Choice(BACKENDS), default=None,
              help="openxla: torch.compile on the XLA device (TPU, or the CPU with PJRT_DEVICE=CPU); "
                   "inductor: torch.compile on CUDA or CPU; eager: no compilation. Default: train.backend.")
@click.option("--resume", is_flag=True, help="Continue RUN_DIR/last.safetensors exactly (same data order and schedule).")
@click.option("--max-compiles", type=int, default=None,
              help="Fail the run if XLA compiled more graphs than this (a recompilation guard for CI).")
@click.option("--device", default=None, help="Device override, e.g. cuda:1 (default: the backend's first device).")
@click.option("--no-progress", is_flag=True, help="No progress bar (logs still go to RUN_DIR/metrics.jsonl).")
def train_main(dataset: Path, run_dir: Path, config_path: Path | None, overrides: tuple[str, ...],
               backend: str | None, resume: bool, max_compiles: int | None, device: str | None,
               no_progress: bool) -> None:
    """Train the GRU phoneme decoder on DATASET (a b2t-preprocess output) into RUN_DIR.

    Every bucket shape is compiled before the first step ("compiling bucket T=..."), after
    which no step compiles again. RUN_DIR receives last.safetensors (resumable),
    best.safetensors (lowest validation PER) and metrics.jsonl (losses, PER per session,
    XLA compilations and host fallbacks).
    """
    from b2t.train.loop import RunOptions, TrainingError, train

    if backend is not None:
        overrides = (*overrides, f"train.backend={backend}")
    try:
        cfg = load_config(config_path, overrides)
        summary = train(dataset, run_dir, cfg, RunOptions(resume=resume, max_compiles=max_compiles,
                                                           progress=not no_progress, device=device))
    except (ConfigError, TrainingError, FileNotFoundError, ValueError) as e:
        fail(str(e))
    final = summary["final"]
    click.echo(f"done: {summary['steps']} steps, best val PER {summary['best_per']:.4f} at step {summary['best_step']}")
    click.echo(f"XLA compilations: {final['compilations']} ({summary['buckets']} buckets); "
               f"host fallbacks: {json.dumps(final['fallbacks']) if final['fallbacks'] else 'none'}")
