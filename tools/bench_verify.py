"""What hashing every shard (sha256 against the manifest) would cost the trainer's loader.

Decides between hashing each shard as the loader first opens it and a `--verify-data`
option: one first pass over the train shards through `b2t.data.loader.train_batches` (the
trainer's stream; each batch copied once on the host, `copy`, or moved to the XLA CPU
device, `xla`, as the trainer does), against `file_sha256` over the same shards, warm
page cache, one torch thread, median of `--reps`. Prints the figures and the slowdown
hashing on first open would add to that pass.

    python tools/bench_verify.py            # long trials (about 350-1,900 bins)
    python tools/bench_verify.py --short    # b2t-synth's default lengths
"""

from __future__ import annotations

import itertools
import statistics
import tempfile
import time
from pathlib import Path

import click
import torch
import torch_xla

from b2t.config import Config, DataConfig, ModelConfig
from b2t.data.loader import StreamConfig, pass_shards, train_batches
from b2t.data.manifest import Manifest, file_sha256
from preprocess.synth import SynthSpec, write_dataset
from preprocess.writer import prepare_dataset

LONG = {"words": (4, 16), "bins_per_phoneme": (12, 32), "rest_bins": (20, 100)}


def first_pass(out: Path, manifest: Manifest, consume: str) -> float:
    """Seconds for the loader's first train pass, every batch consumed as `consume` says."""
    shards = pass_shards(manifest, "train", 0, StreamConfig())
    n = sum(s.n_batches for s in shards)
    device = torch_xla.device() if consume == "xla" else None
    t0 = time.perf_counter()
    for batch in itertools.islice(train_batches(out, manifest, StreamConfig()), n):
        for v in batch.tensors.values():
            if device is not None:
                v.to(device)
            else:
                torch.empty_like(v).copy_(v)
    if device is not None:
        torch_xla.sync()
    return time.perf_counter() - t0


def hash_pass(out: Path, manifest: Manifest) -> float:
    t0 = time.perf_counter()
    for s in pass_shards(manifest, "train", 0, StreamConfig()):
        file_sha256(out / s.name)
    return time.perf_counter() - t0


@click.command()
@click.option("--short", is_flag=True, help="b2t-synth's default (short) trials.")
@click.option("--sessions", default=2, show_default=True)
@click.option("--train-trials", default=64, show_default=True)
@click.option("--reps", default=3, show_default=True)
def main(short: bool, sessions: int, train_trials: int, reps: int) -> None:
    torch.set_num_threads(1)
    spec = SynthSpec(sessions=sessions, train_trials=train_trials, val_trials=0, test_trials=0,
                     **({} if short else LONG))
    config = Config(data=DataConfig(n_buckets=3, batch_size=16, token_budget=None, epochs=1, batches_per_shard=4),
                    model=ModelConfig(patch_size=14, patch_stride=4))
    with tempfile.TemporaryDirectory() as work:
        src, out = Path(work) / "hdf5", Path(work) / "shards"
        write_dataset(spec, src)
        prepare_dataset(src, out, config, splits=("train",), progress=False)
        manifest = Manifest.load(out)
        shards = pass_shards(manifest, "train", 0, StreamConfig())
        size = sum(s.bytes for s in shards)
        n = sum(s.n_batches for s in shards)
        hash_pass(out, manifest)  # warm the page cache
        times = {k: [] for k in ("copy", "xla", "sha256")}
        for _ in range(reps):
            times["copy"].append(first_pass(out, manifest, "copy"))
            times["xla"].append(first_pass(out, manifest, "xla"))
            times["sha256"].append(hash_pass(out, manifest))
        med = {k: statistics.median(v) for k, v in times.items()}
    click.echo(f"{len(shards)} shards, {n} batches, {size / 1e6:.0f} MB ({'short' if short else 'long'} trials)")
    click.echo(f"sha256 of every shard: {med['sha256']:.3f} s ({size / 1e6 / med['sha256']:.0f} MB/s)")
    for consume in ("copy", "xla"):
        click.echo(f"loader first pass, {consume}: {med[consume]:.3f} s ({n / med[consume]:.1f} batches/s); "
                   f"hashing each shard on first open adds {100 * med['sha256'] / med[consume]:.0f}%")


if __name__ == "__main__":
    main()
