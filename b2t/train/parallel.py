"""How one run spreads over devices and hosts: an XLA SPMD mesh, or torch.distributed DDP.

Two engines, one trainer:

- XLA (`--devices all` or `--mesh data=N`, openxla or xla backend): GSPMD. The process sees
  every device as one; each batch tensor is sharded along its batch dim over a 1-D mesh
  named `data`, the weights and AdamW state stay replicated, and XLA inserts the gradient
  all-reduce. Still one graph per bucket, so every bucket's B must divide evenly over the
  mesh (`data.row_multiple` in the preprocessor makes it so).
- torch.distributed (`torchrun`, with the inductor or eager backend): one process per
  device, DistributedDataParallel all-reduces gradients; NCCL on CUDA, gloo on the CPU.

Either way the data reader splits shards by (rank, world) (`b2t.data.loader`), only rank
0 writes checkpoints and the main metrics file, and checkpoints hold the plain model's
state dict, so they load on one device and on any mesh alike.

SPMD caveats measured with torch_xla 2.9 (why `enable_spmd` sets what it sets):
- openxla: torch_xla's dynamo bridge, when it runs a compiled backward graph again, feeds a
  forward input that the backward reads as-is (the day indices, for the day layers'
  gradient) from the first call's buffer, not this call's: from the second step on the
  day-layer gradients were wrong (a bmm against a batch-expanded weight reproduces it in a
  dozen lines; one device is unaffected). So under SPMD dynamo's forward graphs are
  compiled by the bridge and their backward graphs are traced lazily into the step
  (`spmd_openxla`), which matches one device.
- Tracing the next step while the mesh still executes this one crashed the process inside
  torch_xla (a segfault building the scan backward's lowering context, or a collective
  rendezvous timeout), within a few steps of most CLI runs; `Backend.sync` waits for the
  step under SPMD, which costs the overlap of tracing with execution.
- `use_spmd()` must run before any XLA computation, so it runs before the backend is made.
- The scan backward (GRU and CTC islands) calls `torch_xla...shard_as`, which needs jax
  and torchax installed (`torch_xla[pallas]` pulls jax; torchax is separate).
- With input/output buffer aliasing on, which inputs XLA may donate is part of the graph
  key, and under SPMD it depended on which graph last wrote the weights: a bucket revisited
  after another bucket's step compiled its step graph a second time (not so on one device).
  So aliasing is off under SPMD unless XLA_ENABLE_PARAM_ALIASING is set: one graph per
  bucket whatever the history (resume, warm-up restore), at the price of one more copy of
  weights and AdamW state during the update (the planner counts it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from b2t.contract import BucketShape
from b2t.train.backend import XLA_BACKENDS, select_pjrt_device

if TYPE_CHECKING:
    from torch import nn

MESH_AXIS = "data"
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
"""Variables torchrun sets for every process it starts."""


class ParallelError(ValueError):
    """A device or host layout that cannot run; the message says how to fix it."""


@dataclass(frozen=True)
class Layout:
    """Where this process sits: `rank` of `world` data readers, batches split over `devices`.

    kind: "single" (one device), "spmd" (one process drives `devices` XLA devices) or
    "ddp" (one of `world` torchrun processes, one device each).
    """

    kind: str
    rank: int = 0
    world: int = 1
    devices: int = 1

    @property
    def is_main(self) -> bool:
        """The one process that writes checkpoints, the main metrics file and validates."""
        return self.rank == 0


def parse_devices(devices: str | None, mesh: str | None) -> int | None:
    """`--devices all|N` / `--mesh data=N` -> N, -1 for all, None when neither was given."""
    if devices is not None and mesh is not None:
        raise ParallelError("give --devices or --mesh, not both")
    if mesh is not None:
        m = re.fullmatch(rf"\s*{MESH_AXIS}\s*=\s*(\d+|all)\s*", mesh)
        if m is None:
            raise ParallelError(f"--mesh {mesh!r}: only a 1-D data mesh is supported, write --mesh {MESH_AXIS}=N")
        devices = m.group(1)
    if devices is None:
        return None
    if devices == "all":
        return -1
    if not devices.isdigit() or int(devices) < 1:
        raise ParallelError(f"--devices {devices!r}: write 'all' or a positive device count")
    return int(devices)


def torchrun_rank_world(env: dict[str, str] | None = None) -> tuple[int, int, int] | None:
    """(rank, world, local_rank) from torchrun's variables, or None outside torchrun."""
    env = os.environ if env is None else env
    if "WORLD_SIZE" not in env:
        return None
    missing = [k for k in TORCHRUN_ENV if k not in env]
    if missing:
        raise ParallelError(f"WORLD_SIZE is set but {', '.join(missing)} are not: start the run with torchrun")
    return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"])


def xla_rank_world() -> tuple[int, int]:
    """(host index, host count) of the XLA runtime: 0 of 1 on one host, pod hosts otherwise."""
    import torch_xla.runtime as xr

    return xr.process_index(), xr.process_count()


