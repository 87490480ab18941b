"""`b2t-train`: DATASET -> a compiled, trained run in RUN_DIR (the work lives in b2t.train)."""

from __future__ import annotations

from pathlib import Path

import click

from b2t.cli.options import config_option, set_option
from b2t.cli.rule import Command
from b2t.config import BACKENDS, XLA_BACKENDS, Config, load_config
from b2t.errors import UsageError
from b2t.paths import Place, RegularFile, refuse_clashes


@click.command(cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("dataset", type=click.Path(exists=True, file_okay=False, path_type=Path), required=False)
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path), required=False)
@config_option
@set_option
@click.option("--backend", type=click.Choice(BACKENDS), default=None,
              help="openxla: torch.compile on the XLA device (TPU, or the CPU with PJRT_DEVICE=CPU); "
                   "inductor: torch.compile on CUDA or CPU; eager: no compilation. Default: train.backend.")
@click.option("--resume", is_flag=True, help="Continue RUN_DIR/last.safetensors exactly (same data order and schedule); "
              "with no checkpoint there yet (a run stopped before its first), start from scratch.")
@click.option("--init-from", type=RegularFile(), default=None,
              metavar="CKPT", help="Start from this b2t checkpoint's weights (e.g. from b2t-import-baseline) with a "
              "fresh optimizer and schedule; day layers are matched by session name, new sessions start from identity.")
@click.option("--verify-data", is_flag=True,
              help="Check the sha256 of every train and val shard against the manifest before training (reads every "
                   "shard once; presence and sizes are always checked).")
@click.option("--max-compiles", type=int, default=None,
              help="Fail the run as soon as XLA has compiled more graphs than this, checked during the warm-up and at "
                   "every log (a recompilation guard for CI).")
@click.option("--device", default=None, help="Device override, e.g. cuda:1 (default: the backend's first device).")
@click.option("--no-progress", is_flag=True, help="No progress bar (logs still go to RUN_DIR/metrics.jsonl).")
@click.option("--devices", default=None, metavar="all|N",
              help="Data-parallel over all (or N) devices of this host with XLA SPMD (openxla or xla "
                   "backend); every bucket's B must divide by the device "
                   "count (data.row_multiple). On GPUs use torchrun --nproc-per-node N b2t-train ... instead.")
@click.option("--mesh", default=None, metavar="data=N,fsdp=M",
              help="The SPMD mesh: batches split over all N*M devices, weights, gradients and AdamW moments "
                   "sharded over M of them (fsdp); --mesh data=N is --devices N, --mesh fsdp=8 shards over 8.")
@click.option("--plan", is_flag=True,
              help="Print the parameters per model part, the bucket table, device count and estimated "
                   "per-device memory, then exit (nothing is compiled; RUN_DIR is not needed; without "
                   "DATASET it plans for the Brain-to-Text '25 data: 45 sessions, trials up to 2,500 bins).")
@click.option("--device-memory", default=None, metavar="SIZE",
              help="With --plan: memory per device, e.g. 16GiB; prints the largest micro-batch that fits.")
@click.option("--compile-cache", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="Persistent compilation cache: compiled graphs are stored in DIR and loaded by later runs "
                   "(a resume or a rerun on a TPU or GPU skips its compiles; the CPU runtime only writes them).")
@click.option("--target", default=None, metavar="TPU",
              help="With --plan: compile every graph of the run with the TPU compiler for this slice (v5e-1, "
                   "v5e-4, v5e-8, v5e-16, v5e-64, v5e-256, v6e-1, v6e-8, v5p-8, v4-8) on this machine, no TPU "
                   "needed, and print per bucket and chip the memory, compile time and the compiler's fit "
                   "verdict (needs the tpu-compile extra; minutes for large models).")
@click.option("--fit", is_flag=True,
              help="With --plan --target: also find the most rows per chip of the longest bucket that compile "
                   "(bisection with the compiler: a few more compiles).")
@click.option("--jobs", type=click.IntRange(min=1), default=None, metavar="N",
              help="With --plan --target: compile up to N graphs at once (default: this machine's cores); each "
                   "extra compile takes host memory, printed with the report.")
