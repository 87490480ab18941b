"""Which part of b2t's step each HLO instruction, and each TPU kernel's compile time, belongs to.

Why: the TPU compiler's time follows what the graph holds, and the graph is one module
of thousands of instructions with no names of b2t's own. So while the trainer's step is
traced (`b2t.plan.capture.trace`), `tagged()` names every op after the b2t (and torch optimizer,
clipping, nn) functions on the Python stack that traced it: a `sys.setprofile` hook pushes one
torch_xla scope per such call (XLA_HLO_DEBUG puts the scopes into each instruction's
`op_name`). Backward ops run on autograd's device thread, outside those calls: every autograd
node the forward creates is labelled with the forward's scopes (a TorchFunctionMode sees each
op), and a node pre-hook pushes them, under `backward`, while the node runs.

`parts` maps a scope path to a part (`RULES`: the innermost matching scope wins); `count`
counts a module's instructions per part and inside while-loop bodies; `backend_seconds`
reads libtpu's per-kernel log (TPU_VMODULE=<compiler>_compiler_base=1) into compiler-thread
seconds per fused kernel, which `kernel_parts` assigns to the part most of the kernel's
instructions come from.
"""

from __future__ import annotations

import collections
import contextlib
import re
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

BACKWARD = "backward"
_ROOTS = ("/b2t/", "/torch/optim/", "/torch/nn/utils/clip_grad.py", "/torch/nn/modules/",
          "/torch_xla/_patched_functions.py")  # torch_xla replaces clip_grad_norm_
_UNSCOPED = ("hlo_parts.py", "private_api.py")  # the tagger's own frames (the scope pusher lives in private_api)

# (part, scope-name patterns, whether a backward copy gets its own row): innermost match wins
RULES: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("RNG", ("CounterRng.", "TorchRng."), True),
    ("dropout masks", ("_drawn", "DropoutMask.", "input_dropped", "dropped"), True),
    ("augmentation and smoothing", ("augment", "smooth", "shift_start", "_zero_beyond", "gaussian_kernel"), True),
    ("GRU backward", ("stack_backward", "_layer_backward", "_walk_scan", "_state_grad_step",
                      "_LazyGRULayers.backward"), False),
    ("GRU forward", ("scan_layers", "_gru_step", "_all_layers", "_LazyGRULayers.forward", "GRUStack.", "gru_stack"),
     True),
    ("CTC", ("ctc_loss", "scan_nll", "_alpha_step", "ctc_feasible", "_ctc_per_head", "ctc_nll", "recompute_vjp"), True),
    ("day layers", ("DayLayer.",), True),
    ("patching", ("patches", "_Patches."), True),
    ("gradient reversal", ("reverse_gradient", "_ReverseGradient"), True),
    ("linear layers", ("Linear.",), True),
    ("gradient clipping", ("clip_grad", "_clip_grads", "_get_total_norm"), False),
    ("zero gradients", ("zero_grad",), False),  # checkouts before gradients lived within a step
    ("AdamW", ("adam", "Adam", "_use_grad"), False),
    ("learning rates", ("set_lrs",), False),
    ("eval outputs", ("_forward_eval", "_evaluate", "gathered"), False),
    ("loss and objective", ("_forward_loss", "_heads_and_nll", "forward_backward"), True),
    ("loss totals", ("train_step", "_zero_totals"), False),
    ("model (other)", ("forward", "output_lengths", "patch_counts"), True),
)
INPUTS = "inputs (parameters, constants)"
UNTAGGED = "gradient accumulation (autograd)"


def _scope_name(code) -> str:
    return code.co_qualname.replace("<locals>.", "")


