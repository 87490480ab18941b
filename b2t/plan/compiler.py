"""Compile a traced module with the TPU compiler (libtpu) for a target, with no TPU present.

jax's `get_topology_desc` gives compile-only devices of a TPU slice from libtpu alone; their
client compiles an HLO module as a TPU run's would and reports per-chip memory (arguments,
outputs, aliased, temp, code) and a cost analysis, or fails with the compiler's own
out-of-memory message. Three things the module loses on its way from torch_xla to this
compiler are put back, or the answer is silently wrong:
- GSPMD: jax's default partitioner (Shardy) ignores torch_xla's GSPMD shardings, so the
  build options ask for GSPMD partitioning, with outputs keeping the shardings it propagates;
- donated buffers: re-attached as `jax.buffer_donor` on the arguments the trainer donates;
- weight shardings traced as annotations on placeholders (`b2t.plan.capture`) move onto the
  arguments they annotate, where a sharded device tensor carries them.

Needs the `tpu` extra's libtpu and the `spmd` extra's jax (both pinned to torch_xla's).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from b2t.errors import B2tError
from b2t.plan.targets import GiB, Target


class CompilerMissing(B2tError):
    """The TPU compiler cannot run here (libtpu or jax missing, or libtpu refused the target);
    the message says why and what to do."""


@dataclass(frozen=True)
class Memory:
    """Per-chip bytes of one compiled graph, as the TPU compiler assigned them."""

    arguments: int
    outputs: int
    aliased: int  # outputs written into donated argument buffers (counted once, in arguments)
    temp: int
    code: int
    resident: int = 0  # other buffers the run keeps alive beside this graph (state it does not read)

    @property
    def total(self) -> int:
        return self.arguments + self.outputs - self.aliased + self.temp + self.code + self.resident


HEADROOM = 0.05
"""Share of a chip's HBM a graph must leave free to be called `fits`: the runtime's own buffers and
the allocator's fragmentation take some, so a step at 95% of HBM is one hiccup from running out."""


@dataclass(frozen=True)
class Compiled:
    """What the TPU compiler said of one graph: memory and costs, or why it does not fit."""

    seconds: float
    memory: Memory | None  # None when the compiler refused the graph
    flops: float = 0.0  # per chip, from the executable's cost analysis
    bytes_accessed: float = 0.0
    refusal: str = ""  # the compiler's out-of-memory summary (or other error; memory None), or `over_hbm`'s
    tight: str = ""  # within HBM but with less than HEADROOM of it spare (`short_of_headroom`)
    output_shardings: tuple[str, ...] = ()  # each output's sharding as the compiler laid it out (HLO text)

    @property
    def fits(self) -> bool:
        """Compiled, and leaves at least HEADROOM of the chip's HBM free."""
        return self.memory is not None and not self.refusal and not self.tight

    @property
    def verdict(self) -> str:
        """`fits`, the tight verdict or the refusal: one line."""
        return "fits" if self.fits else self.refusal or self.tight


_TOPOLOGY_LOCK = threading.Lock()  # graphs compile side by side (b2t.plan.side_by_side): one libtpu init


def topology(target: Target):
    """libtpu's compile-only devices of `target`, described once per process (thread-safe)."""
    with _TOPOLOGY_LOCK:
        return _topology(target)


@functools.cache
def _topology(target: Target):
    """libtpu's compile-only devices of `target` (no TPU, no network)."""
    import importlib.util

    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # no cloud metadata server to ask
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # several checks at once: no lock on /tmp/libtpu_lockfile
    if importlib.util.find_spec("libtpu") is None or importlib.util.find_spec("jax") is None:
        raise CompilerMissing("the TPU check needs the TPU compiler (libtpu) and jax: pip install -e '.[tpu-compile]' "
                              "(make install does)")
    from jax.experimental import topologies

    try:
        with _start_up_noise_caught():
            return topologies.get_topology_desc(platform="tpu", topology_name=target.topology,
                                                chip_config_name=target.chip_config,
                                                chips_per_host_bounds=target.host_bounds, num_slices=1)
    except Exception as e:  # jax's XlaRuntimeError and RuntimeError: name the target and libtpu's reason
        reason = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise CompilerMissing(f"libtpu could not describe {target.name} ({target.topology}): {reason}") from e


