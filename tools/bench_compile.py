"""Compile behaviour of b2t's step against a dynamically padded port of the public baseline.

Prints four tables (XLA CPU device unless PJRT_DEVICE says otherwise):
  1. XLA compilations per bucket of the trainer's warm-up (train and eval graphs of every
     bucket), and how many more the next 50 training steps and an evaluation pass add;
  2. first-step seconds (trace + compile + run) at T = 256, 512, 1024, 2048 for b2t's step
     and for the reference step, each at a shape it has not seen, after a first step at
     T = 128 that pays the process's one-time costs;
  3. XLA compilations over 50 training steps: b2t on its bucketed shards vs the reference
     padding every batch to its own longest trial (the baseline's loader);
  4. steady-state steps/s of the tiny config: openxla, xla (lazy), inductor and eager (CPU),
     and the graph breaks dynamo made in the step (openxla, inductor; 0 expected).
Both steps run the same tiny model sizes; the reference is the baseline's structure as a
naive port keeps it: per-day parameters picked with `.item()`, `Tensor.unfold` patching,
`nn.GRU` (torch_xla's scan GRU) and `F.ctc_loss` (no XLA lowering: runs on the host).

    PJRT_DEVICE=CPU python tools/bench_compile.py [--steps 50] [--out DIR] [--speed-only --rounds 2]

`--speed-only` prints table 4 alone; `--rounds N` measures each backend N times, the
backends alternating within each round (on a shared, noisy machine); `--backends` picks
them, `--compute-dtype f32` runs them in f32 (`train.compute_dtype`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
from torch import nn
from tqdm import tqdm

from b2t.config import BACKENDS, TINY_CONFIG, Config, load_config
from b2t.contract import FEATURE_DTYPE, BucketShape, empty_batch
from b2t.data.loader import Batch, StreamConfig, train_batches
from b2t.data.manifest import Manifest
from b2t.engine.backend import Backend, backend_class, make_backend
from b2t.engine.step import Stepper, make_stepper
from b2t.private_api import graph_breaks
from b2t.train.warmup import warm_up
from preprocess.synth import SynthSpec, write_dataset
from preprocess.writer import prepare_dataset


def compilations() -> int:
    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


class ReferenceDecoder(nn.Module):
    """The public baseline's decoder as a direct port writes it (see module docstring)."""

    def __init__(self, n_days: int, cfg: Config):
        super().__init__()
        m = cfg.model
        self.size, self.stride = m.patch_size, m.patch_stride
        self.day_weights = nn.ParameterList([nn.Parameter(torch.eye(512)) for _ in range(n_days)])
        self.day_biases = nn.ParameterList([nn.Parameter(torch.zeros(1, 512)) for _ in range(n_days)])
        self.gru = nn.GRU(512 * m.patch_size, m.gru.n_units, m.gru.n_layers, batch_first=True)
        self.h0 = nn.Parameter(torch.zeros(1, 1, m.gru.n_units))
        self.out = nn.Linear(m.gru.n_units, 41)

    def forward(self, x: torch.Tensor, days: torch.Tensor) -> torch.Tensor:
        w = torch.stack([self.day_weights[int(d)] for d in days])  # host read per row
        b = torch.stack([self.day_biases[int(d)] for d in days])
        x = F.softsign(torch.einsum("btd,bdk->btk", x, w) + b)
        x = x.unsqueeze(1).permute(0, 3, 1, 2).unfold(3, self.size, self.stride)  # (B, F, 1, P, size)
        x = x.squeeze(2).permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[3], -1)  # (B, P, size*F)
        h0 = self.h0.expand(self.gru.num_layers, x.shape[0], -1).contiguous()
        y, _ = self.gru(x, h0)
        return self.out(y)