def _push_xla_scope():
    """`b2t.private_api.push_xla_scope`: the measured checkout's, or this clone's where that
    checkout predates it (tools/compile_parts.py measures any checkout)."""
    try:
        from b2t.private_api import push_xla_scope
    except ImportError:
        import importlib.util

        spec = importlib.util.spec_from_file_location("b2t_private_api", Path(__file__).parents[1] / "b2t/private_api.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        push_xla_scope = module.push_xla_scope
    return push_xla_scope


class _Tagger:
    """The profile hook and the autograd-node labels of one `tagged()` block."""

    def __init__(self) -> None:
        self.push = _push_xla_scope()
        self.local = threading.local()
        self.labels: dict[int, tuple[str, ...]] = {}  # id(node) -> forward scopes
        self.keep: list = []  # labelled nodes stay alive, so their ids stay theirs

    def _stack(self) -> list:
        if not hasattr(self.local, "stack"):
            self.local.stack = []
        return self.local.stack

    def profile(self, frame, event: str, arg) -> None:
        if event not in ("call", "return"):
            return
        code = frame.f_code
        if not any(r in code.co_filename for r in _ROOTS) or code.co_filename.endswith(_UNSCOPED):
            return
        stack = self._stack()
        if event == "call":
            stack.append((frame, _scope_name(code), self.push(_scope_name(code))))
        elif stack and stack[-1][0] is frame:
            stack.pop()

    def names(self) -> tuple[str, ...]:
        return tuple(name for _, name, _ in self._stack())

    def label(self, outputs) -> None:
        """Label the autograd nodes behind `outputs` that no earlier op labelled."""
        scopes = self.names()
        todo = [_grad_fn(t) for t in outputs]
        while todo:
            node = todo.pop()
            if node is None or id(node) in self.labels or type(node).__name__ == "AccumulateGrad":
                continue
            self.labels[id(node)] = scopes
            self.keep.append(node)
            node.register_prehook(lambda grad_outputs, node=node: self._enter(node))
            node.register_hook(lambda grad_inputs, grad_outputs, node=node: self._leave(node))
            todo.extend(n for n, _ in node.next_functions)

    def _enter(self, node) -> None:
        if sys.getprofile() is None:  # autograd's device thread: trace its Python frames too
            sys.setprofile(self.profile)
        stack = self._stack()
        for name in (BACKWARD, *self.labels.get(id(node), ())):
            stack.append((node, name, self.push(name)))

    def _leave(self, node) -> None:
        stack = self._stack()
        while stack and stack[-1][0] is node:
            stack.pop()


def _grad_fn(t):
    import torch

    if not isinstance(t, torch.Tensor) or not t.requires_grad:
        return None
    try:
        return t.grad_fn
    except RuntimeError:  # a no-grad view modified in place: no node to label
        return None


@contextlib.contextmanager
def tagged() -> Iterator[None]:
    """Scope every op traced inside (this thread and autograd's) by the functions that traced it."""
    from torch.overrides import TorchFunctionMode

    tagger = _Tagger()

    class Labeller(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            tagger.label(out if isinstance(out, (tuple, list)) else (out,))
            return out

    sys.setprofile(tagger.profile)
    try:
        with Labeller():
            yield
    finally:
        sys.setprofile(None)
        tagger._stack().clear()


def part(op_name: str, op_type: str = "", default: str = "") -> str:
    """The part of an instruction from its `op_name` scope path (`a.1/b.7/aten__mul`); one with
    no scope belongs to `default` (the part of the instruction that calls its computation)."""
    scopes = [re.sub(r"\.\d+$", "", s) for s in op_name.split("/")[:-1]]
    backward = BACKWARD in scopes
    for scope in reversed(scopes):
        for name, patterns, directional in RULES:
            if any(_matches(scope, p) for p in patterns):
                return f"{name} (backward)" if backward and directional else name
    if default:
        return default
    if op_type in ("xla__device_data", "prim__Constant", "") and not scopes:
        return INPUTS
    return UNTAGGED if not backward else "backward (other)"


def _matches(scope: str, pattern: str) -> bool:
    """`Class.` patterns match a method's qualname, others a function name's start."""
    return scope.startswith(pattern) or scope.rsplit(".", 1)[-1].startswith(pattern)


@dataclass
class Counts:
    """Instructions per part: all of them, and those inside while-loop bodies (with conditions)."""

    total: collections.Counter = field(default_factory=collections.Counter)
    in_loops: collections.Counter = field(default_factory=collections.Counter)
    loops: int = 0

    @property
    def instructions(self) -> int:
        return sum(self.total.values())


_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_CALLS = re.compile(r"\b(?:body|condition|calls|to_apply)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_OP_TYPE = re.compile(r'op_type="([^"]*)"')


@dataclass(frozen=True)
class Instruction:
    name: str
    opcode: str
    op_name: str
    op_type: str
    calls: tuple[str, ...]
    line: str


def computations(text: str) -> dict[str, list[Instruction]]:
    """An HLO module's text (`HloModule.to_string()`, XLA's text dump) as computation -> instructions."""
    out: dict[str, list[Instruction]] = {}
    current = None
    for line in text.splitlines():
        if current is None:
            m = _COMPUTATION.match(line)
            if m and not line.startswith("HloModule"):
                current = out.setdefault(m.group(1), [])
            continue
        if line.strip() == "}":
            current = None
            continue
        ins = _instruction(line)
        if ins is not None:
            current.append(ins)
    return out


def _instruction(line: str) -> Instruction | None:
    body = line.strip()
    if body.startswith("ROOT "):
        body = body[5:]
    name, sep, rest = body.partition(" = ")
    if not sep:
        return None
    i = 0
    if rest.startswith("("):  # a tuple shape: skip its balanced parentheses
        depth = 0
        for i, ch in enumerate(rest):
            depth += (ch == "(") - (ch == ")")
            if depth == 0:
                break
        i += 1
    else:
        i = rest.find(" ")
    opcode = rest[i:].strip().split("(", 1)[0]
    calls = _CALLS.findall(rest)
    for group in _BRANCHES.findall(rest):
        calls += [c.strip().lstrip("%") for c in group.split(",") if c.strip()]
    op_name = _OP_NAME.search(rest)
    op_type = _OP_TYPE.search(rest)
    return Instruction(name.lstrip("%"), opcode, op_name.group(1) if op_name else "",
                       op_type.group(1) if op_type else "", tuple(calls), rest)


def loop_computations(comps: dict[str, list[Instruction]]) -> set[str]:
    """Computations run by a while-loop (its body and condition, and what they call)."""
    seeds = [c for ins in (i for v in comps.values() for i in v) if ins.opcode == "while" for c in ins.calls]
    inside: set[str] = set()
    while seeds:
        c = seeds.pop()
        if c in inside or c not in comps:
            continue
        inside.add(c)
        seeds.extend(x for ins in comps[c] for x in ins.calls)
    return inside


def parts_of(comps: dict[str, list[Instruction]]) -> dict[str, dict[str, str]]:
    """computation -> instruction -> part; an instruction without metadata inside a called
    computation (a loop body's parameters and tuples, a reducer) takes its caller's part."""
    called = {c for v in comps.values() for i in v for c in i.calls}
    defaults = dict.fromkeys((c for c in comps if c not in called), "")
    out: dict[str, dict[str, str]] = {}
    todo = list(defaults)
    while todo:
        comp = todo.pop()
        if comp in out:
            continue
        out[comp] = {i.name: part(i.op_name, i.op_type, defaults[comp]) for i in comps[comp]}
        for ins in comps[comp]:
            for c in ins.calls:
                if c in comps and c not in out:
                    defaults[c] = out[comp][ins.name]
                    todo.append(c)
    return out


def count(text: str) -> Counts:
    """Instructions of a module per part (fusion and reducer computations counted with the rest)."""
    comps = computations(text)
    loops = loop_computations(comps)
    counts = Counts(loops=sum(1 for v in comps.values() for i in v if i.opcode == "while"))
    for comp, parts in parts_of(comps).items():
        for p in parts.values():
            counts.total[p] += 1
            if comp in loops:
                counts.in_loops[p] += 1
    return counts


_LLO = re.compile(r"^[IWE]\d{4} (\d\d):(\d\d):(\d\d\.\d+)\s+(\d+) \S+\] (.*)$")
_KERNEL = re.compile(r"^\[(\S+)\] LLO optimizing ([\d,]+) instructions")
_PACKED = re.compile(r"bundle packing time")
_STAGE = re.compile(r"(HLO_PASSES|BACKEND_PASSES|CODE_GENERATION|END_TO_END) stage duration: (.*)$")
# a timed pass: `HLO pass: dce time: 14 us (...)`, `XLA::TPU main fusion pass time: 47.4 ms (...)`,
# `LSRAv2 *** total bundle packing time: 512 us (...)` (per kernel: summed)
_PASS = re.compile(r"^(HLO pass: [\w.-]+|XLA::TPU [\w :.-]+?|LSRAv2 \*\*\* [\w ]+?) time: ([\d.]+ ?(?:us|ms|s|m|h)\b[^(]*)")


@dataclass
class Backend:
    """libtpu's log of one compile: stage durations and per-kernel compiler-thread seconds."""

    stages: dict[str, float] = field(default_factory=dict)
    kernels: dict[str, float] = field(default_factory=dict)  # fused kernel -> seconds on its compiler thread
    llo: dict[str, int] = field(default_factory=dict)  # fused kernel -> LLO instructions before optimization
    passes: dict[str, float] = field(default_factory=dict)  # timed pass -> seconds, summed over its calls
    threads: int = 0


def duration(text: str) -> float:
    """libtpu's durations (`1m7.04s`, `300.49ms`, `14.58s`, `1.74 ms`) in seconds."""
    total = 0.0
    for value, unit in re.findall(r"([\d.]+) ?(h|ms|us|m|s)(?![a-z])", text):
        total += float(value) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}[unit]
    return total


def backend_seconds(log: str) -> Backend:
    """Per kernel, the compiler-thread time from the end of the thread's previous kernel to the
    end of this one's bundle packing (emission, LLO optimisation, scheduling, packing)."""
    out = Backend()
    last_end: dict[str, float] = {}
    current: dict[str, str] = {}
    for line in log.splitlines():
        m = _LLO.match(line)
        if not m:
            continue
        h, mi, s, tid, msg = m.groups()
        t = int(h) * 3600 + int(mi) * 60 + float(s)
        if st := _STAGE.search(msg):
            out.stages[st.group(1)] = duration(st.group(2))
            continue
        if ps := _PASS.match(msg):
            name = ps.group(1).removeprefix("XLA::TPU ").removeprefix("LSRAv2 *** ")
            out.passes[name] = out.passes.get(name, 0.0) + duration(ps.group(2))
        if k := _KERNEL.match(msg):
            current[tid] = k.group(1)
            out.llo[k.group(1)] = out.llo.get(k.group(1), 0) + int(k.group(2).replace(",", ""))
            last_end.setdefault(tid, t)
        elif _PACKED.search(msg) and tid in current:
            name = current.pop(tid)
            out.kernels[name] = out.kernels.get(name, 0.0) + t - last_end.get(tid, t)
            last_end[tid] = t
    out.threads = len(last_end)
    return out


_WEIGHT = {"convolution": 20, "dot": 20, "scatter": 5, "gather": 5, "reduce-window": 5, "select-and-scatter": 5,
           "parameter": 0, "constant": 0, "bitcast": 0, "tuple": 0, "get-tuple-element": 0}
"""How much of a kernel's code an instruction makes, roughly: a matmul fused with a few
element-wise ops (an accumulation, a norm's squares) is the matmul's part."""


def kernel_parts(optimized: str) -> dict[str, str]:
    """Kernel (fusion, or lone instruction) name of the optimized TPU module -> the part that
    makes most of its code (`_WEIGHT`: a matmul outweighs the element-wise ops fused with it)."""
    comps = computations(optimized)
    out = {}
    for instructions in comps.values():
        for ins in instructions:
            votes: collections.Counter = collections.Counter()
            for sub in _fused(ins, comps):
                votes[part(sub.op_name, sub.op_type)] += _WEIGHT.get(sub.opcode, 1)
            votes.pop(INPUTS, None)
            best = votes.most_common(1)
            out[ins.name] = best[0][0] if best and best[0][1] > 0 else part(ins.op_name, ins.op_type)
    return out


def _fused(ins: Instruction, comps: dict[str, list[Instruction]]) -> list[Instruction]:
    if ins.opcode != "fusion":
        return [ins]
    inside = []
    for c in ins.calls:
        for sub in comps.get(c, []):
            inside.extend(_fused(sub, comps) if sub.opcode == "fusion" else [sub])
    return inside


def newest(directory: Path, pattern: str) -> str:
    """The text of the last file in `directory` matching `pattern` ('' when none)."""
    files = sorted(directory.glob(pattern), key=lambda p: p.stat().st_mtime)
    return files[-1].read_text() if files else ""
