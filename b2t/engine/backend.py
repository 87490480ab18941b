"""How the one step function is compiled and run: openxla, xla, inductor or eager.

- openxla: `torch.compile(backend="openxla")` on the XLA device; dynamo compiles the whole
  step's forward (augmentation, model, loss; the GRU and CTC recurrences are custom ops
  whose XLA while-loops land in the same HLO module) and its backward: 3 graphs per
  bucket shape on the tiny config with the eval graph, plus a shared optimizer graph.
- xla: no dynamo; the whole step is traced lazily and cut by `torch_xla.sync()`, which is
  what `torch_xla.compile` does and what the torch_xla docs recommend for performance
  (about 3 graphs per bucket shape).
- inductor: `torch.compile` for CUDA or CPU; eager: plain PyTorch.

The backend changes how the step is compiled, never what it computes. Everything that
differs between devices lives here: which device, how batches get onto it (sharded over
an SPMD mesh when there is one, see `mesh`), how host values and zeros become device data
(`upload`, `zeros`), how to compile, how to cut and run the lazy graph, where a step's random
draws come from, and (on XLA) how many compilations and host fallbacks the run has caused so
far, read from `torch_xla.debug.metrics`. The training state made up front and the warm-up's
snapshot of it are in `device_state`; the process-wide settings in `process`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from b2t.config import BACKENDS, MeshConfig
from b2t.contract import COMPUTE_DTYPE, LOSS_DTYPE, compute_dtype
from b2t.engine.devices import checked_device, select_pjrt_device
from b2t.engine.mesh import SpmdMesh, spmd_mesh
from b2t.engine.rng import CounterRng, Rng, TorchRng
from b2t.errors import UsageError
from b2t.private_api import (
    aot_autograd,
    cpu_has_bf16_matmuls,
    donate_buffer,
    openxla_eval_boxed,
    raise_recompile_limit,
    scalars_as_device_data,
)

RECOMPILE_LIMIT = 64
"""Dynamo graphs per compiled function before it silently runs the function eagerly: one per
bucket shape, so well above any sensible bucket count."""


@dataclass(frozen=True)
class CompileStats:
    compilations: int  # XLA compilations so far (0 off XLA)
    fallbacks: dict[str, int]  # `aten::` counters: ops that ran on the host instead of the device
    donors: tuple[int, ...] = ()  # per compiled graph, the input buffers its outputs may reuse (`Backend.donate`)
    cache: tuple[int, int, int] = (0, 0, 0)  # persistent cache (--compile-cache): graphs loaded, stored, unloadable

    @property
    def donated(self) -> int:
        """The most buffers any of these graphs donates (a train step's: its training state)."""
        return max(self.donors, default=0)

    def to_dict(self) -> dict:
        return {"compilations": self.compilations, "fallbacks": self.fallbacks}

    def since(self, earlier: CompileStats) -> CompileStats:
        """What happened between `earlier` and these counts (fallbacks that did not grow left out)."""
        base = earlier.fallbacks
        return CompileStats(self.compilations - earlier.compilations,
                            {k: n - base.get(k, 0) for k, n in self.fallbacks.items() if n > base.get(k, 0)},
                            self.donors[len(earlier.donors):],
                            tuple(a - b for a, b in zip(self.cache, earlier.cache)))

    def cache_line(self) -> str | None:
        """What the persistent compilation cache did, for the warm-up's end; None without one.
        torch_xla 2.9 writes entries on every runtime but loads them back on none (the CPU here;
        TPU and GPU: pytorch/xla issues 9094 and 8930), which a user renting a TPU must learn
        from the first run that tries, not from the compile times."""
        loaded, stored, unloadable = self.cache
        parts = [f"{loaded} graph{'s' * (loaded != 1)} loaded"] if loaded else []
        if stored:
            parts.append(f"{stored} compiled and stored")
        if unloadable:
            parts.append(f"{unloadable} found but not loadable by this torch_xla on this device, compiled again "
                         f"(a torch_xla limitation: pytorch/xla#9094)")
        return f"compile cache: {'; '.join(parts)}" if parts else None


@dataclass(frozen=True)
class Backend:
    """eager: the step as plain torch ops on a CPU or CUDA device, nothing compiled; the base of
    the family, whose every other member owns its name, process settings, compile, RNG and stats."""

    name: ClassVar[str] = "eager"
    xla: ClassVar[bool] = False  # steps on an XLA device (lazy tensors, compiled graphs, counters)
    compiles: ClassVar[bool] = False  # compiles graphs before the first step (the warm-up's work)
    compiles_ahead: ClassVar[bool] = False  # its graphs can compile side by side while traced (openxla's)

    device: torch.device
    mesh: SpmdMesh | None = None  # XLA SPMD: batches split along their batch dim, weights maybe sharded
    baseline: CompileStats = field(default_factory=lambda: CompileStats(0, {}))
    """The process's XLA counters when this backend was made: `stats` counts from there, so a
    run in a process that compiled before (a notebook, a test session) reports its own."""

    @property
    def dynamo_backward(self) -> bool:
        """The backward is a dynamo graph that torch_xla's bridge compiles on its own (openxla's, off a mesh)."""
        return False

    @classmethod
    def configure(cls, spmd: bool = False) -> None:
        """The process-wide settings a run on this backend needs, made before anything is traced
        (`configure_process`); eager needs none, and cannot span an SPMD mesh."""
        if spmd:
            raise UsageError(f"an SPMD mesh needs an XLA backend, not {cls.name!r}")

    def place(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Batch tensors on the device (a no-op for ones already there), sharded on a mesh."""
        if self.mesh is not None:
            return self.mesh.place(tensors, self.device)
        return {k: v.to(self.device) for k, v in tensors.items()}

    def gathered(self, outputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """Outputs the host will read, whole on every device (a no-op without a mesh).

        Under SPMD, per-row outputs come out split like the batch, and reading a split
        tensor back compiles a gathering graph per shape, after the warm-up; gathering
        inside the step keeps that out of the loop.
        """
        return tuple(self.replicated(t) for t in outputs)

    def replicated(self, t: torch.Tensor) -> torch.Tensor:
        """`t` on the device; on a mesh whole on every device, and annotated so.

        State a step reads and writes (a loss accumulator, say) must carry the same sharding
        annotation every step: a fresh unannotated upload makes the next step a new graph.
        """
        t = t.to(self.device)
        return t if self.mesh is None else self.mesh.replicate(t)

    def shard(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        """On a mesh with fsdp > 1, split weights, gradients and AdamW moments over it (once,
        before the first step; `SpmdMesh.shard_training_state`) and keep activations split by
        rows (`SpmdMesh.split_activations`); otherwise nothing."""
        if self.mesh is not None:
            self.mesh.shard_training_state(model, optimizer)
            self.mesh.split_activations(model)

    def zeros(self, like: torch.Tensor) -> torch.Tensor:
        """Zeros like `like` on its device, copied from the host: device data (a zeros op on
        XLA is a graph of its own). Gradients and AdamW moments start so."""
        return torch.zeros(like.shape, dtype=like.dtype, device="cpu").to(like.device)

    def upload(self, value: float, dtype: torch.dtype = LOSS_DTYPE, shape: tuple[int, ...] = (1,)) -> torch.Tensor:
        """`value` as a tensor copied from the host (whole on every device of a mesh): device
        data whatever the value, so the graph that reads it is the same for every value.

        Per-step inputs come so: a step's seed, the model's schedule values and loss weights
        (a ramp through 0 or 1 would otherwise be baked in as a constant, torch_xla's special
        scalars), fresh loss totals (a 0-dim zero, even uploaded, is such a constant:
        `b2t.xla_workarounds`: special-scalars), and the objective's 0-dim gradient seed (a
        lazily computed one is one more graph).
        """
        return self.replicated(torch.full(shape, value, dtype=dtype, device="cpu"))

    def uploads(self, values: dict[str, float]) -> dict[str, torch.Tensor]:
        """Named per-step values, each uploaded as a (1,) f32 tensor (`upload`)."""
        return {name: self.upload(v) for name, v in values.items()}

    def compile(self, fn: Callable) -> Callable:
        """`fn` as this backend runs it (eager: as it is); static shapes, every bucket its own graph."""
        return fn

    def compute_dtype(self, name: str) -> torch.dtype:
        """`train.compute_dtype` `name` on this device: `auto` is bf16 on XLA and CUDA, and on
        a CPU only where it has bf16 matmuls (`private_api.cpu_has_bf16_matmuls`)."""
        return compute_dtype(name, self.device.type != "cpu" or cpu_has_bf16_matmuls())

    def autocast(self, dtype: torch.dtype = COMPUTE_DTYPE) -> contextlib.AbstractContextManager:
        """Compute in `dtype` around the forward (bf16 autocast; f32: none); master weights and
        optimizer state stay f32 either way."""
        return torch.autocast(self.device.type, dtype=COMPUTE_DTYPE, enabled=dtype != torch.float32)

    def donate(self, tensors: Iterable[torch.Tensor]) -> int:
        """Offer each tensor's device buffer to the next graph's outputs: nothing off XLA (see
        `XlaBackend.donate`). Returns how many were offered."""
        return 0

    def sync(self) -> None:
        """Cut and run the lazy graph: nothing off XLA."""

    def seed(self, seed: int) -> None:
        """Seed torch's RNG, which `rng`'s draws come from: reseeding per step makes resumes exact."""
        torch.manual_seed(seed)

    def rng(self, seed: torch.Tensor) -> Rng:
        """The random draws of one step: torch's RNG as `seed()` seeded it (faster here than the
        counter RNG the XLA backends draw from; see `b2t.engine.rng`)."""
        return TorchRng(seed.device)

    def stats(self) -> CompileStats:
        """Compilations and host fallbacks since this backend was made: none off XLA."""
        return CompileStats(0, {})


@dataclass(frozen=True)
class InductorBackend(Backend):
    """inductor: `torch.compile(backend="inductor")` on CUDA or the CPU."""

    name: ClassVar[str] = "inductor"
    compiles: ClassVar[bool] = True

    @classmethod
    def configure(cls, spmd: bool = False) -> None:
        """Dynamo's recompile limit raised to `RECOMPILE_LIMIT` (one graph per bucket; past the
        limit dynamo would run a bucket eagerly, silently)."""
        super().configure(spmd)
        raise_recompile_limit(RECOMPILE_LIMIT)

    def compile(self, fn: Callable) -> Callable:
        # torch's own random kernels for the step's noise and dropout masks: inductor's
        # generated CPU RNG loop cost a tiny step more than its model (docs/benchmarks.md).
        return torch.compile(fn, backend="inductor", dynamic=False, options={"fallback_random": True})


@dataclass(frozen=True)
class XlaBackend(Backend):
    """xla: no dynamo; the whole step traced lazily into one graph (what `torch_xla.compile` does)."""

    name: ClassVar[str] = "xla"
    xla: ClassVar[bool] = True
    compiles: ClassVar[bool] = True

    @classmethod
    def configure(cls, spmd: bool = False) -> None:
        """- PJRT_DEVICE chosen unless set (the TPU where this host has one, else the CPU;
          `devices.select_pjrt_device`), before torch_xla starts its runtime.
        - 0-dim 0 and 1 values stay device data instead of graph constants
          (`private_api.scalars_as_device_data`): AdamW's zero step counters, a snapshot restore
          and the loss gradient seed would each trace graphs no later step reuses
          (`b2t.xla_workarounds`: special-scalars).
        - SPMD: torch_xla's `use_spmd()`, before the first XLA computation: the process sees the
          mesh's devices as one."""
        select_pjrt_device()
        scalars_as_device_data()
        if spmd:
            import torch_xla.runtime as xr

            xr.use_spmd()

    def donate(self, tensors: Iterable[torch.Tensor]) -> int:
        """Offer each tensor's device buffer to the graph the next sync runs: a step's new weights
        and AdamW state are then written into the buffers they replace, so the training state
        exists once in device memory, not twice. Returns how many were offered (a tensor without
        a device buffer, pending or on the host, is not).

        Why every step, explicitly: at a step barrier torch_xla donates only the inputs it can
        trace to an in-place update, and under SPMD that trace depends on which graph last wrote
        each tensor (docs/tpu.md). The donors are part of a graph's hash, so a bucket revisited
        after another bucket's step compiled its step again. The same tensors offered every step
        give the same donors and hash, whatever ran before.
        """
        return sum(donate_buffer(t) for t in tensors)

    def sync(self) -> None:
        """Cut the lazy XLA graph here and run it. On an SPMD mesh, also wait for it: tracing the
        next step while the mesh still ran this one crashed the process inside torch_xla
        (`b2t.xla_workarounds`: spmd-async-trace)."""
        import torch_xla

        torch_xla.sync(wait=self.mesh is not None)

    def seed(self, seed: int) -> None:
        """Nothing: the counter RNG takes its seed as a tensor (`rng`)."""

    def rng(self, seed: torch.Tensor) -> Rng:
        """A `CounterRng` of `seed` ((1,) int32 on the device). Under openxla torch's RNG inside its
        graphs replays one draw (`b2t.xla_workarounds`: openxla-rng-in-graph); under SPMD torch's
        RNG is one rng-bit-generator of the whole batch, which the partitioner keeps whole, so
        every chip drew every row's masks (docs/tpu.md), where the counter hash is element-wise
        and splits by rows like the activations it multiplies."""
        return CounterRng(seed)

    def stats(self) -> CompileStats:
        """XLA compilations and host fallbacks since this backend was made."""
        return _xla_counts().since(self.baseline)


