"""b2t's training step against the public baseline's step structure, side by side.

For each size (the baseline's real one: 5 x 768 GRU, B=64, patches of 14 bins every 4; and
the tiny config's: 2 x 64, B=16) and each mode (eager; compiled with torch.compile's
default compiler, inductor), two steps on the same synthetic batch:
  - b2t: `b2t.engine.step.Stepper` with the `eager` or `inductor` backend (its bf16 policy);
  - baseline: the public baseline's structure as docs/reference-baseline.md describes it
    (written here, not its code): one 512x512 weight and bias per day picked per row in
    Python, softsign, dropout, `Tensor.unfold` patching, `nn.GRU` with dropout between
    layers and a learnable h0, linear out, `F.ctc_loss` (mean over rows), clipping at 10,
    AdamW with the day / no-decay / decay groups; its compiled variant compiles the model
    (what the baseline ships), the loss and update stay eager.
Each configuration runs in a fresh process: first step seconds (compilation included),
steady steps/s over `--steps` steps after `--warm` warm-up steps, and peak memory (CUDA:
`torch.cuda.max_memory_allocated`; CPU: the process's max resident set, which includes
the Python and torch runtime).

    python tools/bench_baseline.py [--device cuda --autocast bf16] [--steps 20] [--warm 3]
        [--T 800] [--tiny-T 512] [--sizes baseline tiny] [--modes eager inductor]

On a 2-core CPU keep the baseline size short, e.g. `--T 256 --steps 3 --warm 2`.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.rnn import GRU as TorchGRU

from b2t.config import CONFIG_DIR, TINY_CONFIG, Config, load_config
from b2t.contract import FEATURE_DIM, FEATURE_DTYPE, Batch, BucketShape, empty_batch
from b2t.engine.backend import make_backend
from b2t.engine.step import make_stepper
from b2t.phonemes import N_CLASSES


@dataclass(frozen=True)
class Size:
    config: str  # the b2t config whose model, batch and optimizer sizes this size takes
    n_days: int


SIZES = {"baseline": Size(str(CONFIG_DIR / "baseline.yaml"), 45), "tiny": Size(str(TINY_CONFIG), 5)}
DAYS_PER_BATCH = 4


class BaselineDecoder(nn.Module):
    """The baseline's decoder structure: (B, T, 512) features and day ids -> (B, P, 41) logits."""

    def __init__(self, cfg: Config, n_days: int) -> None:
        super().__init__()
        m, g = cfg.model, cfg.model.gru
        self.size, self.stride = m.patch_size, m.patch_stride
        self.day_weights = nn.ParameterList(nn.Parameter(torch.eye(FEATURE_DIM)) for _ in range(n_days))
        self.day_biases = nn.ParameterList(nn.Parameter(torch.zeros(1, FEATURE_DIM)) for _ in range(n_days))
        self.day_dropout = nn.Dropout(m.input_dropout)
        self.gru = TorchGRU(FEATURE_DIM * m.patch_size, g.n_units, g.n_layers, dropout=g.rnn_dropout, batch_first=True)
        for name, p in self.gru.named_parameters():
            if name.startswith("weight_hh"):
                nn.init.orthogonal_(p)
            elif name.startswith("weight_ih"):
                nn.init.xavier_uniform_(p)
        self.h0 = nn.Parameter(nn.init.xavier_uniform_(torch.zeros(1, 1, g.n_units)))
        self.out = nn.Linear(g.n_units, N_CLASSES)
        nn.init.xavier_uniform_(self.out.weight)

    def forward(self, x: torch.Tensor, days: torch.Tensor) -> torch.Tensor:
        rows = days.tolist()  # the per-row day lookup happens in Python, as in the baseline
        w = torch.stack([self.day_weights[d] for d in rows])  # (B, 512, 512)
        b = torch.cat([self.day_biases[d] for d in rows]).unsqueeze(1)  # (B, 1, 512)
        x = self.day_dropout(F.softsign(torch.einsum("btd,bdk->btk", x, w) + b))
        windows = x.unsqueeze(1).permute(0, 3, 1, 2).unfold(3, self.size, self.stride)  # (B, 512, 1, P, size)
        x = windows.squeeze(2).permute(0, 2, 3, 1).reshape(x.shape[0], windows.shape[3], -1)  # (B, P, size*512)
        y, _ = self.gru(x, self.h0.expand(self.gru.num_layers, x.shape[0], -1).contiguous())
        return self.out(y)


class BaselineStep:
    """One training step of the baseline's recipe around `BaselineDecoder`."""

    def __init__(self, cfg: Config, n_days: int, device: torch.device, mode: str, autocast: bool) -> None:
        self.model = BaselineDecoder(cfg, n_days).to(device)
        self.forward = torch.compile(self.model) if mode == "inductor" else self.model
        o = cfg.optim
        named = list(self.model.named_parameters())
        groups = [
            {"params": [p for n, p in named if n.startswith("day_")], "lr": o.lr_day, "weight_decay": o.weight_decay_day},
            {"params": [p for n, p in named if not n.startswith("day_") and "bias" in n], "weight_decay": 0.0},
            {"params": [p for n, p in named if not n.startswith("day_") and "bias" not in n]},
        ]
        self.optimizer = torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                                           weight_decay=o.weight_decay)
        self.clip, self.device, self.autocast = o.grad_clip, device, autocast

    def __call__(self, batch: dict[str, torch.Tensor]) -> None:
        t = {k: v.to(self.device) for k, v in batch.items()}
        self.model.train()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            logits = self.forward(t["features"].float(), t["day_indices"])
        lengths = (t["n_time_steps"] - self.model.size) // self.model.stride + 1
        loss = F.ctc_loss(logits.float().log_softmax(-1).transpose(0, 1), t["seq_class_ids"].long(), lengths.long(),
                          t["phone_seq_lens"].long(), blank=0, reduction="none", zero_infinity=True).mean()
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad()


