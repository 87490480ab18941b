"""Trace the trainer's own graphs for a TPU target on the XLA CPU device, running none of them.

Why here: the TPU compiler (libtpu) judges memory and compile time from the HLO module a run
would send it, and that module is what the trainer's step traces, not a model of it. So the
trace uses the run's pieces: the config's model family, `Stepper.train_step` (forward, CTC,
backward, clip, AdamW, loss totals: one lazy graph per bucket, as `--backend xla` runs it)
and `Stepper.eval_step`, at every bucket's shape, on as many virtual CPU devices as the
target has chips, batches placed over the run's mesh and weights sharded as `SpmdMesh` does.

What differs from a run, and why it does not change the graph:
- weights, gradients and AdamW moments are placeholders (XLA tensors with no buffer), so a
  687M model traces in the memory of one batch; under fsdp they carry the weight sharding as
  an annotation on the argument (`TraceBackend.shard`), which the TPU compile step moves
  onto the argument itself (`b2t.tpu.compiler`), as a sharded device tensor would carry it;
- each graph is compiled for the CPU by `_xla_warm_up_cache` (the path torch_xla's own
  dynamo bridge takes), which never executes it; XLA's dump (`--xla_dump_to`) writes the
  module it was given, before any CPU optimisation, and that module is what this returns;
- that path does not donate buffers, so the donors a one-device run's sync would pass
  (every state tensor the step overwrites; none under SPMD, where the trainer turns
  parameter aliasing off) are recorded here and re-attached before the TPU compile.

Shape legend: B rows, T bins, L label slots of a bucket.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from b2t.config import Config, MeshConfig
from b2t.contract import Batch, BucketShape, empty_batch
from b2t.model.registry import build_model
from b2t.private_api import device_data_ids, graph_data_ids, has_pending_graph, warm_up_cache
from b2t.train.backend import Backend
from b2t.train.optim import make_optimizer
from b2t.train.step import Stepper

DUMP_SUFFIX = ".before_optimizations.hlo.pb"


class CaptureError(RuntimeError):
    """The trace could not be set up as the target needs; the message says what to do."""


@dataclass(frozen=True)
class Graph:
    """One traced graph: its HloModuleProto and the parameters the trainer donates."""

    kind: str  # "train" or "eval"
    bucket: BucketShape
    rows: int  # rows of the traced batch (the bucket's B, or a fit probe's)
    hlo: bytes  # serialized xla.HloModuleProto
    donors: tuple[int, ...]  # parameter numbers whose buffers the step may reuse for its outputs
    trace_s: float  # tracing plus the XLA CPU compile that writes the dump


def prepare_process(chips: int, dump_dir: Path) -> None:
    """Point this process's XLA runtime at `chips` virtual CPU devices dumping every module to
    `dump_dir`. Must run before torch_xla starts its runtime (XLA reads its flags once)."""
    import sys

    if "torch_xla" in sys.modules:
        import torch_xla.runtime as xr

        if xr.is_spmd() or os.environ.get("CPU_NUM_DEVICES") != str(chips):
            raise CaptureError("the TPU check needs a fresh process (its CPU device count and XLA dump flags are "
                               "set before torch_xla starts): run it from b2t-train --plan --target")
    os.environ["PJRT_DEVICE"] = "CPU"
    os.environ["CPU_NUM_DEVICES"] = str(chips)
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # libtpu: no cloud metadata server to ask
    # The CPU executables are never run: the least CPU optimisation makes the dump soonest.
    flags = (f"--xla_dump_to={dump_dir} --xla_dump_hlo_as_proto --xla_dump_hlo_module_re=SyncTensorsGraph "
             "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false")
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()


@dataclass(frozen=True)
class TraceBackend(Backend):
    """`--backend xla` whose new state is placeholders and whose sync runs nothing (`trace`
    compiles what the sync would have run; see the module docstring)."""

    outputs: list = field(default_factory=list)  # what an eval step handed back for the host to read

    def zeros(self, like: torch.Tensor) -> torch.Tensor:
        return placeholder(like.shape, like.dtype)

    def shard(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        """fsdp: each weight, gradient and moment annotated with `SpmdMesh.weight_spec` (a
        placeholder has no data to split, so the annotation is a graph node on it)."""
        if self.mesh is None or self.mesh.fsdp == 1:
            return
        import torch_xla.distributed.spmd as xs

        for t, spec in self.mesh.weight_state(model, optimizer):
            if any(spec):
                xs.annotate_custom_sharding(t, self.mesh.mesh, spec)
        self.mesh.split_activations(model)

    def gathered(self, outputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        outputs = super().gathered(outputs)
        self.outputs.extend(outputs)
        return outputs

    def sync(self) -> None:
        pass


def placeholder(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """An XLA tensor of `shape` with no buffer behind it: a graph input that costs no memory."""
    from torch_xla.core.xla_builder import create_placeholder_tensor

    return create_placeholder_tensor(tuple(shape), dtype)


def placeholder_model(cfg: Config, n_days: int, device: torch.device) -> nn.Module:
    """`cfg`'s model with every parameter and buffer a placeholder on `device` (no memory)."""
    model = build_model(cfg.model, n_days, device=torch.device("meta"))
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = nn.Parameter(placeholder(p.shape, p.dtype), requires_grad=p.requires_grad)
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = placeholder(b.shape, b.dtype)
    return model