@dataclass(frozen=True)
class OpenXlaBackend(XlaBackend):
    """openxla: `torch.compile(backend="openxla")`: dynamo's forward and backward graphs per bucket,
    the update one lazy graph."""

    name: ClassVar[str] = "openxla"
    compiles_ahead: ClassVar[bool] = True  # torch_xla's bridge compiles each dynamo graph on its own

    @property
    def dynamo_backward(self) -> bool:
        """The backward is one of dynamo's graphs, compiled by the bridge (off a mesh); on a
        mesh it is traced lazily into the step (`spmd_openxla`), compiled by the step's sync."""
        return self.mesh is None

    @classmethod
    def configure(cls, spmd: bool = False) -> None:
        """The XLA settings, and dynamo's recompile limit raised as for inductor."""
        super().configure(spmd)
        raise_recompile_limit(RECOMPILE_LIMIT)

    def compile(self, fn: Callable) -> Callable:
        return torch.compile(fn, backend=self.dynamo_backend(), dynamic=False)

    def dynamo_backend(self) -> str | Callable:
        """How openxla compiles dynamo's graphs: each through torch_xla's bridge; on a mesh the
        backward graphs traced lazily into the step instead (`spmd_openxla`)."""
        return "openxla" if self.mesh is None else spmd_openxla()


