"""Trace the trainer's own graphs for a TPU target on the XLA CPU device, running none of them.

Why here: the TPU compiler (libtpu) judges memory and compile time from the HLO modules a run
would send it, and those are what the trainer's step traces, not a model of it. So the trace
uses the run's pieces: the config's model family, `Stepper.train_step` and `Stepper.eval_step`
at every bucket's shape, on as many virtual CPU devices as the target has chips, batches
placed over the run's mesh and weights sharded as `SpmdMesh` does, under the run's backend:
- `xla`: the whole step (forward, CTC, backward, clip, AdamW, loss totals) is one lazy graph;
- `openxla`: dynamo's forward graph and (off a mesh) its backward graph are each one module,
  cut where torch_xla's bridge would compile and run it (`TraceBackend.dynamo_backend`), and
  what stays lazy (the update; on a mesh the backward too) is one more. The modules hand each
  other placeholders, so each is compiled on its own, as the bridge compiles them.

What differs from a run, and why it does not change the graph:
- weights and AdamW moments are placeholders (XLA tensors with no buffer), so a
  687M model traces in the memory of one batch; under fsdp they carry the weight sharding as
  an annotation on the argument (`TraceBackend.shard`), which the TPU compile step moves
  onto the argument itself (`b2t.plan.compiler`), as a sharded device tensor would carry it;
- each graph is compiled for the CPU by `_xla_warm_up_cache` (the path torch_xla's own
  dynamo bridge takes), which never executes it; XLA's dump (`--xla_dump_to`) writes the
  module it was given, before any CPU optimisation, and that module is what this returns;
- that path does not donate buffers, so the donors a run's step passes (its training state,
  `Stepper.training_state`, which every step donates: `Backend.donate`) are recorded here and
  re-attached before the TPU compile.

Shape legend: B rows, T bins, L label slots of a bucket.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from b2t.config import Config, MeshConfig
from b2t.contract import Batch, BucketShape, empty_batch
from b2t.engine.backend import OpenXlaBackend, XlaBackend
from b2t.engine.step import Stepper, make_stepper
from b2t.errors import B2tError
from b2t.model.registry import build_model
from b2t.private_api import data_handles, graph_data_handles, has_pending_graph, is_placeholder, warm_up_cache

DUMP_SUFFIX = ".before_optimizations.hlo.pb"


class CaptureError(B2tError):
    """The trace could not be set up as the target needs; the message says what to do."""


@dataclass(frozen=True)
class Graph:
    """One traced module of a step: its HloModuleProto, the parameters the trainer donates, the
    parameters that are outputs of the step's earlier modules, and the training state beside it."""

    kind: str  # "train" or "eval"
    bucket: BucketShape
    rows: int  # rows of the traced batch (the bucket's B, or a fit probe's)
    hlo: bytes  # serialized xla.HloModuleProto
    donors: tuple[int, ...]  # parameter numbers whose buffers the step may reuse for its outputs
    trace_s: float  # tracing plus the XLA CPU compile that writes the dump
    part: str = "step"  # the whole step (xla), or openxla's "forward", "backward", "update", "backward+update"
    inputs_from: tuple[tuple[int, int, int], ...] = ()  # (parameter, earlier module, its output) per handed-on tensor
    resident: int = 0  # bytes per chip of training state alive during this module but not its argument


def prepare_process(chips: int, dump_dir: Path) -> None:
    """Point this process's XLA runtime at `chips` virtual CPU devices dumping every module to
    `dump_dir`. Must run before torch_xla starts its runtime (XLA reads its flags once)."""
    import sys

    if "torch_xla" in sys.modules:
        import torch_xla.runtime as xr

        if xr.is_spmd() or os.environ.get("CPU_NUM_DEVICES") != str(chips):
            raise CaptureError("the TPU check needs a fresh process (its CPU device count and XLA dump flags are "
                               "set before torch_xla starts): run it from b2t-plan --target")
    os.environ["PJRT_DEVICE"] = "CPU"
    os.environ["CPU_NUM_DEVICES"] = str(chips)
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # libtpu: no cloud metadata server to ask
    # The CPU executables are never run: the least CPU optimisation makes the dump soonest.
    flags = (f"--xla_dump_to={dump_dir} --xla_dump_hlo_as_proto --xla_dump_hlo_module_re=SyncTensorsGraph "
             "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false")
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()


