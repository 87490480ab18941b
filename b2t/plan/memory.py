"""Per-device memory plan of a run, from shapes alone: nothing is built or compiled.

Why: on a TPU the first sign of a batch that does not fit is RESOURCE_EXHAUSTED at the end
of a many-minute compile. The estimate adds up what one training step keeps alive on each
device of an SPMD run (batch rows split over all `devices`, weights replicated or, with
fsdp > 1, sharded over `fsdp` of them as `b2t.engine.mesh.shard_dim` splits them):

  static       f32 weights, f32 gradients, AdamW's two f32 moments (each 1/fsdp of every
               tensor that splits evenly, the rest whole), the bf16 weight copies autocast
               makes for the matmuls (whole: under fsdp they are the gathered weights), and
               under fsdp a gather workspace: the largest tensor's f32 weight and gradient whole
               (before its reduce-scatter), twice (the step's new state is written into the
               buffers it replaces, `b2t.engine.backend.Backend.donate`, so it is not counted twice);
  activations  of one micro-batch of `rows` rows in a bucket of T bins (P patches), per
               the dtype policy in `b2t.contract` (bf16 compute, f32 GRU state and CTC),
               for any model family (its day layers, GRU stacks and linear layers are read
               off the module tree, `model_shape`): augmentation scratch, per day layer its
               per-row (F, F) weights gathered and its patches (rows, P, size*F), per GRU
               layer the input projection (rows, P, 3H) and the saved gates and states,
               every linear output and the heads' f32 log-probabilities, per head the CTC
               scan state (P, rows, 2L+1) with its 3-way logsumexp, and as backward
               workspace one more copy of the largest activation. Element-wise joins
               between parts (the noise family's patches - estimate) are not counted.

It is a model of what the graph holds, not a measurement: `b2t-plan --target`
(`b2t.plan`) compiles the real step with the TPU compiler and prints both side by side.

Shape legend: r rows per device, T bins, P patches, F = 512 features, H hidden units,
S = 2L + 1 CTC states, C = 41 classes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from b2t.buckets import patch_count
from b2t.config import Config, ModelConfig
from b2t.contract import COMPUTE_DTYPE, FEATURE_DIM, FEATURE_DTYPE, LOSS_DTYPE, PARAM_DTYPE, BucketShape
from b2t.engine.mesh import shard_dim
from b2t.errors import UsageError
from b2t.model.layers import DayLayer, GRUStack
from b2t.model.registry import build_model, count_parameters
from b2t.phonemes import N_CLASSES

F32, BF16 = PARAM_DTYPE.itemsize, COMPUTE_DTYPE.itemsize
FEAT, LOSS = FEATURE_DTYPE.itemsize, LOSS_DTYPE.itemsize
MASK = 1  # a bool dropout mask element
GiB = 1024**3
DEFAULT_HEADROOM = 0.1
"""Share of device memory left to the runtime, fragmentation and XLA's own scratch."""


COMPETITION_DAYS = 45
COMPETITION_BUCKETS = (BucketShape(T=498, B=64, L=48), BucketShape(T=798, B=64, L=64),
                       BucketShape(T=1198, B=64, L=72), BucketShape(T=2498, B=64, L=88))
"""What `b2t-plan` assumes without a dataset: the Brain-to-Text '25 data's 45 sessions and a
bucket table like its own (trials of 100-2,500 bins, phoneme sequences up to about 80)."""


@dataclass(frozen=True)
class ModelShape:
    """What the activation estimate needs of a model family, read off its modules.

    `inputs`: day layers (each makes its own (r, T, F) input and (r, P, D) patches);
    `grus`: (input width, hidden units, layers) per GRU stack; `linears`: (input, output)
    widths of every linear layer outside the GRUs (heads of C classes, or D for a noise estimate);
    `heads`: CTC heads; `matmul_weights`: parameters autocast copies to bf16 each step.
    """

    inputs: int
    grus: tuple[tuple[int, int, int], ...]
    linears: tuple[tuple[int, int], ...]
    heads: int
    matmul_weights: int


@functools.cache
def model_shape(cfg: ModelConfig) -> ModelShape:
    """The `ModelShape` of `cfg`'s family, from its modules built on the meta device."""
    model = build_model(cfg, 1, device=torch.device("meta"))
    grus = [m for m in model.modules() if isinstance(m, GRUStack)]
    in_grus = {id(p) for g in grus for p in g.parameters()}
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and id(m.weight) not in in_grus]
    gru_weights = sum(getattr(g, n).numel() for g in grus for n in g.param_names if n.startswith("weight"))
    return ModelShape(
        inputs=sum(isinstance(m, DayLayer) for m in model.modules()),
        grus=tuple((g.weight_ih_l0.shape[1], g.hidden_size, g.num_layers) for g in grus),
        linears=tuple((m.in_features, m.out_features) for m in linears),
        heads=len(model.heads),
        matmul_weights=gru_weights + sum(m.weight.numel() for m in linears),
    )


