"""The one place b2t touches private torch and torch_xla APIs (tests/test_private_api.py
fails loudly when an upgrade moves any of them).

`autograd_inside_op`: the XLA kernel of b2t's CTC custom op (`ctc_op`) runs torch_xla's `scan`,
which builds its own backward with AOTAutograd while it traces, so it needs autograd.
A custom op's kernel runs with the autograd dispatch keys excluded (the op is one opaque
node to autograd), and a plain `scan` there fails ("element 0 of tensors does not
require grad"). `autograd_inside_op` re-includes exactly those keys for the kernel's
duration. It removes ONLY the autograd keys from the exclusion set and keeps the rest:
the exclusion set is also how autocast is switched off, and replacing it wholesale would
turn XLA autocast on inside the kernel (an f32 scan then silently computes in bf16).

Functionalization stays off inside the kernel too, so a kernel must not write through
views (a slice assignment there updates a copy). Private names (torch 2.9):
`torch._C._ForceDispatchKeyGuard`, `torch._C._dispatch_tls_local_{include,exclude}_set`,
`torch._C.DispatchKey.{AutogradFunctionality, ADInplaceOrView}`.

`scalars_as_device_data`: torch_xla traces a 0-dim tensor holding 0 or 1, even one copied
from the host, as a constant of the graph ("special scalars"). AdamW's step counters
start at 0 and the loss gradient seed is 1, so the first step, a snapshot restore, or a
fresh counter each traced graphs no later step reuses. With the handling off they are
device data like any other value. Private name (torch_xla 2.9):
`torch_xla._XLAC._set_xla_handle_special_scalars` (the XLA_NO_SPECIAL_SCALARS variable
does the same but is read only once, at start-up).

The rest are thin wrappers, each named after what b2t uses it for:
`sharding_spec`, `local_shards`, `local_shard_indices` (`torch_xla._XLAC._get_xla_sharding_spec`,
`_get_local_shards`, `_get_local_shard_replica_and_indices`: a sharded tensor read back shard
by shard, b2t.engine.mesh); `aot_autograd`, `openxla_eval_boxed` (`torch._dynamo.backends.common`,
`torch._dynamo.backends.torchxla`: the SPMD openxla compiler, b2t.engine.backend);
`raise_recompile_limit` (`torch._dynamo.config.recompile_limit`); `gru_layer` (`torch._VF.gru`,
the kernel `nn.GRU` calls, b2t.model.recurrence); `scan_no_grad`
(`torch_xla.experimental.scan._scan_impl_pytree`: scan's loop without its autograd, whose
saved activations would hold every step's copy of loop-invariant weights, b2t.model.recurrence);
`cpu_has_bf16_matmuls` (`torch.ops.mkldnn._is_mkldnn_bf16_supported`: whether oneDNN runs bf16
on this CPU's vector units, b2t.engine.backend); `donate_buffer`, `buffer_donated`
(`torch_xla._XLAC._set_buffer_donation`, `_get_buffer_donation`: a tensor's current buffer offered
to the next graph that reads it, b2t.engine.backend.Backend.donate); `sharding_constraint`
(`torch.ops.xla.aot_mark_sharding`, the traceable op behind torch_xla's `mark_sharding_with_gradients`,
given the mesh and spec as text so dynamo traces it, b2t.engine.mesh); `is_placeholder`
(`torch_xla._XLAC._is_placecholder`, sic: device data with no buffer, b2t.plan.capture);
`warm_up_cache` (`torch_xla._XLAC._xla_warm_up_cache`, `_get_graph_hash`,
`_xla_get_num_cached_compilation_graph`: a graph compiled unrun, and whether the cache held it,
b2t.plan.capture);
`push_xla_scope` (`torch_xla._XLAC.profiler.scope_pusher`: op-name scopes in the HLO metadata,
tools/hlo_parts).

`bridge_compiles_handed_off`: torch_xla's dynamo bridge compiles each graph at its first call
(`_xla_warm_up_cache` of the tensors it traced, in the calling thread) and runs it at once
(`_run_cached_graph`). Inside this context each of those compiles is handed to a job, and each
run returns stand-ins of the graph's outputs, so a warm-up traces every bucket's graphs while
earlier ones compile (b2t.engine.concurrent_compiles). The bridge goes on only once the job has
read its graph: right after the job returns, the bridge clears every pending graph of the
device (`_clear_pending_irs`), which would cut a graph not yet read short. The job has read it
when it looks the graph up in the compilation cache (torch_xla's `UncachedCompile` or
`CachedCompile` counter moves). Private names (torch_xla 2.9): `torch_xla._XLAC._xla_warm_up_cache`,
`_run_cached_graph`, `_get_graph_hash`, `_check_tensor_need_materialization`,
`_get_xla_enable_device_data_cache`, `_set_xla_enable_device_data_cache`, and
`drop_pending_graphs`' `_clear_pending_irs`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import torch

_AUTOGRAD_KEYS = (torch._C.DispatchKey.AutogradFunctionality, torch._C.DispatchKey.ADInplaceOrView)
"""Removing the functionality key removes every per-backend Autograd* key with it."""


def autograd_excluded() -> bool:
    """True where autograd is switched off by the dispatcher (inside a custom op's kernel)."""
    return torch._C._dispatch_tls_local_exclude_set().has(torch._C.DispatchKey.AutogradFunctionality)


@contextlib.contextmanager
def autograd_inside_op() -> Iterator[None]:
    """Autograd dispatch keys re-included and grad mode on, every other TLS key unchanged."""
    include = torch._C._dispatch_tls_local_include_set()
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in _AUTOGRAD_KEYS:
        exclude = exclude.remove(key)
    with torch._C._ForceDispatchKeyGuard(include, exclude), torch.enable_grad():
        yield


def scalars_as_device_data() -> None:
    """Process-wide: 0-dim 0 and 1 values on XLA stay device data (see the module docstring)."""
    import torch_xla

    torch_xla._XLAC._set_xla_handle_special_scalars(False)


@contextlib.contextmanager
def special_scalars_handled(handled: bool) -> Iterator[None]:
    """torch_xla's special-scalar handling set to `handled` inside, restored on exit (for the
    sentinel that shows the plain behaviour in a process where the trainer switched it off)."""
    import torch_xla

    before = torch_xla._XLAC._get_xla_handle_special_scalars()
    torch_xla._XLAC._set_xla_handle_special_scalars(handled)
    try:
        yield
    finally:
        torch_xla._XLAC._set_xla_handle_special_scalars(before)


def sharding_spec(t: torch.Tensor) -> str:
    """The XLA sharding of `t` as text, e.g. `{devices=[4,1,1]0,1,2,3}`; '' when unsharded."""
    import torch_xla

    return torch_xla._XLAC._get_xla_sharding_spec(t)


def local_shards(t: torch.Tensor) -> list[tuple[torch.Tensor, str]]:
    """A sharded XLA tensor's shards on this host as (host tensor, device name) pairs; a shard
    of a dim that does not divide is padded at its end."""
    import torch_xla

    return torch_xla._XLAC._get_local_shards([t])[0]


def local_shard_indices(t: torch.Tensor) -> list[tuple[int, list[slice]]]:
    """Where each of `local_shards(t)` sits in the whole tensor: (replica id, one slice per dim)."""
    import torch_xla

    return torch_xla._XLAC._get_local_shard_replica_and_indices([t])[0]


def aot_autograd(**kwargs: Any) -> Callable:
    """Dynamo's AOTAutograd backend maker (forward and backward graphs to their own compilers)."""
    from torch._dynamo.backends.common import aot_autograd as make

    return make(**kwargs)


def openxla_eval_boxed(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable:
    """torch_xla's dynamo bridge compiling one graph (the `openxla` backend's forward compiler)."""
    from torch._dynamo.backends.torchxla import openxla_eval_boxed as compile_graph

    return compile_graph(gm, example_inputs)


def raise_recompile_limit(at_least: int) -> None:
    """Process-wide: dynamo compiles up to `at_least` graphs per function before it falls back
    to running the function eagerly (silently)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, at_least)


def cpu_has_bf16_matmuls() -> bool:
    """Whether this CPU runs bf16 matmuls in its vector units (AVX512 or AMX); where not
    (AVX2 only), torch emulates them, far slower than f32 (docs/architecture.md)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def gru_layer(x: torch.Tensor, h0: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    """One time-major GRU layer by torch's kernel (what `nn.GRU` calls): (P, B, D), (1, B, H)
    -> (P, B, H); `params` = weight_ih, weight_hh, bias_ih, bias_hh."""
    y, _ = torch._VF.gru(x, h0, params, True, 1, 0.0, False, False, False)
    return y


def scan_no_grad(step: Callable, carry: Any, xs: Any, reverse: bool = False) -> tuple[Any, Any]:
    """torch_xla's scan loop alone (one XLA while-loop; no backward traced, nothing saved):
    `step(carry, x) -> (carry, y)` over the leading dim of every tensor of the pytree `xs`,
    last to first when `reverse`; returns the final carry and the stacked ys."""
    from torch_xla.experimental.scan import _scan_impl_pytree

    return _scan_impl_pytree(step, carry, xs, reverse=reverse)


def ctc_alpha(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
              target_lengths: torch.Tensor, blank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's CTC kernel (what `F.ctc_loss` calls) on (T, B, C) log-probabilities and int64
    (B, L) targets and lengths: the per-row NLL (B,), inf for infeasible rows, and the alpha
    table (B, T, 2 * max(target_lengths) + 1) its backward reads."""
    return torch.ops.aten._ctc_loss.Tensor(log_probs, targets, input_lengths, target_lengths, blank, True)


def ctc_alpha_backward(grad: torch.Tensor, log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
                       target_lengths: torch.Tensor, nll: torch.Tensor, alpha: torch.Tensor, blank: int) -> torch.Tensor:
    """d <grad, nll> / d log_probs (T, B, C) from `ctc_alpha`'s outputs (zero for infeasible rows)."""
    return torch.ops.aten._ctc_loss_backward.Tensor(grad, log_probs, targets, input_lengths, target_lengths, nll, alpha,
                                                    blank, True)


def graph_breaks() -> int:
    """Graph breaks dynamo has made in this process (every reason together)."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def push_xla_scope(name: str) -> object:
    """Open a torch_xla op-name scope: ops traced until the returned object is deleted carry
    `name/` in their HLO `op_name` metadata (with XLA_HLO_DEBUG=1; tools/hlo_parts tags the
    step's parts so). Scopes nest; each thread has its own."""
    import torch_xla

    return torch_xla._XLAC.profiler.scope_pusher(name)


def warm_up_cache(roots: list[torch.Tensor]) -> tuple[str, bool]:
    """Compile the graph that computes `roots` as a sync would, without running it. Returns the
    graph's hash and whether it was compiled now: False when torch_xla's compilation cache
    already held it (an openxla update module is the same graph in every bucket), so XLA
    compiled, and dumped, nothing."""
    import torch_xla

    cached = torch_xla._XLAC._xla_get_num_cached_compilation_graph()
    key = torch_xla._XLAC._get_graph_hash(roots)
    torch_xla._XLAC._xla_warm_up_cache(roots, [])
    return key, torch_xla._XLAC._xla_get_num_cached_compilation_graph() > cached


def donate_buffer(t: torch.Tensor) -> bool:
    """Offer `t`'s current device buffer to the next graph a sync compiles: its outputs may be
    written into it (XLA's buffer donor), and `t` must not be read through that buffer again. At a
    step barrier torch_xla adds these to the donors it finds itself. False (and nothing offered)
    where `t` holds no device buffer (a pending result, or data still on the host)."""
    import torch_xla

    return bool(torch_xla._XLAC._set_buffer_donation(t, True))


def buffer_donated(t: torch.Tensor) -> bool:
    """Whether `t`'s current device buffer is offered by `donate_buffer`."""
    import torch_xla

    return bool(torch_xla._XLAC._get_buffer_donation(t))


class _ShardingConstraint(torch.autograd.Function):
    """Annotate a tensor and its gradient with one sharding (text arguments: graph constants)."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, mesh: str, spec: str) -> torch.Tensor:
        ctx.mesh, ctx.spec = mesh, spec
        return torch.ops.xla.aot_mark_sharding(t, mesh, spec)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return torch.ops.xla.aot_mark_sharding(grad, ctx.mesh, ctx.spec), None, None


def sharding_constraint(t: torch.Tensor, mesh: str, spec: str) -> torch.Tensor:
    """`t` (a copy) annotated with the sharding `spec` over `mesh` (both as `str()` of torch_xla's
    Mesh and partition-spec tuple), and its gradient with the same one; traceable by dynamo.

    torch_xla's `mark_sharding_with_gradients` takes the Mesh object and formats it inside its
    autograd function, where dynamo breaks the graph: the annotation then ran outside the compiled
    graph on the device data it returned, and failed ("Existing annotation must be cleared first").
    The op copies its input before annotating, so a pending tensor is what carries the annotation."""
    return _ShardingConstraint.apply(t, mesh, spec)


def data_handles(tensors: list[torch.Tensor]) -> list[int]:
    """torch_xla's handle of each tensor's device data (placeholders too): what a graph's input
    node keeps after the tensor is updated in place. Not the tensor's id: on a mesh a graph's
    input node may hold the data under no tensor id at all (-1), the handle it always has. A
    pending tensor that only annotates one tensor's data (a sharding) gives that data's handle.
    Computations still running are waited for first: until its buffer arrives, the data of an
    asynchronous result is named by another handle than afterwards."""
    import torch_xla
    import torch_xla.core.xla_model as xm

    xm.wait_device_ops()
    handles = []
    for t in tensors:
        if has_pending_graph(t):  # an annotated placeholder (fsdp's sharding on the trace): the data under it
            _, data = torch_xla._XLAC._get_tensors_xla_device_data_node([t])
            if len(data) != 1:
                raise ValueError(f"a pending tensor of {len(data)} inputs has no one data handle")
            t = data[0]
        handles.append(torch_xla._XLAC._get_tensors_handle([t])[0])
    return handles


def graph_data_handles(roots: list[torch.Tensor]) -> list[int]:
    """The data handles of the inputs of the graph computing `roots`, in its parameter order."""
    import torch_xla

    _, data = torch_xla._XLAC._get_tensors_xla_device_data_node(roots)
    return data_handles(data)


def is_placeholder(t: torch.Tensor) -> bool:
    """True when `t` is device data with no buffer behind it (`create_placeholder_tensor`)."""
    import torch_xla

    return bool(torch_xla._XLAC._is_placecholder(t))


def has_pending_graph(t: torch.Tensor) -> bool:
    """True when `t` is the result of ops not yet computed (a sync would compute it)."""
    import torch_xla

    info = torch_xla._XLAC._get_xla_tensor_debug_info(t)
    ir = next((line for line in info.splitlines() if line.startswith("IR:")), "IR: None")
    return ir != "IR: None" and "xla::device_data" not in ir


def _cache_lookups() -> int:
    """How many graphs torch_xla has looked up in its compilation cache so far (hit or miss)."""
    return sum(_counter(name) for name in ("UncachedCompile", "CachedCompile"))


@contextlib.contextmanager
def bridge_compiles_handed_off(start: Callable[[Callable[[], None]], Future], *,
                               real_outputs: bool) -> Iterator[list[tuple[Future, bool]]]:
    """Inside, every graph torch_xla's dynamo bridge would compile is handed to `start` as a job
    (the bridge's own compile of it, `_xla_warm_up_cache`), and every run of such a graph returns
    stand-ins of its outputs instead of running it (see the module docstring). Yields the list
    of (the job's future, whether the job compiled: False where the cache held the graph) that
    each hand-off appends to.

    The stand-ins: zero-filled device buffers with `real_outputs` (a graph traced over them
    reads data), else placeholders. A graph that reads a placeholder, compiling in one thread,
    holds up every device-wide sync (`torch_xla.sync()`, which the bridge makes before each
    trace) until its compile ends (`b2t.xla_workarounds`: placeholder-compile-blocks-sync)."""
    import torch_xla
    from torch_xla.core.xla_builder import create_placeholder_tensor

    xlac = torch_xla._XLAC
    compile_unrun, run_compiled = xlac._xla_warm_up_cache, xlac._run_cached_graph
    outputs: dict[bytes, list[tuple[tuple[int, ...], torch.dtype]]] = {}
    handed: list[tuple[Future, bool]] = []

    def hand_off(tensors: list[torch.Tensor], devices: list[str]) -> None:
        key = xlac._get_graph_hash(tensors)
        computed = xlac._check_tensor_need_materialization(tensors)  # the graph's outputs, in its order
        outputs[key] = [(tuple(t.shape), t.dtype) for t, out in zip(tensors, computed) if out]
        uncached, before = _counter("UncachedCompile"), _cache_lookups()
        job = start(lambda: compile_unrun(tensors, devices))
        while _cache_lookups() == before and not job.done():
            time.sleep(0.001)
        handed.append((job, _counter("UncachedCompile") > uncached))

    def stand_ins(key: bytes, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        if key not in outputs:
            return run_compiled(key, inputs)
        device = inputs[0].device if inputs else torch_xla.device()
        if real_outputs:
            cached = xlac._get_xla_enable_device_data_cache()
            xlac._set_xla_enable_device_data_cache(False)  # else equal small stand-ins share one buffer
            try:
                return [torch.zeros(shape, dtype=dtype).to(device) for shape, dtype in outputs[key]]
            finally:
                xlac._set_xla_enable_device_data_cache(cached)
        return [create_placeholder_tensor(shape, dtype) for shape, dtype in outputs[key]]

    xlac._xla_warm_up_cache, xlac._run_cached_graph = hand_off, stand_ins
    try:
        yield handed
    finally:
        xlac._xla_warm_up_cache, xlac._run_cached_graph = compile_unrun, run_compiled


def _counter(name: str) -> int:
    """One of torch_xla's counters (0 before it first counts)."""
    import torch_xla.debug.metrics as met

    return int(met.counter_value(name) or 0)


def drop_pending_graphs(device: torch.device) -> None:
    """Forget every pending graph on `device`: each tensor that has one becomes a placeholder
    of its shape (what torch_xla's bridge does after each of its traces)."""
    import torch_xla

    torch_xla._XLAC._clear_pending_irs(str(device))