@contextlib.contextmanager
def _start_up_noise_caught() -> Iterator[None]:
    """libtpu's start-up writes to fd 2 from C++ what reads as failures on a host without a TPU
    (`could not determine TPU accelerator type`, `E0000 ... INVALID_ARGUMENT: unexpected
    worker hostname`): every successful compile-only check printed them. They go to a temp
    file for the block, and back to stderr only if the block fails."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            caught.seek(0)
            sys.stderr.write(caught.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def compile_for(target: Target, hlo: bytes, donors: tuple[int, ...], resident: int = 0,
                arg_shardings: dict[int, str] | None = None) -> Compiled:
    """Compile the HloModuleProto `hlo` for `target`'s chips, `donors` donated, with `resident`
    bytes per chip of other buffers alive beside it (counted in its total) and `arg_shardings`
    (parameter -> HLO sharding text) for arguments an earlier module's outputs hand it."""
    import numpy as np
    from jax._src import compiler
    from jax._src.lib import xla_client

    devices = topology(target).devices
    if len(devices) != target.chips:
        raise RuntimeError(f"libtpu describes {len(devices)} devices for {target.name}, expected {target.chips}")
    module = _stablehlo(hlo, donors, arg_shardings or {})
    n = len(devices)
    options = compiler.get_compile_options(num_replicas=1, num_partitions=n,
                                           device_assignment=np.array(devices).reshape(1, n))
    build = options.executable_build_options
    build.use_shardy_partitioner = False
    if n > 1:
        build.use_spmd_partitioning = True
        build.allow_spmd_sharding_propagation_to_output = [True]
    t0 = time.perf_counter()
    try:
        exe = devices[0].client.compile(module, executable_devices=xla_client.DeviceList(tuple(devices)),
                                        compile_options=options)
    except Exception as e:  # the compiler's refusal: XlaRuntimeError (RESOURCE_EXHAUSTED and others)
        return Compiled(time.perf_counter() - t0, None, refusal=summarise_refusal(str(e)))
    seconds = time.perf_counter() - t0
    s = exe.get_compiled_memory_stats()
    memory = Memory(s.argument_size_in_bytes, s.output_size_in_bytes, s.alias_size_in_bytes,
                    s.temp_size_in_bytes, s.generated_code_size_in_bytes, resident)
    cost = exe.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    shardings = tuple(str(xla_client.HloSharding.from_proto(o)) for o in exe.get_output_shardings()) if n > 1 else ()
    return Compiled(seconds, memory, float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)),
                    over_hbm(memory, target.chip.hbm), short_of_headroom(memory, target.chip.hbm), shardings)


def short_of_headroom(memory: Memory, hbm: int) -> str:
    """The verdict of a graph within the chip's HBM that leaves less than HEADROOM of it free
    ('' otherwise, and for one over HBM: `over_hbm` speaks for that)."""
    if memory.total > hbm or memory.total <= (1 - HEADROOM) * hbm:
        return ""
    return (f"tight: needs {memory.total / GiB:.2f} GiB of {hbm / GiB:.0f} GiB per chip, {1 - memory.total / hbm:.1%} "
            f"spare (fits needs {HEADROOM:.0%}: the runtime and the allocator's fragmentation take some)")


def over_hbm(memory: Memory, hbm: int) -> str:
    """The refusal of a graph the compiler accepted whose buffers still exceed the chip: libtpu
    accepts steps needing more than HBM when their outputs are not donated (docs/tpu.md, the
    donation under SPMD), as it does not count the arguments and
    the undonated outputs against HBM together. '' when it is within HBM."""
    if memory.total <= hbm:
        return ""
    undonated = memory.outputs - memory.aliased
    return (f"does not fit: needs {memory.total / GiB:.2f} GiB of {hbm / GiB:.0f} GiB per chip (arguments "
            f"{memory.arguments / GiB:.2f}, outputs not donated {undonated / GiB:.2f}, temp {memory.temp / GiB:.2f}); "
            "the compiler accepted it, the chip cannot hold it")


