"""The XLA SPMD mesh: which devices a batch is split over, and how tensors are placed on it.

GSPMD: the process sees every device as one. Each batch tensor is sharded along its batch
dim over a 1-D mesh named `data`; weights and AdamW state stay replicated and XLA inserts
the gradient all-reduce. Still one graph per bucket, so every bucket's B must divide evenly
over the mesh (`data.row_multiple` in the preprocessor makes it so).

torch_xla 2.9 behaviours this module works around are listed in `b2t.xla_workarounds`
(`spmd-*` entries): `enable_spmd` turns parameter aliasing off before the runtime starts,
and the backend waits for each step and compiles openxla's backward lazily under a mesh.
"""

from __future__ import annotations

import os
import re

import torch

from b2t.contract import BucketShape
from b2t.train.devices import select_pjrt_device, xla_rank_world

MESH_AXIS = "data"


class ParallelError(ValueError):
    """A device or host layout that cannot run; the message says how to fix it."""


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

    def axes(self) -> dict[str, int]:
        """Axis name -> size, as recorded in checkpoints and metrics."""
        return {MESH_AXIS: self.n_devices}

    def spec(self, t: torch.Tensor) -> tuple[str | None, ...]:
        return (MESH_AXIS,) + (None,) * (t.dim() - 1)

    def place(self, tensors: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
        """Batch tensors on the mesh, each split along dim 0 (host tensors go straight to
        their shards; device tensors are resharded)."""
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


def enable_spmd(requested: int) -> SpmdMesh:
    """Switch this process to SPMD over `requested` devices (-1: all). Call before any XLA work:
    torch_xla's `use_spmd()` must run before the first XLA computation."""
    select_pjrt_device()
    os.environ.setdefault("XLA_ENABLE_PARAM_ALIASING", "0")  # b2t.xla_workarounds: spmd-param-aliasing
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
            "SPMD training (--devices/--mesh) needs jax and torchax (torch_xla's scan backward shards "
            "through them): install b2t's spmd extra, pip install -e '.[spmd]' (make install does)"
        ) from None
