"""`b2t-plan`: does a run fit its devices, and how long will it compile? Answered before renting them.

Two answers, from the same config, dataset buckets and mesh as `b2t-train`:
- the shape model (`b2t.plan.memory`): parameters per model part, the bucket table and the
  estimated memory per device, in a second; with --device-memory, the largest micro-batch that
  fits and the mesh it recommends;
- with --target SLICE, the TPU compiler itself (`b2t.plan.check`, libtpu, no TPU needed): every
  graph of the run compiled for the slice, per bucket and chip the memory, compile time and the
  compiler's fit verdict (minutes for a large model).
"""

from __future__ import annotations

from pathlib import Path

import click

from b2t.cli.options import backend_option, config_option, mesh_options, run_config, set_option
from b2t.cli.rule import Command
from b2t.config import Config
from b2t.errors import UsageError


@click.command(cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("dataset", type=click.Path(exists=True, file_okay=False, path_type=Path), required=False)
@config_option
@set_option
@backend_option
@mesh_options
@click.option("--device-memory", default=None, metavar="SIZE",
              help="Memory per device, e.g. 16GiB: also print the largest micro-batch that fits (the shape model).")
@click.option("--target", default=None, metavar="TPU",
              help="Compile every graph of the run with the TPU compiler for this slice (v5e-1, v5e-4, v5e-8, "
                   "v5e-16, v5e-64, v5e-256, v6e-1, v6e-8, v5p-8, v4-8) on this machine, no TPU needed, and print "
                   "per bucket and chip the memory, compile time and the compiler's fit verdict (needs the "
                   "tpu-compile extra; minutes for large models).")
@click.option("--fit", is_flag=True,
              help="With --target: also find the most rows per chip of the longest bucket that compile (bisection "
                   "with the compiler: a few more compiles).")
@click.option("--jobs", type=click.IntRange(min=1), default=None, metavar="N",
              help="With --target: compile up to N graphs at once (default: half this machine's cores, as one "
                   "compile keeps about two busy); each extra compile takes host memory, printed with the report.")
def plan_main(dataset: Path | None, config_path: Path | None, overrides: tuple[str, ...], backend: str | None,
              devices: str | None, mesh: str | None, device_memory: str | None, target: str | None, fit: bool,
              jobs: int | None) -> None:
    """Plan a b2t-train run of DATASET's buckets (a b2t-preprocess output; without it, the
    Brain-to-Text '25 data: 45 sessions, trials up to 2,500 bins) with this config and mesh:
    the shape model's memory estimate per device, or with --target the TPU compiler's verdict.
    Nothing is trained and no device is needed."""
    cfg = run_config(config_path, overrides, backend, devices, mesh)
    if target is None:
        if fit or jobs is not None:
            raise UsageError("--fit and --jobs go with --target SLICE (the TPU compiler's check)")
        click.echo(_plan_text(dataset, cfg, device_memory))
        return
    if device_memory is not None:
        raise UsageError("--device-memory sizes the shape model's estimate; --target asks the TPU compiler, which "
                         "knows the chip's memory: pass one of them")
    click.echo(_tpu_check_text(dataset, cfg, target, fit, jobs))


def _plan_text(dataset: Path | None, cfg: Config, device_memory: str | None) -> str:
    """The shape model's plan for DATASET's buckets (else the competition data's) on the
    config's mesh, and with --device-memory the mesh of as many devices it recommends (no XLA
    start-up unless --devices all has to count the devices)."""
    from b2t.engine.devices import device_count
    from b2t.plan.memory import format_plan, parse_bytes, plan_memory

    buckets, n_days, source = _plan_data(dataset, cfg)
    from b2t.engine.backend import backend_class

    xla = backend_class(cfg.train.backend).xla
    mesh = cfg.mesh
    count = device_count(xla) if mesh.data == -1 else mesh.data * mesh.fsdp
    memory = parse_bytes(device_memory) if device_memory is not None else None
    plan = plan_memory(buckets, n_days, cfg, count, fsdp=mesh.fsdp, device_memory=memory)
    return f"planning for {source} ({n_days} sessions, {len(buckets)} buckets)\n" + format_plan(plan, cfg)


def _tpu_check_text(dataset: Path | None, cfg: Config, target: str, fit: bool, jobs: int | None) -> str:
    """The TPU compiler's report on DATASET's buckets (else the competition data's)."""
    from b2t.engine.concurrent_compiles import default_jobs
    from b2t.plan.check import run_check
    from b2t.plan.targets import parse_target

    chosen = parse_target(target)
    buckets, n_days, source = _plan_data(dataset, cfg)
    text = run_check(chosen, cfg, buckets, n_days, lambda what: click.echo(what, err=True), fit=fit,
                     jobs=jobs or default_jobs())
    return f"checking for {source} ({n_days} sessions, {len(buckets)} buckets)\n" + text


def _plan_data(dataset: Path | None, cfg: Config) -> tuple[list, int, str]:
    """(buckets, sessions, what they are) of DATASET's manifest, else of the competition data;
    a DATASET the config cannot train on (other patching) is refused, as b2t-train would."""
    from b2t.data.dataset import Dataset
    from b2t.plan.memory import COMPETITION_BUCKETS, COMPETITION_DAYS

    if dataset is None:
        return list(COMPETITION_BUCKETS), COMPETITION_DAYS, "no DATASET: the Brain-to-Text '25 data"
    data = Dataset.open(dataset, cfg)
    return data.buckets, len(data.sessions), str(dataset)
