"""Compile behaviour of b2t's step against a dynamically padded port of the public baseline.

Prints three tables (XLA CPU device unless PJRT_DEVICE says otherwise):
  1. first-step seconds (trace + compile + run) at T = 256, 512, 1024, 2048 for b2t's step
     and for the reference step, each at a shape it has not seen;
  2. XLA compilations over 50 training steps: b2t on its bucketed shards vs the reference
     padding every batch to its own longest trial (the baseline's loader);
  3. steady-state steps/s of the tiny config: openxla vs xla (lazy) vs eager.
Both steps run the same tiny model sizes; the reference is the baseline's structure as a
naive port keeps it: per-day parameters picked with `.item()`, `Tensor.unfold` patching,
`nn.GRU` (torch_xla's scan GRU) and `F.ctc_loss` (no XLA lowering: runs on the host).

    PJRT_DEVICE=CPU python tools/bench_compile.py [--steps 50] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import torch_xla
import torch_xla.debug.metrics as met
from torch import nn
from tqdm import tqdm

from b2t.config import Config, load_config
from b2t.contract import FEATURE_DTYPE, BucketShape, empty_batch
from b2t.data.loader import Batch, StreamConfig, train_batches
from b2t.data.manifest import Manifest
from b2t.train.backend import make_backend
from b2t.train.loop import build_model
from b2t.train.optim import make_optimizer
from b2t.train.step import Stepper
from preprocess.synth import SynthSpec, write_dataset
from preprocess.writer import prepare_dataset

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"


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
        self.gru = nn.GRU(512 * m.patch_size, m.n_units, m.n_layers, batch_first=True)
        self.h0 = nn.Parameter(torch.zeros(1, 1, m.n_units))
        self.out = nn.Linear(m.n_units, 41)

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


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def first_step_seconds(cfg: Config, manifest: Manifest, lengths: list[int], B: int) -> list[tuple[int, float, float]]:
    device = torch_xla.device()
    backend = make_backend(cfg.train.backend)
    model = build_model(manifest, cfg, backend)
    stepper = Stepper(model, make_optimizer(model, cfg.optim), backend, cfg)
    ref = ReferenceDecoder(len(manifest.sessions), cfg).to(device)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    rows = []
    for i, T in enumerate(tqdm(lengths, desc="first step per T")):
        batch = synthetic_batch(T, B, len(manifest.sessions), seed=i)
        ours = timed(lambda: stepper.train_step([Batch(0, batch, {}).to(device)], step=i))
        theirs = timed(lambda: reference_step(ref, ref_opt, batch, device))
        rows.append((T, ours, theirs))
    return rows


def dynamic_padding_batches(shards: Path, manifest: Manifest, steps: int):
    """The same trials as our batches, each batch cut to its own longest trial (and label)."""
    for batch in train_batches(shards, manifest, StreamConfig()):
        t = batch.tensors
        keep = t["valid"]
        T = int(t["n_time_steps"][keep].max())
        L = max(1, int(t["phone_seq_lens"][keep].max()))
        yield {k: v[keep] for k, v in t.items()} | {
            "features": t["features"][keep, :T], "seq_class_ids": t["seq_class_ids"][keep, :L]}


def compile_counts(cfg: Config, shards: Path, manifest: Manifest, steps: int) -> tuple[int, int, int, int]:
    """(ours, distinct shapes ours, reference, distinct shapes reference) over `steps` steps."""
    device = torch_xla.device()
    backend = make_backend(cfg.train.backend)
    model = build_model(manifest, cfg, backend)
    stepper = Stepper(model, make_optimizer(model, cfg.optim), backend, cfg)
    start = compilations()
    shapes = set()
    stream = train_batches(shards, manifest, StreamConfig())
    for i in tqdm(range(steps), desc="b2t steps"):
        batch = next(stream)
        shapes.add(tuple(batch.tensors["features"].shape))
        stepper.train_step([batch.to(device)], i)
    ours = compilations() - start

    ref = ReferenceDecoder(len(manifest.sessions), cfg).to(device)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    start, ref_shapes = compilations(), set()
    for _, batch in zip(tqdm(range(steps), desc="reference steps"), dynamic_padding_batches(shards, manifest, steps)):
        ref_shapes.add(tuple(batch["features"].shape))
        reference_step(ref, ref_opt, batch, device)
    return ours, len(shapes), compilations() - start, len(ref_shapes)


def steps_per_second(cfg: Config, shards: Path, manifest: Manifest, backend_name: str, steps: int) -> float:
    backend = make_backend(backend_name, "cpu" if backend_name == "eager" else None)
    model = build_model(manifest, cfg, backend)
    stepper = Stepper(model, make_optimizer(model, cfg.optim), backend, cfg)
    batches = [b.to(backend.device) for b, _ in zip(train_batches(shards, manifest, StreamConfig()), range(steps))]
    for b in batches:  # first sight of every shape: compile
        stepper.train_step([b], 0)
    backend.wait()
    times = []
    for i, b in enumerate(batches):
        times.append(timed(lambda: (stepper.train_step([b], i + 1), backend.wait())))
    return 1.0 / statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048])
    ap.add_argument("--out", type=Path, default=None, help="where the synthetic data goes (default: a temp dir)")
    args = ap.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="b2t-bench-compile-"))
    cfg = load_config(TINY)
    if not (root / "shards" / "manifest.json").exists():
        write_dataset(SynthSpec(sessions=5, seed=0), root / "hdf5")
        prepare_dataset(root / "hdf5", root / "shards", cfg, workers=1, progress=False)
    manifest = Manifest.load(root / "shards")
    # T must be patch-aligned for our step; the reference takes any T
    lengths = [T - (T - cfg.model.patch_size) % cfg.model.patch_stride for T in args.lengths]

    print(f"# b2t compile benchmark on {torch_xla.device()} ({len(manifest.buckets)} buckets, tiny config)")
    for name in ("openxla", "xla"):
        cfg_b = load_config(TINY, [f"train.backend={name}"])
        rows = first_step_seconds(cfg_b, manifest, lengths, B=4)
        print(f"\n## first step at a new T (s), b2t --backend {name} vs reference, B=4")
        print("| T | b2t | reference |\n|---|---|---|")
        for T, ours, theirs in rows:
            print(f"| {T} | {ours:.1f} | {theirs:.1f} |")

    print(f"\n## XLA compilations over {args.steps} training steps")
    print("| pipeline | distinct batch shapes | compilations |\n|---|---|---|")
    for name in ("openxla", "xla"):
        ours, n_ours, ref, n_ref = compile_counts(load_config(TINY, [f"train.backend={name}"]),
                                                  root / "shards", manifest, args.steps)
        print(f"| b2t buckets, --backend {name} | {n_ours} | {ours} |")
    print(f"| reference, dynamic padding | {n_ref} | {ref} |")

    print("\n## steady-state steps/s, tiny config (median over the same batches)")
    print("| backend | steps/s |\n|---|---|")
    for name in ("openxla", "xla", "eager"):
        print(f"| {name} | {steps_per_second(cfg, root / 'shards', manifest, name, 12):.2f} |")


if __name__ == "__main__":
    main()