_OOM = re.compile(r"Used ([\d.]+[KMGT]?) of ([\d.]+[KMGT]?) hbm\. Exceeded hbm capacity by ([\d.]+[KMGT]?)")
_TOO_BIG = re.compile(r"Allocation \(size=(\d+)\) would exceed memory \(size=(\d+)\).*?shape = '([^']+)'.*?tag = '([^']*)'",
                      re.S)


def summarise_refusal(message: str) -> str:
    """The compiler's out-of-memory verdict in one line: all buffers together (`needs 22.32G of
    15.75G HBM`) or one buffer larger than the chip (`one buffer of 32.8 GiB, bf16[...] ...`);
    else the first line of its error."""
    m = _OOM.search(message)
    if m:
        return f"does not fit: needs {m.group(1)} of {m.group(2)} HBM per chip ({m.group(3)} over)"
    m = _TOO_BIG.search(message)
    if m:
        size, limit = int(m.group(1)), int(m.group(2))
        return (f"does not fit: one buffer of {size / 1024**3:.1f} GiB ({m.group(3).split('{')[0]}, {m.group(4)}) "
                f"exceeds the chip's {limit / 1024**3:.1f} GiB")
    first = next((line.strip() for line in message.splitlines() if line.strip()), "unknown error")
    return f"compiler error: {first[:300]}"


def _stablehlo(hlo: bytes, donors: tuple[int, ...], arg_shardings: dict[int, str]) -> bytes:
    """`hlo` as StableHLO bytecode, `donors` marked donated, annotated weight shardings and
    `arg_shardings` on their arguments (see the module docstring)."""
    from jax._src.interpreters import mlir
    from jax._src.lib import _jax
    from jax._src.lib.mlir import ir

    with mlir.make_ir_context() as context:
        module = ir.Module.parse(_jax.mlir.hlo_to_stablehlo(hlo), context=context)
        main = next(op for op in module.body.operations if ir.StringAttr(op.attributes["sym_name"]).value == "main")
        block = main.regions[0].blocks[0]
        attrs = [_as_dict(a) for a in _arg_attrs(main, len(block.arguments))]
        for i in donors:
            attrs[i]["jax.buffer_donor"] = ir.BoolAttr.get(True)
        for i, sharding in _annotated_arguments(block).items():
            attrs[i].setdefault("mhlo.sharding", sharding)
        for i, text in arg_shardings.items():
            attrs[i]["mhlo.sharding"] = ir.StringAttr.get(text)
        main.attributes["arg_attrs"] = ir.ArrayAttr.get([ir.DictAttr.get(a) for a in attrs])
        return mlir.module_to_bytecode(module)


def _arg_attrs(main, n: int) -> list:
    """`main`'s argument attribute dicts (None each where it has none)."""
    from jax._src.lib.mlir import ir

    if "arg_attrs" not in main.attributes:
        return [None] * n
    return list(ir.ArrayAttr(main.attributes["arg_attrs"]))


def _as_dict(attr) -> dict:
    from jax._src.lib.mlir import ir

    if attr is None:
        return {}
    d = ir.DictAttr(attr)
    return {d[i].name: d[i].attr for i in range(len(d))}


def _annotated_arguments(block) -> dict[int, object]:
    """Argument index -> the sharding of a `Sharding` custom call applied directly to it."""
    from jax._src.lib.mlir import ir

    out = {}
    for op in block.operations:
        if op.operation.name != "stablehlo.custom_call" or "mhlo.sharding" not in op.attributes:
            continue
        if ir.StringAttr(op.attributes["call_target_name"]).value != "Sharding":
            continue
        arg = op.operands[0]
        if isinstance(arg, ir.BlockArgument) or ir.BlockArgument.isinstance(arg):
            out[ir.BlockArgument(arg).arg_number] = op.attributes["mhlo.sharding"]
    return out