def check_divisible(buckets: list[BucketShape], n_devices: int) -> None:
    """Every bucket's B must split evenly over the devices (one graph per bucket, equal shards)."""
    bad = [b for b in buckets if b.B % n_devices]
    if bad:
        listed = ", ".join(f"T={b.T} B={b.B}" for b in bad)
        raise ParallelError(
            f"batch rows do not divide over {n_devices} devices in buckets {listed}: re-run b2t-preprocess "
            f"with --set data.row_multiple={n_devices} (or a multiple of it)"
        )


class SpmdMesh:
    """A 1-D `data` mesh over every device; places batches sharded along their batch dim."""

    def __init__(self, n_devices: int):
        import numpy as np
        import torch_xla.distributed.spmd as xs

        self.n_devices = n_devices
        self.mesh = xs.Mesh(np.arange(n_devices), (n_devices,), (MESH_AXIS,))

    def spec(self, t: torch.Tensor) -> tuple[str | None, ...]:
        return (MESH_AXIS,) + (None,) * (t.dim() - 1)

    def place(self, tensors: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
        """Batch tensors on the mesh, each split along dim 0 (host tensors go straight to
        their shards; device tensors, as the evaluator hands them, are resharded)."""
        import torch_xla.core.xla_model as xm
        import torch_xla.distributed.spmd as xs

        out = {}
        for k, t in tensors.items():
            if t.device.type == "cpu":
                (out[k],) = xm.send_cpu_data_to_device([t], device, xs.ShardingSpec(self.mesh, self.spec(t)))
            else:
                out[k] = t if sharding_spec(t) else xs.mark_sharding(t, self.mesh, self.spec(t)).global_tensor
        return out

    def replicate(self, t: torch.Tensor) -> torch.Tensor:
        """`t` annotated to be whole on every device (XLA all-gathers it inside the graph)."""
        import torch_xla.distributed.spmd as xs

        spec, whole = sharding_spec(t), (None,) * t.dim()
        if spec == "{replicated}":
            return t
        if spec:  # already computed and split (an openxla graph's output): a resharding node
            return xs.annotate_custom_sharding(t, self.mesh, whole).global_tensor
        return xs.mark_sharding(t, self.mesh, whole).global_tensor


def sharding_spec(t: torch.Tensor) -> str:
    """The XLA sharding of `t` as text, e.g. `{devices=[4,1,1]0,1,2,3}`; '' when unsharded."""
    import torch_xla

    return torch_xla._XLAC._get_xla_sharding_spec(t)


def spmd_openxla() -> Callable:
    """The openxla compiler for SPMD runs: dynamo's forward graphs compiled by torch_xla's
    bridge, their AOT backward graphs traced lazily into the step (see the module docstring).
    """
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.torchxla import openxla_eval_boxed

    return aot_autograd(fw_compiler=openxla_eval_boxed, bw_compiler=lambda gm, _: make_boxed_func(gm.forward))


def enable_spmd(requested: int) -> SpmdMesh:
    """Switch this process to SPMD over `requested` devices (-1: all). Call before any XLA work."""
    select_pjrt_device()
    os.environ.setdefault("XLA_ENABLE_PARAM_ALIASING", "0")  # see the module docstring
    import torch_xla.runtime as xr

    _check_jax()
    _, hosts = xla_rank_world()
    if hosts > 1:
        raise ParallelError(
            f"SPMD over {hosts} hosts needs every host on the same bucket at every step, which the shard "
            "reader does not guarantee yet: train on one host's devices (a v5e-8 host has 8)"
        )
    xr.use_spmd()
    n = xr.global_runtime_device_count()
    if requested not in (-1, n):
        raise ParallelError(
            f"asked for {requested} devices but SPMD spans all {n}: use --devices all, or make fewer devices "
            "visible (CPU_NUM_DEVICES on the CPU, TPU_VISIBLE_CHIPS on a TPU host)"
        )
    return SpmdMesh(n)


def _check_jax() -> None:
    try:
        import jax  # noqa: F401
        import torchax  # noqa: F401
    except ImportError:
        raise ParallelError(
            "SPMD training needs jax and torchax (torch_xla's scan backward shards through them): "
            "pip install 'torch_xla[pallas]==2.9.0' torchax"
        ) from None


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


def make_layout(backend: str, requested: int | None) -> tuple[Layout, SpmdMesh | None, torch.device | None]:
    """The layout for `backend` given `--devices`/`--mesh` (`requested`) and the environment.

    Returns the layout, the SPMD mesh (XLA data-parallel only) and the device DDP pinned
    (torchrun only). Refuses the combinations that cannot run, saying what to use instead.
    """
    xla = backend in XLA_BACKENDS
    run = torchrun_rank_world()
    if xla:
        if run is not None and run[1] > 1:
            raise ParallelError("the XLA backends spread over devices with SPMD in one process per host: "
                                "run b2t-train --devices all without torchrun")
        if requested is None:
            return Layout("single"), None, None
        mesh = enable_spmd(requested)
        return Layout("spmd", devices=mesh.n_devices), mesh, None
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