def activation_bytes(rows: int, T: int, L: int, cfg: ModelConfig) -> dict[str, int]:
    """Bytes one training micro-batch of `rows` rows x T bins (L label slots) keeps, by part."""
    shape, F = model_shape(cfg), FEATURE_DIM
    P = patch_count(T, cfg.patch_size, cfg.patch_stride)
    D, S = cfg.patch_size * F, 2 * L + 1
    rTF, rP = rows * T * F, rows * P
    # per GRU layer: input projection (r,P,3H) bf16, saved gates (r,P,3H) f32, carried h and
    # output (r,P,H) f32; between layers a dropout mask and the dropped copy
    gru = sum(n * rP * H * (3 * BF16 + 3 * F32 + 2 * F32) + (n - 1) * rP * H * (MASK + BF16) for _, H, n in shape.grus)
    parts = {
        "batch + augmentation": rTF * FEAT + 3 * rTF * LOSS,  # bf16 input, f32 noise/shift/smooth scratch
        # per day layer: W gathered (r,F,F) f32 and bf16; softsign in and out, mask, dropped copy
        "day layers": shape.inputs * (rows * F * F * (F32 + BF16) + rTF * (BF16 + BF16 + MASK + BF16)),
        "patches": shape.inputs * rP * D * BF16,  # (r, P, size*F) bf16 per day layer
        "GRU": gru,
        # bf16 input copy and output of each linear, the heads' f32 log-probabilities
        "linear layers + log-softmax": sum(rP * (i + o) * BF16 for i, o in shape.linears) + shape.heads * rP * N_CLASSES * LOSS,
        "CTC scan": shape.heads * rP * S * LOSS * (1 + 1 + 3),  # emissions, alpha per step, logsumexp stack
    }
    largest = max(rows * F * F * F32, rTF * LOSS, rP * D * BF16, rP * 3 * max(H for _, H, _ in shape.grus) * F32,
                  shape.heads * rP * S * LOSS * 3)
    parts["backward workspace"] = largest
    return parts


@dataclass(frozen=True)
class Weights:
    """Parameter counts of a model as `fsdp` devices share it (`weight_layout`)."""

    n_params: int  # the whole model
    per_device: int  # each device's share: 1/fsdp of every tensor that splits evenly, the others whole
    largest: int  # the largest tensor, whole (the gather workspace under fsdp)
    fsdp: int = 1