@dataclass(frozen=True)
class Cut:
    """One module of a step, traced lazily and compiled for the CPU: its outputs, the placeholders
    the trace handed on in their place (an openxla dynamo graph's: what the bridge's run would
    return), its graph hash, and whether this compile dumped it (False: the compilation cache
    held it from an earlier step, as a run's cache would)."""

    roots: list[torch.Tensor]
    placeholders: list[torch.Tensor]
    key: str
    dumped: bool


# Graph hash -> the module as dumped (a serialized HloModuleProto), for this process: torch_xla's
# compilation cache is per process, and a module it already holds (an openxla update, the same
# in every bucket) is not compiled, so not dumped, again.
_MODULES: dict[str, bytes] = {}


@dataclass(frozen=True)
class TraceBackend(XlaBackend):
    """The run's lazy XLA backend (with `dynamo`, openxla's) whose new state is placeholders and
    whose sync runs nothing (`trace` compiles what the sync would have run; see the module docstring)."""

    dynamo: bool = False  # openxla: the step's dynamo graphs cut out (`dynamo_backend`)
    outputs: list = field(default_factory=list)  # what an eval step handed back for the host to read
    cuts: list = field(default_factory=list)  # openxla: the dynamo graphs traced so far, as `Cut`s

    @property
    def name(self) -> str:  # type: ignore[override]
        return OpenXlaBackend.name if self.dynamo else XlaBackend.name

    def compile(self, fn):
        return torch.compile(fn, backend=self.dynamo_backend(), dynamic=False) if self.dynamo else fn

    def dynamo_backend(self):
        """openxla: the run's split into dynamo graphs (AOTAutograd's forward and backward, as the
        `openxla` backend makes them), each traced lazily and cut (`_cut`); on a mesh the backward
        stays lazy, as `backend.spmd_openxla` runs it."""
        from functorch.compile import make_boxed_func

        from b2t.private_api import aot_autograd

        def cut(gm: torch.fx.GraphModule, _example_inputs: list) -> object:
            return make_boxed_func(lambda *args: self._cut(gm(*args), args))

        lazy = lambda gm, _: make_boxed_func(gm.forward)  # noqa: E731
        return aot_autograd(fw_compiler=cut, bw_compiler=cut if self.mesh is None else lazy)

    def _cut(self, outputs, inputs: tuple):
        """One dynamo graph's lazy `outputs` compiled as one module (dumped, not run) and replaced by
        placeholders, so later graphs start from device data as they would after the bridge's run.
        An output that is one of the graph's `inputs` (a weight saved for the backward) is handed on
        as it is: the bridge returns those without computing them."""
        flat = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
        seen = {id(t) for t in inputs if isinstance(t, torch.Tensor)}
        roots = []
        for t in flat:
            if isinstance(t, torch.Tensor) and has_pending_graph(t) and id(t) not in seen:
                seen.add(id(t))
                roots.append(t)
        handed = {id(t): placeholder(t.shape, t.dtype) for t in roots}
        self.cuts.append(Cut(roots, list(handed.values()), *warm_up_cache(roots)))
        out = [handed.get(id(t), t) for t in flat]
        return type(outputs)(out) if isinstance(outputs, (tuple, list)) else out[0]

    def zeros(self, like: torch.Tensor) -> torch.Tensor:
        return placeholder(like.shape, like.dtype)

    def donate(self, tensors) -> int:
        """Nothing: placeholders have no buffer to offer; `trace` names the donors instead."""
        return 0

    def replicated(self, t: torch.Tensor) -> torch.Tensor:
        """As a run's, but a placeholder (an openxla graph's output here) is annotated by a graph
        node: it has no data to lay out."""
        if self.mesh is None or has_pending_graph(t) or t.device.type != "xla" or not is_placeholder(t):
            return super().replicated(t)
        import torch_xla.distributed.spmd as xs

        return xs.annotate_custom_sharding(t, self.mesh.mesh, (None,) * t.dim()).global_tensor

    def shard(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        """fsdp: each weight and moment annotated with `SpmdMesh.weight_spec` (a
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
          dump_dir: Path) -> list[Graph]:
    """Trace the modules of one `kind` step ("train": a steady optimizer step; "eval") of a `shape`
    batch from fresh placeholder state, compile each for the CPU without running it, and read back
    the dumped modules, in the order the step runs them."""
    stepper = make_stepper(cfg, n_days, backend, optimizer=kind == "train",
                           model=placeholder_model(cfg, n_days, backend.device))
    model, optimizer = stepper.model, stepper.optimizer
    state = stepper.training_state() if optimizer is not None else []
    ids_before = data_handles(state)  # an in-place update gives a tensor new data; its input keeps this one
    share = _state_bytes(model, optimizer, backend, stepper)
    before = set(dump_dir.glob(f"*{DUMP_SUFFIX}"))
    t0 = time.perf_counter()
    batch = Batch(0, empty_batch(shape), {})
    backend.outputs.clear()
    backend.cuts.clear()
    if kind == "train":
        stepper.train_step([batch] * cfg.train.grad_accum, 2)  # step 2: a steady step (schedules past 0)
        roots = [t for t in state if has_pending_graph(t)] + [t for t in stepper.loss_totals() if has_pending_graph(t)]
    else:
        stepper.eval_step(batch)
        roots = [t for t in backend.outputs if has_pending_graph(t)]
    cuts = list(backend.cuts)
    if roots:  # what the sync would have compiled (and then run)
        cuts.append(Cut(roots, [], *warm_up_cache(roots)))
    seconds = time.perf_counter() - t0
    written = sorted(set(dump_dir.glob(f"*{DUMP_SUFFIX}")) - before)
    if len(written) != sum(c.dumped for c in cuts):
        raise CaptureError(f"expected {sum(c.dumped for c in cuts)} dumped modules for the {kind} step of T={shape.T} "
                           f"B={shape.B}, found {len(written)} in {dump_dir}")
    fresh = iter(written)
    for c in cuts:
        if c.dumped:
            _MODULES[c.key] = hlo_module(next(fresh).read_bytes())
        elif c.key not in _MODULES:
            raise CaptureError(f"the {kind} step of T={shape.T} B={shape.B} reused a module this process never dumped")
    donate = os.environ.get("XLA_ENABLE_PARAM_ALIASING", "1") != "0"  # as torch_xla reads it
    donated = set(ids_before)  # the training state, every buffer of which the step donates
    handed = {d: (m, i) for m, c in enumerate(backend.cuts) for i, d in enumerate(data_handles(c.placeholders))}
    parts = _part_names(kind, len(backend.cuts), backend.mesh is not None, bool(roots))
    graphs = []
    for m, c in enumerate(cuts):
        inputs = graph_data_handles(c.roots)
        donors = tuple(n for n, d in enumerate(inputs) if d in donated) if donate and m == len(cuts) - 1 else ()
        from_earlier = tuple((n, *handed[d]) for n, d in enumerate(inputs) if d in handed)
        resident = sum(b for d, b in share.items() if d not in set(inputs))
        graphs.append(Graph(kind, shape, shape.B, _MODULES[c.key], donors, seconds / len(cuts),
                            parts[m], from_earlier, resident))
    return graphs


def _part_names(kind: str, cuts: int, spmd: bool, lazy: bool) -> list[str]:
    """What each module of a step is, in order (see the module docstring): with `train.grad_accum`
    k, k forward cuts (on a mesh) or k forward-backward pairs, then the lazy rest."""
    if kind == "eval":
        return ["eval"] * (cuts + lazy) if cuts else ["step"]
    if not cuts:
        return ["step"]
    if spmd:
        return ["forward"] * cuts + ["backward+update"] * lazy
    return ["forward", "backward"] * (cuts // 2) + ["forward"] * (cuts % 2) + ["update"] * lazy


def _state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None, backend: TraceBackend,
                 stepper: Stepper) -> dict[int, int]:
    """Data handle -> bytes per chip of every tensor a training run keeps on the device across its
    graphs: weights, AdamW's moments and step counts (gradients live within a train step). In
    evaluation (no optimizer here) the run's moments still live beside the eval graph: counted
    under a negative key."""
    from b2t.engine.mesh import FSDP_AXIS

    def per_chip(t: torch.Tensor, spec: tuple) -> int:
        split = backend.mesh.fsdp if backend.mesh is not None and FSDP_AXIS in spec else 1
        return t.numel() * t.element_size() // split

    specs = {id(p): (backend.mesh.weight_spec(p) if backend.mesh is not None else ()) for p in model.parameters()}
    if optimizer is not None:
        owner = {}
        for p in model.parameters():
            for t in (p, *optimizer.state.get(p, {}).values()):
                if isinstance(t, torch.Tensor):
                    owner[id(t)] = (t, specs[id(p)] if t.shape == p.shape else ())
        tensors = stepper.training_state()
        return {d: per_chip(*owner[id(t)]) for t, d in zip(tensors, data_handles(tensors))}
    weights = list(model.parameters())
    share = dict(zip(data_handles(weights), (per_chip(p, specs[id(p)]) for p in weights)))
    extra = sum(2 * per_chip(p, specs[id(p)]) + 4 for p in weights if p.requires_grad)  # 2 moments, step count
    return {**share, -1: extra}


def hlo_module(dump: bytes) -> bytes:
    """The HloModuleProto inside a dumped `xla.HloProto` (its field 1)."""
    proto = _xla_messages()["HloProto"]()
    proto.ParseFromString(dump)
    return proto.hlo_module


def without_metadata(module: bytes) -> bytes:
    """A serialized HloModuleProto with each instruction's OpMetadata (field 7) cleared: the ops
    lowered through jax name their source files there, so the same graph read differently from
    another install path. The compiler does not read it; everything else is kept as it was."""
    proto = _xla_messages()["HloModule"]()
    proto.ParseFromString(module)
    for computation in proto.computations:
        for instruction in computation.instructions:
            instruction.ClearField("metadata")
    return proto.SerializeToString(deterministic=True)


@functools.cache
def _xla_messages() -> dict[str, type]:
    """The few fields of XLA's protos b2t reads, by their numbers in xla/service/hlo.proto, for
    protobuf's own wire parser (no XLA proto classes ship with jax); the others stay unknown
    fields, kept as they were when a message is written again."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    layout = {"HloProto": [("hlo_module", 1, None, False)],
              "HloModule": [("computations", 3, "HloComputation", True)],
              "HloComputation": [("instructions", 2, "HloInstruction", True)],
              "HloInstruction": [("metadata", 7, None, False)]}
    file = descriptor_pb2.FileDescriptorProto(name="b2t_hlo_proto.proto", package="b2t")
    for name, fields in layout.items():
        message = file.message_type.add(name=name)
        for fname, number, kind, repeated in fields:
            message.field.add(name=fname, number=number, type=field.TYPE_MESSAGE if kind else field.TYPE_BYTES,
                              type_name=f".b2t.{kind}" if kind else None,
                              label=field.LABEL_REPEATED if repeated else field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"b2t.{name}")) for name in layout}


def trace_backend(mesh_cfg: MeshConfig | None, name: str = "xla") -> TraceBackend:
    """The trace's `name` backend (xla or openxla) on the XLA CPU device, SPMD over `mesh_cfg` when it
    spans more than one device."""
    from b2t.engine.backend import backend_class, enable_spmd, make_backend

    if not backend_class(name).xla:
        raise CaptureError(f"the TPU check traces the xla or openxla backend, not {name!r}")
    mesh = enable_spmd(mesh_cfg, name) if mesh_cfg is not None and mesh_cfg.data * mesh_cfg.fsdp > 1 else None
    base = make_backend(name, mesh=mesh)
    return TraceBackend(base.device, base.mesh, base.baseline, dynamo=isinstance(base, OpenXlaBackend))

