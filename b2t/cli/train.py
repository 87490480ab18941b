"""`b2t-train`: DATASET -> a compiled, trained run in RUN_DIR (the work lives in b2t.train)."""

from __future__ import annotations

from pathlib import Path

import click

from b2t.cli.options import backend_option, config_option, mesh_options, run_config, set_option
from b2t.cli.rule import Command
from b2t.paths import Place, RegularFile, refuse_clashes


@click.command(cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("dataset", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@config_option
@set_option
@backend_option
@click.option("--resume", is_flag=True, help="Continue RUN_DIR/last.safetensors exactly (same data order and schedule); "
              "with no checkpoint there yet (a run stopped before its first), start from scratch.")
@click.option("--init-from", type=RegularFile(), default=None,
              metavar="CKPT", help="Start from this b2t checkpoint's weights (e.g. from b2t-import-baseline) with a "
              "fresh optimizer and schedule; day layers are matched by session name, new sessions start from identity.")
@click.option("--verify-data", is_flag=True,
              help="Check the sha256 of every train and val shard against the manifest before training (reads every "
                   "shard once; presence and sizes are always checked).")
@click.option("--max-compiles", type=click.IntRange(min=0), default=None,
              help="Fail the run as soon as XLA has compiled more graphs than this, checked during the warm-up and at "
                   "every log (a recompilation guard for CI).")
@click.option("--device", default=None, help="Device override, e.g. cuda:1 (default: the backend's first device).")
@click.option("--no-progress", is_flag=True, help="No progress bar (logs still go to RUN_DIR/metrics.jsonl).")
@mesh_options
@click.option("--compile-cache", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="torch_xla's persistent compilation cache: compiled graphs are stored in DIR for later runs to "
                   "load. torch_xla 2.9 cannot load them back on any runtime (pytorch/xla#9094), so a second run "
                   "compiles again; the warm-up's last line says what the cache did.")
@click.option("--compile-jobs", type=click.IntRange(min=0), default=None, metavar="N",
              help="openxla: compile up to N of the warm-up's graphs at once, while the next are traced "
                   "(default: half this machine's cores); each runs in host memory of its own, printed at the end of the "
                   "warm-up. 0 compiles each graph as its step first runs, one after another.")
def train_main(dataset: Path, run_dir: Path, config_path: Path | None, overrides: tuple[str, ...],
               backend: str | None, resume: bool, max_compiles: int | None, device: str | None,
               no_progress: bool, devices: str | None, mesh: str | None, init_from: Path | None,
               verify_data: bool, compile_cache: Path | None, compile_jobs: int | None) -> None:
    """Train a phoneme decoder (model.family: the reference GRU, or the noise-separating
    three-GRU model) on DATASET (a b2t-preprocess output) into RUN_DIR.

    It first prints the device it found, then compiles every graph of the run before the
    first step (the warm-up), one numbered line per piece as it starts, "compiling 3/7: train
    step, bucket T=246 B=16 (about 49 s, as last time)", and one as it ends, "compiled 3/7:
    ...: 2 graphs, 50.0 s" (under openxla the pieces compile side by side, --compile-jobs);
    after it no step compiles again. Steps/s and the ETA count the
    steps after the warm-up only; the end prints where the time went, the best validation,
    the checkpoints and the next commands. A --resume of a finished run compiles nothing and
    prints that summary again. RUN_DIR receives
    last.safetensors (resumable), best.safetensors (lowest validation PER), metrics.jsonl
    (losses, PER per session, XLA compilations and host fallbacks) and tensorboard/ (the
    same as TensorBoard events); `b2t-report RUN_DIR` plots them into a PNG.
    """
    from b2t.train.loop import RunOptions, train

    cfg = run_config(config_path, overrides, backend, devices, mesh)
    refuse_clashes([Place("RUN_DIR", run_dir, tree=True)], [Place("DATASET", dataset, tree=True)])
    if compile_cache is not None:
        from b2t.engine.devices import use_compile_cache

        use_compile_cache(compile_cache)
    from b2t.engine.concurrent_compiles import default_jobs

    summary = train(dataset, run_dir, cfg, RunOptions(resume=resume, max_compiles=max_compiles,
                                                       progress=not no_progress, device=device,
                                                       init_from=init_from, verify_data=verify_data,
                                                       compile_jobs=default_jobs() if compile_jobs is None else compile_jobs))
    if summary["rank"] == 0:
        from b2t.train.summary import format_summary

        click.echo(format_summary(summary))

