"""Options several commands share (the config file and its overrides, the backend, the mesh),
and the one way they make the run's config."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from b2t.config import BACKENDS, Config, load_config
from b2t.paths import RegularFile

FLOAT32_MAX = float(np.finfo(np.float32).max)


class Finite(click.FloatRange):
    """A float option (in a range, as click.FloatRange) that refuses nan, inf and what float32
    cannot hold: click's float reads "nan" and "inf", and a score of 1e308 became inf in the
    decoder (every trial decoded as nothing); no weight, score or std of b2t means them."""

    name = "finite number"

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]  # click's signature
        number = super().convert(value, param, ctx)
        if not abs(number) <= FLOAT32_MAX:  # nan fails too
            self.fail(f"{value!r} is not a finite number float32 can hold.", param, ctx)
        return number

    def _describe_range(self) -> str:
        return "" if self.min is None and self.max is None else super()._describe_range()  # not "x<=None"


config_option = click.option(
    "--config", "config_path", type=RegularFile(),
    help="YAML config (configs/baseline.yaml is the reference recipe, configs/tiny.yaml the demo).",
)
set_option = click.option(
    "--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
    help="Override one config value, e.g. --set train.steps=500 (repeatable).",
)
backend_option = click.option(
    "--backend", type=click.Choice(BACKENDS), default=None,
    help="openxla: torch.compile on the XLA device (TPU, or the CPU with PJRT_DEVICE=CPU); "
         "inductor: torch.compile on CUDA or CPU; eager: no compilation. Default: train.backend.",
)


def mesh_options(command: click.Command) -> click.Command:
    """--devices and --mesh: the SPMD mesh a run (or a plan) spans."""
    command = click.option(
        "--mesh", default=None, metavar="data=N,fsdp=M",
        help="The SPMD mesh: batches split over all N*M devices, weights, gradients and AdamW moments "
             "sharded over M of them (fsdp); --mesh data=N is --devices N, --mesh fsdp=8 shards over 8.")(command)
    return click.option(
        "--devices", default=None, metavar="all|N",
        help="Data-parallel over all (or N) devices of this host with XLA SPMD (openxla or xla backend); every "
             "bucket's B must divide by the device count (data.row_multiple). On GPUs use torchrun "
             "--nproc-per-node N b2t-train ... instead.")(command)


def run_config(config_path: Path | None, overrides: tuple[str, ...], backend: str | None, devices: str | None,
               mesh: str | None) -> Config:
    """The config file with its --set overrides, then --backend and --devices/--mesh (as `train.backend`,
    `mesh.data`, `mesh.fsdp` overrides, so each is checked as the config's own value)."""
    from b2t.engine.mesh import parse_devices

    if backend is not None:
        overrides = (*overrides, f"train.backend={backend}")
    mesh_cfg = parse_devices(devices, mesh)
    if mesh_cfg is not None:
        overrides = (*overrides, f"mesh.data={mesh_cfg.data}", f"mesh.fsdp={mesh_cfg.fsdp}")
    return load_config(config_path, overrides)