def random_batch(shape: BucketShape, n_days: int) -> dict[str, torch.Tensor]:
    """Full-length rows of noise from `DAYS_PER_BATCH` days, labels of T // 12 phonemes."""
    g = torch.Generator().manual_seed(0)
    n_labels = shape.T // 12
    batch = empty_batch(shape)
    batch["features"] = torch.randn((shape.B, shape.T, FEATURE_DIM), generator=g).to(FEATURE_DTYPE)
    batch["n_time_steps"].fill_(shape.T)
    batch["seq_class_ids"][:, :n_labels] = torch.randint(1, N_CLASSES, (shape.B, n_labels), generator=g,
                                                         dtype=batch["seq_class_ids"].dtype)
    batch["phone_seq_lens"].fill_(n_labels)
    days = torch.randperm(n_days, generator=g)[: min(DAYS_PER_BATCH, n_days)]
    batch["day_indices"] = days.repeat_interleave(-(-shape.B // len(days)))[: shape.B].to(torch.int32)
    batch["valid"].fill_(True)
    return batch


def measure(impl: str, mode: str, size: str, T: int, args: argparse.Namespace) -> dict[str, float]:
    """First-step seconds, steady steps/s and peak memory (MiB) of one configuration."""
    device = torch.device(args.device)
    dtype = "bf16" if args.autocast == "bf16" else "f32"
    cfg = load_config(SIZES[size].config, [f"train.backend={mode}", f"train.compute_dtype={dtype}"])
    n_days = SIZES[size].n_days
    batch = random_batch(BucketShape(T=T, B=cfg.data.batch_size, L=max(8, T // 12)), n_days)
    torch.manual_seed(0)
    if impl == "b2t":
        stepper = make_stepper(cfg, n_days, make_backend(mode, device))
        placed, done = Batch(0, batch, {}).to(device), [0]

        def step() -> None:
            done[0] += 1
            stepper.train_step([placed], done[0])
    else:
        baseline = BaselineStep(cfg, n_days, device, mode, args.autocast == "bf16")

        def step() -> None:
            baseline(batch)

    def synced() -> None:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    t0 = time.perf_counter()
    synced()
    first = time.perf_counter() - t0
    for _ in range(args.warm - 1):
        synced()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        synced()
    rate = args.steps / (time.perf_counter() - t0)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # KiB on Linux
    return {"first_s": first, "steps_per_s": rate, "peak_mib": peak}


def in_subprocess(part: str, args: argparse.Namespace) -> dict[str, float] | str:
    """One configuration in a fresh process: its figures, or the last line of its error."""
    cmd = [sys.executable, __file__, "--part", part, "--device", args.device, "--autocast", args.autocast,
           "--steps", str(args.steps), "--warm", str(args.warm)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return lines[-1] if lines else f"exit status {done.returncode}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def patch_aligned(T: int, size: str) -> int:
    """The largest T' <= T whose patches end on its last bin (what b2t's buckets are)."""
    m = load_config(SIZES[size].config).model
    if T < m.patch_size:
        raise SystemExit(f"error: T={T} is shorter than one patch ({m.patch_size} bins): pass a larger --T/--tiny-T")
    return T - (T - m.patch_size) % m.patch_stride


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    ap.add_argument("--autocast", choices=("bf16", "none"), default="bf16",
                    help="both steps' compute: bf16 autocast, or none (f32; b2t's train.compute_dtype=f32)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per configuration")
    ap.add_argument("--warm", type=int, default=3, help="untimed steps first (compilation)")
    ap.add_argument("--T", type=int, default=800, help="time bins per trial at the baseline size")
    ap.add_argument("--tiny-T", type=int, default=512, help="time bins per trial at the tiny size")
    ap.add_argument("--sizes", nargs="+", choices=tuple(SIZES), default=list(SIZES))
    ap.add_argument("--modes", nargs="+", choices=("eager", "inductor"), default=["eager", "inductor"])
    ap.add_argument("--part", default=None, help=argparse.SUPPRESS)  # impl:mode:size:T, run by main itself
    args = ap.parse_args()
    if args.steps < 1 or args.warm < 1:
        raise SystemExit("error: --steps and --warm must be >= 1")
    if args.device not in ("cpu", "cuda"):
        raise SystemExit(f"error: --device {args.device!r}: choose cpu or cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch sees no CUDA device: run on a GPU machine or use --device cpu")
    if args.part:
        impl, mode, size, T = args.part.split(":")
        print(json.dumps(measure(impl, mode, size, int(T), args)))
        return
    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"# b2t step vs the baseline's step structure on {where}; both steps autocast {args.autocast}, "
          f"{args.warm} warm-up + {args.steps} timed steps per row, each row a fresh process")
    print("| size | B x T | step | mode | first step s | steps/s | peak memory MiB |\n|---|---|---|---|---|---|---|")
    for size in args.sizes:
        T = patch_aligned(args.T if size == "baseline" else args.tiny_T, size)
        B = load_config(SIZES[size].config).data.batch_size
        for mode in args.modes:
            for impl in ("b2t", "baseline"):
                got = in_subprocess(f"{impl}:{mode}:{size}:{T}", args)
                if isinstance(got, str):
                    print(f"| {size} | {B} x {T} | {impl} | {mode} | failed: {got} | | |", flush=True)
                else:
                    print(f"| {size} | {B} x {T} | {impl} | {mode} | {got['first_s']:.1f} | {got['steps_per_s']:.3g} "
                          f"| {got['peak_mib']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