BACKEND_CLASSES: dict[str, type[Backend]] = {c.name: c for c in (Backend, InductorBackend, XlaBackend, OpenXlaBackend)}
"""Each backend by its name (`train.backend`, `--backend`); the config lists the same names."""


def backend_class(name: str) -> type[Backend]:
    """The backend class of `name` (its `xla`, `compiles`, `configure`, without making one)."""
    if name not in BACKEND_CLASSES:
        raise UsageError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}")
    return BACKEND_CLASSES[name]


def configure_process(backend_name: str, spmd: bool = False) -> None:
    """Make the process-wide settings a run on `backend_name` needs (over an SPMD mesh with
    `spmd`): before anything is traced, since some count only before the XLA runtime starts or
    the first graph is traced. `make_backend` and `enable_spmd` call it (the first things
    every entry point does with a device), and tests/conftest.py once for the whole suite, so no
    test depends on which test made them first. Idempotent, and it only adds settings: a process
    once switched to SPMD stays so. Seeds are run inputs, not settings
    (`b2t.engine.step.seeded_model`, `Backend.seed`)."""
    backend_class(backend_name).configure(spmd)


def _xla_counts() -> CompileStats:
    """The process-wide counters of `torch_xla.debug.metrics`."""
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    aliased = met.metric_data("InputOutputAliasCount")  # one sample per compiled graph
    return CompileStats(
        compilations=int(data[0]) if data else 0,
        fallbacks={n: int(met.counter_value(n)) for n in met.counter_names() if n.startswith("aten::")},
        donors=tuple(int(v) for _, v in aliased[2]) if aliased else (),
        cache=tuple(int(met.counter_value(f"PersistentCache{n}") or 0) for n in ("Hit", "Miss", "DeserializeFailure")),
    )