def trace(cfg: Config, n_days: int, backend: TraceBackend, kind: str, shape: BucketShape,
          dump_dir: Path) -> Graph:
    """Trace one `kind` graph ("train": a steady optimizer step; "eval") of a `shape` batch from fresh
    placeholder state, compile it for the CPU without running it, and read back the dumped module."""
    model = placeholder_model(cfg, n_days, backend.device)
    optimizer = make_optimizer(model, cfg.optim) if kind == "train" else None
    stepper = Stepper(model, optimizer, backend, cfg)
    state = [*model.parameters(), *(p.grad for p in model.parameters() if p.grad is not None),
             *(t for s in (optimizer.state.values() if optimizer else ()) for t in s.values()
               if isinstance(t, torch.Tensor))]
    ids_before = device_data_ids(state)  # an in-place update gives a tensor a new id; its input keeps this one
    before = set(dump_dir.glob(f"*{DUMP_SUFFIX}"))
    t0 = time.perf_counter()
    batch = Batch(0, empty_batch(shape), {})
    backend.outputs.clear()
    if kind == "train":
        stepper.train_step([batch] * cfg.train.grad_accum, 2)  # step 2: a steady step (schedules past 0)
    else:
        stepper.eval_step(batch)
    updated = [has_pending_graph(t) for t in state]  # what the step overwrites (nothing in evaluation)
    if kind == "train":
        roots = [t for t, u in zip(state, updated) if u] + [t for t in stepper.loss_totals() if has_pending_graph(t)]
    else:
        roots = backend.outputs[:]
    warm_up_cache(roots)  # what the sync would have compiled (and then run)
    seconds = time.perf_counter() - t0
    written = sorted(set(dump_dir.glob(f"*{DUMP_SUFFIX}")) - before)
    if len(written) != 1:
        raise CaptureError(f"expected one dumped module for the {kind} graph of T={shape.T} B={shape.B}, found "
                           f"{len(written)} in {dump_dir}")
    donate = backend.mesh is None and os.environ.get("XLA_ENABLE_PARAM_ALIASING", "1") != "0"
    overwritten = {i for i, u in zip(ids_before, updated) if u}
    donors = tuple(n for n, d in enumerate(graph_data_ids(roots)) if d in overwritten) if donate else ()
    return Graph(kind, shape, shape.B, hlo_module(written[0].read_bytes()), donors, seconds)


def hlo_module(dump: bytes) -> bytes:
    """The HloModuleProto inside a dumped `xla.HloProto` (its field 1), read with protobuf's
    own wire parser through a one-field message, since no XLA proto classes ship with jax."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    file = descriptor_pb2.FileDescriptorProto(name="b2t_hlo_proto.proto", package="b2t")
    message = file.message_type.add(name="HloProto")
    message.field.add(name="hlo_module", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
                      label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    proto = message_factory.GetMessageClass(pool.FindMessageTypeByName("b2t.HloProto"))()
    proto.ParseFromString(dump)
    return proto.hlo_module


def trace_backend(mesh_cfg: MeshConfig | None) -> TraceBackend:
    """The trace's backend on the XLA CPU device, SPMD over `mesh_cfg` when it spans more than one device."""
    from b2t.train.backend import make_backend
    from b2t.train.mesh import enable_spmd

    mesh = enable_spmd(mesh_cfg, "xla") if mesh_cfg is not None and mesh_cfg.data * mesh_cfg.fsdp > 1 else None
    base = make_backend("xla", mesh=mesh)
    return TraceBackend(base.name, base.device, base.mesh, base.baseline)

