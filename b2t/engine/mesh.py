"""The XLA SPMD mesh: which devices a batch is split over, how weights are sharded, and placement.

GSPMD: the process sees every device as one. The mesh has two axes, `data` x `fsdp`
(`--mesh data=N,fsdp=M`, N*M devices):

- every batch tensor is split along its batch dim over both axes (N*M row shards), so
  every bucket's B must divide by N*M (`data.row_multiple` in the preprocessor makes it so);
- with fsdp > 1, every parameter and its two AdamW moments are split along their largest
  dim that divides by M over the `fsdp` axis (replicated over `data`; a tensor with no such
  dim stays whole): ZeRO-3 as sharding annotations, XLA inserting the all-gathers before the
  weights are used and the reduce-scatters of the gradients (which live within a step, split
  as the weights they update);
- with fsdp = 1 (`--devices N`, `--mesh data=N`) weights and AdamW state stay replicated and
  XLA inserts the gradient all-reduce.

Still one graph per bucket. The annotations stay on the tensors through in-place updates
(backward accumulation, AdamW, checkpoint loads), and a checkpoint reads every sharded
tensor back whole (`.cpu()` assembles the shards), so files do not depend on the mesh.

torch_xla 2.9 behaviours worked around under SPMD are listed in `b2t.xla_workarounds` (`spmd-*`
entries): the backend waits for each step and compiles openxla's backward lazily under a mesh.
Every step donates its training state's buffers (`Backend.donate`), on a mesh as on one device.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import nn

from b2t.config import MeshConfig
from b2t.contract import BucketShape
from b2t.engine.devices import xla_rank_world
from b2t.errors import B2tError
from b2t.private_api import local_shard_indices, local_shards, sharding_constraint, sharding_spec

DATA_AXIS, FSDP_AXIS = "data", "fsdp"
BATCH_AXES = (DATA_AXIS, FSDP_AXIS)
"""A batch's rows are split over both axes: every device steps its own rows."""


class ParallelError(B2tError, ValueError):
    """A device or host layout that cannot run; the message says how to fix it."""


def parse_devices(devices: str | None, mesh: str | None) -> MeshConfig | None:
    """`--devices all|N` / `--mesh data=N,fsdp=M` -> the mesh (data -1 for all), None when neither
    was given. An axis `--mesh` leaves out has size 1 (`--mesh fsdp=8`: data=1)."""
    if devices is not None and mesh is not None:
        raise ParallelError("give --devices or --mesh, not both")
    if mesh is not None:
        return _parse_mesh(mesh)
    if devices is None:
        return None
    if devices == "all":
        return MeshConfig(data=-1)
    if not devices.isdigit() or int(devices) < 1:
        raise ParallelError(f"--devices {devices!r}: write 'all' or a positive device count")
    return MeshConfig(data=int(devices))


def _parse_mesh(text: str) -> MeshConfig:
    sizes: dict[str, int] = {}
    for item in text.split(","):
        m = re.fullmatch(rf"\s*({DATA_AXIS}|{FSDP_AXIS})\s*=\s*(\d+|all)\s*", item)
        if m is None or m.group(1) in sizes or (m.group(2) == "all" and m.group(1) == FSDP_AXIS):
            raise ParallelError(f"--mesh {text!r}: write --mesh {DATA_AXIS}=N,{FSDP_AXIS}=M (either may be left "
                                f"out; {DATA_AXIS}=all for the devices fsdp leaves)")
        sizes[m.group(1)] = -1 if m.group(2) == "all" else int(m.group(2))
    if 0 in sizes.values():
        raise ParallelError(f"--mesh {text!r}: axis sizes must be >= 1")
    return MeshConfig(**sizes)


def mesh_axes(data: int, fsdp: int) -> dict[str, int]:
    """Axis name -> size, as recorded in checkpoints and metrics (fsdp only when it shards)."""
    return {DATA_AXIS: data, **({FSDP_AXIS: fsdp} if fsdp > 1 else {})}