def reference_step(model: ReferenceDecoder, opt: torch.optim.Optimizer, batch: dict, device) -> None:
    x, n = batch["features"].to(device).float(), batch["n_time_steps"].to(device)
    with torch.autocast("xla", dtype=torch.bfloat16):
        logits = model(x, batch["day_indices"].to(device))
    lens = ((n - model.size) // model.stride + 1).long()
    loss = F.ctc_loss(logits.float().log_softmax(-1).transpose(0, 1), batch["seq_class_ids"].to(device).long(),
                      lens, batch["phone_seq_lens"].to(device).long(), reduction="none", zero_infinity=True).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    torch_xla.sync()


def synthetic_batch(T: int, B: int, n_days: int, seed: int) -> dict[str, torch.Tensor]:
    """A batch of random features with realistic label lengths (T // 12 phonemes)."""
    g = torch.Generator().manual_seed(seed)
    batch = empty_batch(BucketShape(T=T, B=B, L=max(8, T // 12)))
    batch["features"] = torch.randn((B, T, 512), generator=g).to(FEATURE_DTYPE)
    batch["n_time_steps"].fill_(T)
    batch["seq_class_ids"][:, : T // 12] = torch.randint(1, 41, (B, T // 12), generator=g, dtype=torch.int32)
    batch["phone_seq_lens"].fill_(T // 12)
    batch["day_indices"] = torch.randint(0, n_days, (B,), generator=g, dtype=torch.int32)
    batch["valid"].fill_(True)
    return batch


def wait(backend: Backend) -> None:
    """Block until the device has finished queued work, so a timing covers it."""
    if backend.xla:
        backend.sync()
        xm.wait_device_ops()
    elif backend.device.type == "cuda":
        torch.cuda.synchronize(backend.device)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _stepper(name: str, manifest: Manifest, compute_dtype: str = "bf16") -> tuple[Stepper, torch.device]:
    backend = make_backend(name, "cpu" if name == "eager" else None)
    cfg = load_config(TINY_CONFIG, [f"train.backend={name}", f"train.compute_dtype={compute_dtype}"])
    return make_stepper(cfg, len(manifest.sessions), backend), backend.device


def _reference(manifest: Manifest) -> tuple[ReferenceDecoder, torch.optim.Optimizer, torch.device]:
    device = torch_xla.device()
    ref = ReferenceDecoder(len(manifest.sessions), load_config(TINY_CONFIG)).to(device)
    return ref, torch.optim.AdamW(ref.parameters(), lr=1e-3), device


def first_step_seconds(pipeline: str, manifest: Manifest, lengths: list[int], B: int) -> list[float]:
    """Seconds of the first step at each new T in `lengths` (trace + compile + run, waited
    for), one after the other in a fresh process. The process's first step also pays its
    one-time costs (dynamo's first trace, the update graph every shape shares)."""
    n_days = len(manifest.sessions)
    if pipeline == "reference":
        ref, opt, device = _reference(manifest)

        def step(T: int, i: int) -> None:
            reference_step(ref, opt, synthetic_batch(T, B, n_days, i), device)
            xm.wait_device_ops()
    else:
        stepper, device = _stepper(pipeline, manifest)

        def step(T: int, i: int) -> None:
            stepper.train_step([Batch(0, synthetic_batch(T, B, n_days, i), {}).to(device)], step=i + 1)
            wait(stepper.backend)
    return [timed(lambda: step(T, i)) for i, T in enumerate(lengths)]


def dynamic_padding_batches(shards: Path, manifest: Manifest):
    """The same trials as our batches, each batch cut to its own longest trial (and label)."""
    for batch in train_batches(shards, manifest, StreamConfig()):
        t = batch.tensors
        keep = t["valid"]
        T = int(t["n_time_steps"][keep].max())
        L = max(1, int(t["phone_seq_lens"][keep].max()))
        yield {k: v[keep] for k, v in t.items()} | {
            "features": t["features"][keep, :T], "seq_class_ids": t["seq_class_ids"][keep, :L]}


def compile_count(pipeline: str, shards: Path, manifest: Manifest, steps: int) -> tuple[int, int]:
    """(distinct batch shapes, XLA compilations) over `steps` training steps, in a fresh process."""
    start, shapes = compilations(), set()
    if pipeline == "reference":
        ref, opt, device = _reference(manifest)
        for _, batch in zip(range(steps), dynamic_padding_batches(shards, manifest)):
            shapes.add(tuple(batch["features"].shape))
            reference_step(ref, opt, batch, device)
        return len(shapes), compilations() - start
    stepper, device = _stepper(pipeline, manifest)
    for i, batch in zip(range(steps), train_batches(shards, manifest, StreamConfig())):
        shapes.add(tuple(batch.tensors["features"].shape))
        stepper.train_step([batch.to(device)], i + 1)
    return len(shapes), compilations() - start


def warm_up_counts(pipeline: str, shards: Path, manifest: Manifest, steps: int) -> tuple[int, int]:
    """(compilations of the trainer's warm-up, compilations in `steps` training steps and one
    evaluation pass after it), in a fresh process."""
    stepper, device = _stepper(pipeline, manifest)
    start = compilations()
    warm_up(stepper, manifest.buckets)
    warm = compilations()
    batches = [b.to(device) for b, _ in zip(train_batches(shards, manifest, StreamConfig()), range(steps))]
    for i, batch in enumerate(batches):
        stepper.train_step([batch], i + 1)
    for batch in batches[: len(manifest.buckets) * 2]:
        stepper.eval_step(batch)
    wait(stepper.backend)
    return warm - start, compilations() - warm


def steps_per_second(name: str, shards: Path, manifest: Manifest, steps: int, compute_dtype: str) -> tuple[float, int]:
    """Median steady-state steps/s over the same batches, after each shape was seen once, and
    the graph breaks dynamo made in all those steps."""
    stepper, device = _stepper(name, manifest, compute_dtype)
    batches = [b.to(device) for b, _ in zip(train_batches(shards, manifest, StreamConfig()), range(steps))]
    for b in batches:
        stepper.train_step([b], 1)
    wait(stepper.backend)
    times = [timed(lambda: (stepper.train_step([b], i + 2), wait(stepper.backend))) for i, b in enumerate(batches)]
    return 1.0 / statistics.median(times), graph_breaks()


def run_part(part: str, root: Path, args: argparse.Namespace) -> object:
    kind, pipeline = part.split(":")
    manifest = Manifest.load(root / "shards")
    if kind == "first":
        cfg = load_config(TINY_CONFIG)  # T must be patch-aligned for b2t's step; the reference takes any T
        # a first shape of half the shortest T takes the one-time costs, so every T after it pays the same
        lengths = [T - (T - cfg.model.patch_size) % cfg.model.patch_stride
                   for T in (args.lengths[0] // 2, *args.lengths)]
        return list(zip(lengths, first_step_seconds(pipeline, manifest, lengths, B=4)))
    if kind == "count":
        return compile_count(pipeline, root / "shards", manifest, args.steps)
    if kind == "warm":
        return warm_up_counts(pipeline, root / "shards", manifest, args.steps)
    return steps_per_second(pipeline, root / "shards", manifest, 12, args.compute_dtype)


def in_subprocess(part: str, root: Path, args: argparse.Namespace) -> object:
    """Each measurement in a fresh process: XLA's in-process graph cache would help whoever runs second."""
    cmd = [sys.executable, __file__, "--part", part, "--out", str(root), "--steps", str(args.steps),
           "--lengths", *map(str, args.lengths), "--compute-dtype", args.compute_dtype]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048])
    ap.add_argument("--out", type=Path, default=None, help="where the synthetic data goes (default: a temp dir)")
    ap.add_argument("--speed-only", action="store_true", help="only the steps/s table")
    ap.add_argument("--rounds", type=int, default=1, help="steps/s measurements per backend, alternating")
    ap.add_argument("--backends", nargs="+", choices=BACKENDS,
                    default=list(BACKENDS), help="the steps/s table's backends")
    ap.add_argument("--compute-dtype", choices=("bf16", "f32"), default="bf16",
                    help="train.compute_dtype of the steps/s table (f32 on CPUs without native bf16)")
    ap.add_argument("--part", default=None, help=argparse.SUPPRESS)  # one measurement, run by main itself
    args = ap.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="b2t-bench-compile-"))
    if args.part:
        print(json.dumps(run_part(args.part, root, args)))
        return
    if not (root / "shards" / "manifest.json").exists():
        write_dataset(SynthSpec(sessions=5, seed=0), root / "hdf5")
        prepare_dataset(root / "hdf5", root / "shards", load_config(TINY_CONFIG), workers=1, progress=False)
    manifest = Manifest.load(root / "shards")
    print(f"# b2t compile benchmark, XLA {os.environ.get('PJRT_DEVICE', 'CPU')} device, "
          f"tiny config, {len(manifest.buckets)} buckets")

    if not args.speed_only:
        compile_tables(root, manifest, args)
    speed_table(root, args)


def compile_tables(root: Path, manifest: Manifest, args: argparse.Namespace) -> None:
    n_buckets = len(manifest.buckets)
    print("\n## XLA compilations per bucket: the trainer's warm-up (train + eval graphs), then after it")
    print(f"| backend | warm-up, per bucket | {args.steps} training steps + eval after the warm-up |\n|---|---|---|")
    for name in tqdm([n for n in BACKENDS if backend_class(n).xla], desc="warm-up counts"):
        warm, after = in_subprocess(f"warm:{name}", root, args)
        print(f"| {name} | {warm / n_buckets:.1f} ({warm} for {n_buckets} buckets) | {after} |")

    pipelines = ("openxla", "xla", "reference")
    first = {p: in_subprocess(f"first:{p}", root, args) for p in tqdm(pipelines, desc="first steps")}
    print("\n## first step at a new T (s): trace + compile + run, B=4; the first row is the process's first "
          "step (one-time costs), each later row a new shape")
    print("| T | b2t openxla | b2t xla | reference |\n|---|---|---|---|")
    for i, (T, _) in enumerate(first["openxla"]):
        label = f"{T} (first step of the process)" if i == 0 else str(T)
        print(f"| {label} | " + " | ".join(f"{first[p][i][1]:.1f}" for p in pipelines) + " |")
    ratio = {p: first[p][-1][1] / first[p][1][1] for p in pipelines}
    print(f"\nT={first['openxla'][-1][0]} / T={first['openxla'][1][0]}: "
          + ", ".join(f"{p} {r:.2f}x" for p, r in ratio.items()))

    print(f"\n## XLA compilations over {args.steps} training steps")
    print("| pipeline | distinct batch shapes | compilations |\n|---|---|---|")
    for p in tqdm(pipelines, desc="compile counts"):
        n_shapes, n_compiles = in_subprocess(f"count:{p}", root, args)
        print(f"| {'b2t buckets, --backend ' + p if p != 'reference' else 'reference, dynamic padding'} "
              f"| {n_shapes} | {n_compiles} |")


def speed_table(root: Path, args: argparse.Namespace) -> None:
    """Table 4: each figure from a fresh process, the backends in turn `args.rounds` times."""
    runs: dict[str, list] = {name: [] for name in args.backends}
    for _ in tqdm(range(args.rounds), desc="steps/s rounds"):
        for name in args.backends:
            runs[name].append(in_subprocess(f"speed:{name}", root, args))
    print(f"\n## steady-state steps/s, tiny config, compute {args.compute_dtype} (median over the same 12 batches; "
          "one figure per round)")
    print("| backend | steps/s | dynamo graph breaks in the step |\n|---|---|---|")
    for name, results in runs.items():
        breaks = ", ".join(str(b) for _, b in results) if name in ("openxla", "inductor") else "(no dynamo)"
        print(f"| {name} | {' / '.join(f'{r:.2f}' for r, _ in results)} | {breaks} |")


if __name__ == "__main__":
    main()
