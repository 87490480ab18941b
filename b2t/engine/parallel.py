"""How one run spreads over devices and hosts: an XLA SPMD mesh, or torch.distributed DDP.

Two engines, one trainer:

- XLA (`--devices all` or `--mesh data=N,fsdp=M`, openxla or xla backend): GSPMD over a
  mesh (`b2t.engine.mesh`), weights replicated or (fsdp > 1) sharded; one process drives
  every device of the host.
- torch.distributed (`torchrun`, with the inductor or eager backend): one process per
  device, DistributedDataParallel all-reduces gradients; NCCL on CUDA, gloo on the CPU.

Either way the data reader splits shards by (rank, world) (`b2t.data.loader`), only rank
0 writes checkpoints and the main metrics file, and checkpoints hold the plain model's
state dict as whole tensors, so they load on one device and on any mesh alike.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from b2t.config import MeshConfig
from b2t.engine.backend import backend_class, enable_spmd
from b2t.engine.mesh import ParallelError, SpmdMesh, mesh_axes

if TYPE_CHECKING:
    from torch import nn

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
"""Variables torchrun sets for every process it starts."""


@dataclass(frozen=True)
class Layout:
    """Where this process sits: `rank` of `world` data readers, batches split over `devices`,
    weights sharded over `fsdp` of them.

    kind: "single" (one device), "spmd" (one process drives `devices` XLA devices) or
    "ddp" (one of `world` torchrun processes, one device each).
    """

    kind: str
    rank: int = 0
    world: int = 1
    devices: int = 1
    fsdp: int = 1

    @property
    def is_main(self) -> bool:
        """The one process that writes checkpoints, the main metrics file and validates."""
        return self.rank == 0

    @property
    def mesh(self) -> dict[str, int]:
        """Devices per mesh axis, as recorded in checkpoints and metrics."""
        return mesh_axes(self.devices // self.fsdp, self.fsdp)


def torchrun_rank_world(env: dict[str, str] | None = None) -> tuple[int, int, int] | None:
    """(rank, world, local_rank) from torchrun's variables, or None outside torchrun."""
    env = os.environ if env is None else env
    if "WORLD_SIZE" not in env:
        return None
    missing = [k for k in TORCHRUN_ENV if k not in env]
    if missing:
        raise ParallelError(f"WORLD_SIZE is set but {', '.join(missing)} are not: start the run with torchrun")
    return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"])


def init_ddp(rank: int, world: int, local_rank: int) -> torch.device:
    """Join the torchrun process group (NCCL on CUDA, gloo on the CPU); returns this rank's device."""
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    return torch.device("cuda", local_rank) if cuda else torch.device("cpu")


def wrap_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    """DistributedDataParallel around `model` (it broadcasts rank 0's weights on creation)."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def close_ddp() -> None:
    """Leave the process group (no barrier: a rank that failed must not wait for the others)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def make_layout(backend: str, mesh_cfg: MeshConfig) -> tuple[Layout, SpmdMesh | None, torch.device | None]:
    """The layout for `backend` given the config's mesh (`--devices`/`--mesh`) and the environment.

    Returns the layout, the SPMD mesh (XLA data-parallel only) and the device DDP pinned
    (torchrun only). Refuses the combinations that cannot run, saying what to use instead.
    """
    requested = mesh_cfg.data if mesh_cfg.spmd else None  # -1: every device
    xla = backend_class(backend).xla
    run = torchrun_rank_world()
    if xla:
        if run is not None and run[1] > 1:
            raise ParallelError("the XLA backends spread over devices with SPMD in one process per host: "
                                "run b2t-train --devices all without torchrun")
        if requested is None:
            return Layout("single"), None, None
        mesh = enable_spmd(mesh_cfg, backend)
        return Layout("spmd", devices=mesh.n_devices, fsdp=mesh.fsdp), mesh, None
    if mesh_cfg.fsdp > 1:
        raise ParallelError(f"--backend {backend} does not shard weights: mesh.fsdp needs --backend xla or openxla")
    if run is None or run[1] == 1:
        if requested not in (None, 1):
            raise ParallelError(f"--backend {backend} spreads over devices with one process each: "
                                f"torchrun --nproc-per-node N b2t-train ... (or use --backend xla --devices all)")
        return Layout("single"), None, None
    rank, world, local_rank = run
    if requested not in (None, -1, world):
        raise ParallelError(f"--devices {requested} differs from torchrun's {world} processes")
    device = init_ddp(rank, world, local_rank)
    return Layout("ddp", rank=rank, world=world, devices=world), None, device