def enable_spmd(cfg: MeshConfig, backend_name: str) -> SpmdMesh:
    """Switch this process to SPMD for `backend_name` (`configure_process`) and make the mesh `cfg`
    over its devices. Call before any XLA work: the SPMD settings must be made before the runtime
    starts and the first XLA computation."""
    configure_process(backend_name, spmd=True)
    return spmd_mesh(cfg)


def make_backend(name: str, device: str | torch.device | None = None, mesh: SpmdMesh | None = None) -> Backend:
    """The backend `name` on `device` (default: the XLA device, else CUDA if present, else CPU).

    `mesh` (XLA only, from `enable_spmd`) makes every batch data-parallel over it.
    Makes the process-wide settings the backend needs first (`configure_process`).
    """
    cls = backend_class(name)
    cls.configure(spmd=mesh is not None)
    device = None if device is None else checked_device(str(device), cls.xla)
    if cls.xla:
        import torch_xla

        return cls(torch.device(device) if device else torch_xla.device(), mesh, _xla_counts())
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return cls(torch.device(device))


def spmd_openxla() -> Callable:
    """The openxla compiler for SPMD runs: dynamo's forward graphs compiled by torch_xla's
    bridge, their AOT backward graphs traced lazily into the step.

    torch_xla 2.9's bridge, re-running a compiled backward graph under SPMD, read a forward
    input (the day indices) from the first call's buffer (`b2t.xla_workarounds`: spmd-bridge-backward).

    Each backward first waits for the mesh: it is traced while the compiled forward may still
    be running, so the forward results it reads are sharded placeholders, and a torch_xla scan
    traced over one (the CTC kernel's: under SPMD a scan's backward closes over its inputs)
    asks it for a first shard it does not have yet; the process died with a segfault in about
    half of the 8-step openxla runs on 4 CPU devices (`b2t.xla_workarounds`:
    spmd-pending-scan-input). A single device's placeholder has a handle of its own.
    """
    import torch_xla.core.xla_model as xm
    from functorch.compile import make_boxed_func

    def backward_compiler(gm: torch.fx.GraphModule, _inputs: object) -> Callable:
        def backward(*args: torch.Tensor) -> object:
            xm.wait_device_ops()
            return gm.forward(*args)

        return make_boxed_func(backward)

    return aot_autograd(fw_compiler=openxla_eval_boxed, bw_compiler=backward_compiler)