def shard_dim(shape: Sequence[int], fsdp: int) -> int | None:
    """The dim a weight of `shape` is split along over `fsdp` devices: its largest that divides
    evenly (the first of equals), so no shard is padded; None: it stays whole."""
    dims = [d for d, n in enumerate(shape) if n % fsdp == 0 and n >= fsdp]
    return max(dims, key=lambda d: shape[d]) if fsdp > 1 and dims else None


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
    """A `data` x `fsdp` mesh over every device: places batches split along their batch dim over
    both axes, and shards weights and their training state over `fsdp`."""

    def __init__(self, data: int, fsdp: int = 1):
        import numpy as np
        import torch_xla.distributed.spmd as xs

        self.data, self.fsdp = data, fsdp
        self.n_devices = data * fsdp
        self.mesh = xs.Mesh(np.arange(self.n_devices), (data, fsdp), (DATA_AXIS, FSDP_AXIS))
        self._mesh_text = str(self.mesh)  # how torch_xla's traceable annotation op takes a mesh

    def axes(self) -> dict[str, int]:
        """Axis name -> size, as recorded in checkpoints and metrics."""
        return mesh_axes(self.data, self.fsdp)

    def spec(self, t: torch.Tensor, rows: int = 0) -> tuple:
        """A batch tensor's partition spec: rows (dim `rows`) over both axes, the other dims whole."""
        return tuple(BATCH_AXES if d == rows else None for d in range(t.dim()))

    def weight_spec(self, t: torch.Tensor) -> tuple:
        """A weight's (or its gradient's, or moment's) spec: `shard_dim` over fsdp, the rest whole."""
        spec: list[str | None] = [None] * t.dim()
        d = shard_dim(t.shape, self.fsdp)
        if d is not None:
            spec[d] = FSDP_AXIS
        return tuple(spec)

    def shard_training_state(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        """Annotate every parameter (and `.grad`, within a step) and its AdamW moments with `weight_spec` (fsdp > 1).

        Done once, when the stepper is made (after any checkpoint load): a loaded or freshly
        zeroed tensor is whole on every device until annotated; the annotation then stays
        with the tensor through every in-place update.
        """
        if self.fsdp == 1:
            return
        import torch_xla.distributed.spmd as xs

        for t, spec in self.weight_state(model, optimizer):
            if not sharding_spec(t):
                xs.mark_sharding(t, self.mesh, spec)

    def split_activations(self, model: nn.Module) -> None:
        """fsdp: every day layer's and GRU stack's output, and its gradient, annotated to stay split
        by rows over both axes (as torch_xla's FSDPv2 does with `mark_sharding_with_gradients`), on
        both XLA backends; and each GRU stack's initial state (`GRUStack.split_rows`).

        Without it GSPMD met row-split activations and fsdp-split weights at each matmul and
        replicated activations ("Involuntary full rematerialization", docs/tpu.md). Registered
        once per module (a resumed stepper asks again).
        """
        if self.fsdp == 1:
            return
        from b2t.model.layers import DayLayer, GRUStack

        for module in model.modules():
            if isinstance(module, (DayLayer, GRUStack)) and not getattr(module, "_rows_split_hook", None):
                module._rows_split_hook = module.register_forward_hook(self._split_output)
            if isinstance(module, GRUStack):
                module.split_rows = self.split_rows

    def split_rows(self, t: torch.Tensor, rows: int = 0) -> torch.Tensor:
        """`t` and its gradient constrained to the batch's row split along dim `rows`, inside the
        compiled graph under openxla as in the lazy one (`private_api.sharding_constraint`)."""
        return sharding_constraint(t, self._mesh_text, str(self.spec(t, rows)))

    def _split_output(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        return self.split_rows(output)

    def weight_state(self, model: nn.Module,
                     optimizer: torch.optim.Optimizer | None) -> Iterator[tuple[torch.Tensor, tuple]]:
        """Every parameter, its `.grad` and its same-shape AdamW state, each with its
        parameter's `weight_spec`: the tensors fsdp shards."""
        for p in model.parameters():
            spec = self.weight_spec(p)
            state = optimizer.state.get(p, {}) if optimizer is not None else {}
            same_shape = [v for v in state.values() if isinstance(v, torch.Tensor) and v.shape == p.shape]
            for t in (p, p.grad, *same_shape):
                if t is not None:
                    yield t, spec

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


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """`t` whole on the host; a weight sharded over the mesh is assembled from its device shards.

    Why not `.cpu()`: on a sharded tensor it compiles (and runs) a gathering graph, every
    call, so each checkpoint after the warm-up would compile one graph per tensor. Reading
    the shards back is a plain transfer.
    """
    t = t.detach()
    if t.device.type != "xla" or sharding_spec(t) in ("", "{replicated}"):
        return t.to("cpu", copy=True).contiguous()  # a copy even of a CPU tensor, which `.cpu()` returns as is
    whole = torch.empty(t.shape, dtype=t.dtype)
    shards, indices = local_shards(t), local_shard_indices(t)
    for (data, _), (_, index) in zip(shards, indices):
        region = whole[tuple(index)]
        region.copy_(data[tuple(slice(0, n) for n in region.shape)])  # a padded shard's tail is dropped
    return whole


def device_bytes(tensors: Iterable[torch.Tensor]) -> list[int]:
    """Bytes each device holds of `tensors` (device data on an SPMD mesh), from the shards
    torch_xla reports per device (padding included); an unannotated tensor is whole on each."""
    import torch_xla.runtime as xr

    per_device = [0] * xr.global_runtime_device_count()
    for t in tensors:
        if not sharding_spec(t):
            per_device = [n + t.numel() * t.element_size() for n in per_device]
            continue
        for data, device in local_shards(t):
            per_device[int(device.split(":")[-1])] += data.numel() * data.element_size()
    return per_device


def spmd_mesh(cfg: MeshConfig) -> SpmdMesh:
    """The mesh `cfg` (data -1: every device fsdp leaves) over this process's devices, once it
    is switched to SPMD (`backend.enable_spmd` does both)."""
    import torch_xla.runtime as xr

    _check_jax()
    _, hosts = xla_rank_world()
    if hosts > 1:
        raise ParallelError(
            f"SPMD over {hosts} hosts needs every host on the same bucket at every step, which the shard "
            "reader does not guarantee yet: train on one host's devices (a v5e-8 host has 8)"
        )
    n = xr.global_runtime_device_count()
    if n % cfg.fsdp:
        raise ParallelError(f"fsdp={cfg.fsdp} does not divide the {n} devices: choose a divisor of {n}")
    data = n // cfg.fsdp if cfg.data == -1 else cfg.data
    if data * cfg.fsdp != n:
        raise ParallelError(
            f"asked for data={data} x fsdp={cfg.fsdp} = {data * cfg.fsdp} devices but SPMD spans all {n}: "
            f"use --devices all or --mesh data=all,fsdp={cfg.fsdp}, or make fewer devices visible "
            "(CPU_NUM_DEVICES on the CPU, TPU_VISIBLE_CHIPS on a TPU host)"
        )
    return SpmdMesh(data, cfg.fsdp)


def _check_jax() -> None:
    try:
        import jax  # noqa: F401
        import torchax  # noqa: F401
    except ImportError:
        raise ParallelError(
            "SPMD training (--devices/--mesh) needs jax and torchax (torch_xla's scan backward shards "
            "through them): install b2t's spmd extra, pip install -e '.[spmd]' (make install does)"
        ) from None