def train_main(dataset: Path | None, run_dir: Path | None, config_path: Path | None, overrides: tuple[str, ...],
               backend: str | None, resume: bool, max_compiles: int | None, device: str | None,
               no_progress: bool, devices: str | None, mesh: str | None, plan: bool,
               device_memory: str | None, init_from: Path | None, verify_data: bool, target: str | None,
               fit: bool, compile_cache: Path | None, jobs: int | None) -> None:
    """Train a phoneme decoder (model.family: the reference GRU, or the noise-separating
    three-GRU model) on DATASET (a b2t-preprocess output) into RUN_DIR.

    It first prints the device it found, then compiles every graph of the run before the
    first step (the warm-up), one numbered line per piece as it starts, "compiling 3/9: train
    step, bucket T=246 B=16 (about 49 s, as last time)", and one as it ends, "compiled 3/9:
    ...: 2 graphs, 50.0 s"; after it no step compiles again. Steps/s and the ETA count the
    steps after the warm-up only; the end prints where the time went, the best validation,
    the checkpoints and the next commands. A --resume of a finished run compiles nothing and
    prints that summary again. RUN_DIR receives
    last.safetensors (resumable), best.safetensors (lowest validation PER), metrics.jsonl
    (losses, PER per session, XLA compilations and host fallbacks) and tensorboard/ (the
    same as TensorBoard events); `b2t-report RUN_DIR` plots them into a PNG.
    """
    from b2t.train.loop import RunOptions, train
    from b2t.train.mesh import parse_devices

    if backend is not None:
        overrides = (*overrides, f"train.backend={backend}")
    mesh_cfg = parse_devices(devices, mesh)
    if mesh_cfg is not None:
        overrides = (*overrides, f"mesh.data={mesh_cfg.data}", f"mesh.fsdp={mesh_cfg.fsdp}")
    cfg = load_config(config_path, overrides)
    if plan and target is not None:
        click.echo(_tpu_check_text(dataset, cfg, target, fit, jobs))
        return
    if target is not None or fit or jobs is not None:
        raise UsageError("--target, --fit and --jobs are --plan options: b2t-train --plan --target v5e-8 ...")
    if plan:
        click.echo(_plan_text(dataset, cfg, device_memory))
        return
    if device_memory is not None:
        raise UsageError("--device-memory is a --plan option")
    if dataset is None:
        raise UsageError("DATASET is required (a b2t-preprocess output; only --plan runs without one)")
    if run_dir is None:
        raise UsageError("RUN_DIR is required (only --plan runs without one)")
    refuse_clashes([Place("RUN_DIR", run_dir, tree=True)], [Place("DATASET", dataset, tree=True)])
    if compile_cache is not None:
        from b2t.train.devices import use_compile_cache

        use_compile_cache(compile_cache)
    summary = train(dataset, run_dir, cfg, RunOptions(resume=resume, max_compiles=max_compiles,
                                                       progress=not no_progress, device=device,
                                                       init_from=init_from, verify_data=verify_data))
    if summary["rank"] == 0:
        from b2t.train.summary import format_summary

        click.echo(format_summary(summary))


def _plan_text(dataset: Path | None, cfg: Config, device_memory: str | None) -> str:
    """`--plan`: the memory plan for DATASET's buckets (else the competition data's) on the
    config's mesh, and with --device-memory the mesh of as many devices it recommends (no XLA
    start-up unless --devices all has to count the devices)."""
    from b2t.train.devices import device_count
    from b2t.train.plan import format_plan, parse_bytes, plan_memory

    buckets, n_days, source = _plan_data(dataset)
    xla = cfg.train.backend in XLA_BACKENDS
    mesh = cfg.mesh
    count = device_count(xla) if mesh.data == -1 else mesh.data * mesh.fsdp
    memory = parse_bytes(device_memory) if device_memory is not None else None
    plan = plan_memory(buckets, n_days, cfg, count, fsdp=mesh.fsdp, device_memory=memory)
    return f"planning for {source} ({n_days} sessions, {len(buckets)} buckets)\n" + format_plan(plan, cfg)


def _tpu_check_text(dataset: Path | None, cfg: Config, target: str, fit: bool, jobs: int | None) -> str:
    """`--plan --target`: the TPU compiler's report on DATASET's buckets (else the competition data's)."""
    from b2t.tpu.check import run_check
    from b2t.tpu.side_by_side import default_jobs
    from b2t.tpu.targets import parse_target

    chosen = parse_target(target)
    buckets, n_days, source = _plan_data(dataset)
    text = run_check(chosen, cfg, buckets, n_days, lambda what: click.echo(what, err=True), fit=fit,
                     jobs=jobs or default_jobs())
    return f"checking for {source} ({n_days} sessions, {len(buckets)} buckets)\n" + text


def _plan_data(dataset: Path | None) -> tuple[list, int, str]:
    """(buckets, sessions, what they are) of DATASET's manifest, else of the competition data."""
    from b2t.data.manifest import Manifest
    from b2t.train.plan import COMPETITION_BUCKETS, COMPETITION_DAYS

    if dataset is None:
        return list(COMPETITION_BUCKETS), COMPETITION_DAYS, "no DATASET: the Brain-to-Text '25 data"
    manifest = Manifest.load(dataset)
    return manifest.buckets, len(manifest.sessions), str(dataset)