def describe(backend: Backend, compute: str = "bf16", dtype: torch.dtype | None = None) -> str:
    """The line b2t-train prints first: which device it found, e.g.
    `device: xla:0 = TPU (TPU v5 lite), 4 devices on this host, PJRT_DEVICE=TPU; backend openxla`,
    and, for a `compute` (`train.compute_dtype`) that is not bf16 there (`dtype`, the run's Stepper's
    resolution of it, else resolved here), that it computes in f32."""
    if backend.xla:
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr

        if backend.mesh is None:
            what = f"{backend.device} = {xr.device_type()} ({xm.xla_device_kind(backend.device)})"
        else:  # the SPMD virtual device has no kind of its own
            what = f"SPMD mesh {backend.mesh.axes()} of {xr.device_type()} devices"
        what += (f", {xr.addressable_runtime_device_count()} devices on this host, "
                 f"PJRT_DEVICE={os.environ.get('PJRT_DEVICE')}")
    elif backend.device.type == "cuda":
        what = f"{backend.device} = {torch.cuda.get_device_name(backend.device)}"
    else:
        what = f"{backend.device} (the host CPU, no XLA)"
    line = f"device: {what}; backend {backend.name}"
    if (dtype or backend.compute_dtype(compute)) == torch.float32:
        why = " (this CPU has no bf16 matmuls)" if compute == "auto" else ""
        line += f"; computing in f32{why}"
    return line