@functools.cache
def weight_layout(cfg: ModelConfig, n_days: int, fsdp: int = 1) -> Weights:
    """`Weights` of `cfg`'s model from its real parameter shapes (built on the meta device)."""
    shapes = [p.shape for p in build_model(cfg, n_days, device=torch.device("meta")).parameters()]
    per_device = sum(s.numel() // (fsdp if shard_dim(s, fsdp) is not None else 1) for s in shapes)
    return Weights(sum(s.numel() for s in shapes), per_device, max(s.numel() for s in shapes), fsdp)


def static_bytes(weights: Weights, cfg: ModelConfig) -> dict[str, int]:
    """Per-device bytes of a step that do not depend on the batch, by part."""
    share = weights.per_device
    parts = {
        "weights (f32)": share * F32,
        "gradients (f32)": share * F32,
        "AdamW moments (f32)": 2 * share * F32,
        "bf16 weight copies": model_shape(cfg).matmul_weights * BF16,
    }
    if weights.fsdp > 1:
        parts["gather workspace (fsdp)"] = 2 * 2 * weights.largest * F32
    return parts


@dataclass(frozen=True)
class BucketPlan:
    shape: BucketShape
    rows_per_device: int
    activations: dict[str, int]

    @property
    def activation_total(self) -> int:
        return sum(self.activations.values())


@dataclass(frozen=True)
class MemoryPlan:
    devices: int
    n_params: int
    static: dict[str, int]
    buckets: list[BucketPlan]
    device_memory: int | None = None
    headroom: float = DEFAULT_HEADROOM
    fit_rows: int | None = None  # largest rows per device of the largest bucket that fit
    notes: list[str] = field(default_factory=list)
    parts: dict[str, int] = field(default_factory=dict)  # parameters per top-level part of the model
    fsdp: int = 1  # devices each weight is sharded over
    recommended: MemoryPlan | None = None  # with device_memory: the mesh of these devices to use

    @property
    def static_total(self) -> int:
        return sum(self.static.values())

    @property
    def largest(self) -> BucketPlan:
        return max(self.buckets, key=lambda b: b.activation_total)

    @property
    def peak(self) -> int:
        """Estimated per-device peak: static plus the activations of the heaviest bucket."""
        return self.static_total + self.largest.activation_total


    @property
    def fits(self) -> bool:
        """The configured batches fit the device memory, less headroom (False without one)."""
        return self.device_memory is not None and self.peak <= int(self.device_memory * (1.0 - self.headroom))


def step_bytes(rows: int, shape: BucketShape, weights: Weights, cfg: ModelConfig) -> int:
    """Per-device estimate of a step on `rows` rows of `shape`'s T and L."""
    return sum(static_bytes(weights, cfg).values()) + sum(activation_bytes(rows, shape.T, shape.L, cfg).values())


def largest_rows(shape: BucketShape, budget: int, weights: Weights, cfg: ModelConfig) -> int:
    """The most rows per device of `shape` whose step fits `budget` bytes (0 if none does)."""
    return largest_passing(lambda rows: step_bytes(rows, shape, weights, cfg) <= budget)


def largest_passing(passes: Callable[[int], bool], start: int = 1) -> int:
    """The largest n >= 1 for which `passes(n)`, given it passes up to some n and fails above
    (memory grows with rows): doubling from `start` until a probe fails, then bisection; 0 when
    none passes. Shared by the shape model and the TPU compiler's fit search (`b2t.plan.check`)."""
    lo, hi = 0, start
    while passes(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    return lo


def plan_memory(buckets: list[BucketShape], n_days: int, cfg: Config, devices: int, *,
                fsdp: int = 1, device_memory: int | None = None,
                headroom: float = DEFAULT_HEADROOM, recommend: bool = True) -> MemoryPlan:
    """The per-device memory plan of training `cfg` on `buckets` split over `devices`, weights
    sharded over `fsdp` of them; with `device_memory`, also the mesh `recommend_mesh` picks."""
    if devices < 1 or fsdp < 1 or devices % fsdp:
        raise UsageError(f"fsdp={fsdp} must divide devices={devices} (both >= 1)")
    if not buckets:
        raise UsageError("no buckets to plan for")
    parts = count_parameters(cfg.model, n_days)
    parts.pop("total")
    weights = weight_layout(cfg.model, n_days, fsdp)
    notes = [f"{b.T}x{b.B}: B does not divide over {devices} devices" for b in buckets if b.B % devices]
    plans = [BucketPlan(b, b.B // devices, activation_bytes(max(b.B // devices, 1), b.T, b.L, cfg.model))
             for b in buckets]
    static = static_bytes(weights, cfg.model)
    if device_memory is None:
        return MemoryPlan(devices, weights.n_params, static, plans, notes=notes, parts=parts, fsdp=fsdp)
    budget = int(device_memory * (1.0 - headroom))
    fit = largest_rows(max(plans, key=lambda b: b.activation_total).shape, budget, weights, cfg.model)
    plan = MemoryPlan(devices, weights.n_params, static, plans, device_memory, headroom, fit, notes, parts, fsdp)
    if not recommend:
        return plan
    return replace(plan, recommended=recommend_mesh(buckets, n_days, cfg, devices, device_memory=device_memory,
                                                    headroom=headroom))


def recommend_mesh(buckets: list[BucketShape], n_days: int, cfg: Config, devices: int, *,
                   device_memory: int, headroom: float = DEFAULT_HEADROOM) -> MemoryPlan:
    """The plan of the mesh of `devices` to train on: the least weight sharding whose step fits the
    configured batches in one step (least communication); when none does, the most sharding
    (the largest micro-batch)."""
    plans = [plan_memory(buckets, n_days, cfg, devices, fsdp=f, device_memory=device_memory,
                         headroom=headroom, recommend=False)
             for f in range(1, devices + 1) if devices % f == 0]
    return next((p for p in plans if p.fits), plans[-1])


def parse_bytes(text: str) -> int:
    """'16GiB', '16GB', '512MiB', '1.5e9' -> bytes."""
    units = {"kib": 1024, "mib": 1024**2, "gib": GiB, "tib": 1024**4, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
             "b": 1}
    t = text.strip().lower().replace(" ", "")
    for unit, scale in units.items():
        if t.endswith(unit):
            number = t[: -len(unit)]
            break
    else:
        number, scale = t, 1
    try:
        value = float(number) * scale
    except ValueError:
        raise UsageError(f"cannot read {text!r} as a memory size: write e.g. 16GiB or 512MiB") from None
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"memory size must be a finite size > 0, got {text!r}: write e.g. 16GiB or 512MiB")
    return int(value)


def _mib(n: int) -> str:
    return f"{n / 1024**2:10.1f} MiB"


def _size(n: int) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / 1024**2:.1f} MiB"


def format_plan(plan: MemoryPlan, cfg: Config) -> str:
    """The plan as the text `b2t-plan` prints."""
    lines = [_layout_line(plan),
             f"parameters: {plan.n_params:,} ({', '.join(f'{k} {v:,}' for k, v in plan.parts.items())})", "",
             "buckets (T x B, L labels; rows per device; activations per device):"]
    for b in plan.buckets:
        s = b.shape
        lines.append(f"  T={s.T:5d} B={s.B:4d} L={s.L:3d}  rows/device {b.rows_per_device:4d}  "
                     f"{_mib(b.activation_total)}")
    lines += ["", "per device:"]
    lines += [f"  {k:36s}{_mib(v)}" for k, v in plan.static.items()]
    big = plan.largest
    lines.append(f"  activations, bucket T={big.shape.T} B={big.shape.B} ({big.rows_per_device} rows/device):")
    lines += [f"    {k:34s}{_mib(v)}" for k, v in big.activations.items()]
    lines.append(f"  {'estimated peak':36s}{_mib(plan.peak)}")
    if plan.device_memory is not None:
        usable = int(plan.device_memory * (1 - plan.headroom))
        lines += ["", f"device memory {_size(plan.device_memory)}, planning against {_size(usable)} "
                      f"({plan.headroom:.0%} headroom):"]
        lines.append(f"  the configured batches: {'fits' if plan.fits else 'DOES NOT FIT'} "
                     f"(estimated peak {_size(plan.peak)} per device)")
        if plan.fit_rows:
            micro = plan.fit_rows * plan.devices
            accum = -(-big.shape.B // micro)
            lines.append(f"  largest micro-batch of the T={big.shape.T} bucket: {plan.fit_rows} rows/device = "
                         f"{micro} rows in all")
            if micro < big.shape.B:
                lines.append(f"  to keep {big.shape.B} rows per optimizer step: preprocess with a token_budget "
                             f"giving this bucket <= {micro} rows, and set train.grad_accum={accum}")
        else:
            lines.append("  not even one row per device fits: the weights and optimizer state alone are too large")
        if plan.recommended is not None:
            lines.append(_recommendation(plan.recommended))
    lines += [f"note: {n}" for n in plan.notes]
    m, shape = cfg.model, model_shape(cfg.model)
    grus = " + ".join(f"{n}x{H}" for _, H, n in shape.grus)
    lines.append(f"(config: {m.family} family, GRU layers x units {grus}, patch {m.patch_size}/"
                 f"{m.patch_stride}; an estimate from shapes, nothing was compiled, measured at 0.76x to 2.7x of the TPU "
                 "compiler's per-chip total (docs/tpu.md): add --target v5e-8 (or another TPU slice) for the "
                 "compiler's own verdict, which replaces this estimate)")
    return "\n".join(lines)


def mesh_option(devices: int, fsdp: int) -> str:
    """The `--mesh` value of `devices` split as data x fsdp, e.g. `data=8`, `fsdp=8`, `data=2,fsdp=4`."""
    data = devices // fsdp
    return ",".join([f"data={data}"] * (data > 1 or fsdp == 1) + [f"fsdp={fsdp}"] * (fsdp > 1))


def _layout_line(plan: MemoryPlan) -> str:
    if plan.fsdp == 1:
        return f"devices: {plan.devices} (batch rows split over them; weights replicated)"
    return (f"devices: {plan.devices}, --mesh {mesh_option(plan.devices, plan.fsdp)} (batch rows split over all "
            f"{plan.devices}; weights, gradients and AdamW moments sharded over fsdp={plan.fsdp})")


def _recommendation(best: MemoryPlan) -> str:
    mesh = f"--mesh {mesh_option(best.devices, best.fsdp)}"
    if best.fits:
        return (f"  recommended on {best.devices} devices: {mesh}, the least weight sharding whose step fits the "
                f"configured batches (estimated peak {_size(best.peak)} per device)")
    return (f"  recommended on {best.devices} devices: {mesh}; no mesh fits the configured batches in one step, this "
            f"one fits the largest micro-batch ({best.fit_rows} rows/device of the T={best.largest.shape.T} bucket)")
