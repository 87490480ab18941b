"""Data-path benchmark: our shards through WebDataset vs a loader like the public baseline's.

Every path delivers the same batches (the same trials, batch by batch, taken from the
shards' own meta) through `DataLoader(batch_size=None)`:
- shards: each WebDataset sample is a whole batch; decoded with `decode_sample` into the
  contract tensors (bf16 features, padded to the bucket length);
- shards-mmap: the same shards through a memory-mapped probe reader (`MmapShardBatches`),
  to tell the cost of the format from the cost of WebDataset's tar streaming;
- reference: like the baseline's dataset, each batch opens the HDF5 file of each of its
  days, reads every chosen trial (features, phoneme ids, transcription, attributes) and
  pads to the batch's longest trial with `pad_sequence` (f32 features).
Timings are paired in one process (repetitions alternate which path goes first; medians
reported), torch runs one thread in both, and peak RSS comes from running each path in a
child process that reports its own high-water mark (Linux).

    python tools/bench_data.py                # 300 trials of about 350-1,900 bins
    python tools/bench_data.py --short        # b2t-synth's default, shorter trials
"""

from __future__ import annotations

import json
import mmap
import statistics
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import h5py
import torch
import webdataset as wds
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

from b2t.config import Config, DataConfig, ModelConfig
from b2t.data.manifest import Manifest
from b2t.data.sample import META_KEY, TENSORS_KEY, decode_sample
from preprocess.synth import SynthSpec, write_dataset
from preprocess.writer import prepare_dataset

LONG = {"words": (4, 16), "bins_per_phoneme": (12, 32), "rest_bins": (20, 100)}
"""b2t-synth options for the real data's length range (about 350-1,900 bins, median ~1,050)."""

SAFETENSORS_DTYPES = {"BF16": torch.bfloat16, "I32": torch.int32, "BOOL": torch.bool}
Composition = list[tuple[str, str, int]]  # per batch: (file relative to the source, trial group, day index)


def batch_bytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.nbytes for t in tensors.values())


class ShardBatches(torch.utils.data.IterableDataset):
    """Our path: one WebDataset sample is one batch; decode to the contract tensors."""

    def __init__(self, urls: list[str]):
        self.urls = urls

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for sample in wds.WebDataset(self.urls, shardshuffle=False, empty_check=False):
            yield decode_sample(sample)[0]


class MmapShardBatches(torch.utils.data.IterableDataset):
    """A probe, not WebDataset: the same shards read the way a local-disk reader could.

    Each tar is indexed once and memory-mapped; a batch's tensors are viewed in place
    (safetensors: u64 header length, JSON header, raw data) and cloned once, so every
    byte is still copied out of the page cache, as a consumer would. It separates the
    cost of the format from the cost of WebDataset's streaming tar reader.
    """

    def __init__(self, urls: list[str]):
        self.urls = urls

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for url in self.urls:
            with tarfile.open(url, "r:") as tar:
                members = [(m.name, m.offset_data, m.size) for m in tar.getmembers()]
            with open(url, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                view = memoryview(mapped)
                for name, offset, size in members:
                    if name.endswith("." + META_KEY):
                        json.loads(bytes(view[offset:offset + size]))
                    elif name.endswith("." + TENSORS_KEY):
                        yield _safetensors_at(view, offset)
                view.release()


def _safetensors_at(view: memoryview, offset: int) -> dict[str, torch.Tensor]:
    (n,) = struct.unpack_from("<Q", view, offset)
    header = json.loads(bytes(view[offset + 8:offset + 8 + n]))
    start = offset + 8 + n
    tensors = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the mapping is read-only; we clone at once
        for name, spec in header.items():
            if name != "__metadata__":
                lo, hi = spec["data_offsets"]
                flat = torch.frombuffer(view[start + lo:start + hi], dtype=SAFETENSORS_DTYPES[spec["dtype"]])
                tensors[name] = flat.reshape(spec["shape"]).clone()
    return tensors


class ReferenceBatches(Dataset):
    """The baseline's way: per batch, open each day's HDF5 file, read the trials, pad to the longest."""

    def __init__(self, root: Path, batches: list[Composition]):
        self.root, self.batches = root, batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        by_file: dict[str, list[tuple[str, int]]] = {}
        for file, group, day in self.batches[index]:
            by_file.setdefault(file, []).append((group, day))
        features, ids, text, n_steps, n_ids, days, blocks, trials = [], [], [], [], [], [], [], []
        for file, rows in by_file.items():
            with h5py.File(self.root / file, "r") as f:
                for group, day in rows:
                    g = f[group]
                    features.append(torch.from_numpy(g["input_features"][:]))  # (n, F) f32
                    ids.append(torch.from_numpy(g["seq_class_ids"][:]))
                    text.append(torch.from_numpy(g["transcription"][:]))
                    n_steps.append(int(g.attrs["n_time_steps"]))
                    n_ids.append(int(g.attrs["seq_len"]))
                    days.append(day)
                    blocks.append(int(g.attrs["block_num"]))
                    trials.append(int(g.attrs["trial_num"]))
        long = torch.int64
        return {
            "input_features": pad_sequence(features, batch_first=True, padding_value=0),  # (B, T_max, F)
            "seq_class_ids": pad_sequence(ids, batch_first=True, padding_value=0),
            "transcriptions": pad_sequence(text, batch_first=True, padding_value=0),
            "n_time_steps": torch.tensor(n_steps, dtype=long, device="cpu"),
            "phone_seq_lens": torch.tensor(n_ids, dtype=long, device="cpu"),
            "day_indicies": torch.tensor(days, dtype=long, device="cpu"),
            "block_nums": torch.tensor(blocks, dtype=long, device="cpu"),
            "trial_nums": torch.tensor(trials, dtype=long, device="cpu"),
        }


def read_all(dataset: Dataset) -> tuple[int, int]:
    """(batches, bytes of delivered tensors) of one full pass, as a trainer's loop would pull them."""
    n, size = 0, 0
    for batch in DataLoader(dataset, batch_size=None, num_workers=0):
        n += 1
        size += batch_bytes(batch)
    return n, size


def compositions(out: Path, manifest: Manifest) -> list[Composition]:
    """The trials of every train batch, in shard order, from the shards' own meta."""
    batches = []
    for sample in wds.WebDataset([str(out / s.name) for s in manifest.shards_of("train")], shardshuffle=False):
        meta = decode_sample(sample)[1]
        batches.append([(r["file"], r["group"], manifest.sessions.index(r["session"])) for r in meta["rows"] if r])
    return batches


def make_paths(src: Path, out: Path) -> dict[str, Callable[[], tuple[int, int]]]:
    manifest = Manifest.load(out)
    urls = [str(out / s.name) for s in manifest.shards_of("train")]
    datasets = {"shards": ShardBatches(urls), "shards-mmap": MmapShardBatches(urls),
                "reference": ReferenceBatches(src, compositions(out, manifest))}
    return {name: (lambda d=d: read_all(d)) for name, d in datasets.items()}


def peak_rss_mib(path: str, src: Path, out: Path) -> float:
    """Peak RSS of a child process that makes one pass of `path` (or only imports, for 'idle').

    The child reports its own VmHWM: `ru_maxrss` would also count the pages the child
    shared with this (large) process between fork and exec.
    """
    child = subprocess.run([sys.executable, __file__, "--child", path, "--src", str(src), "--out", str(out)],
                           capture_output=True, text=True, check=False)
    if child.returncode != 0:
        raise RuntimeError(f"the {path} child exited with {child.returncode}: {child.stderr[-2000:]}")
    return int(child.stdout.split()[-1]) / 1024


def run_child(path: str, src: Path, out: Path) -> None:
    torch.set_num_threads(1)
    if path != "idle":
        make_paths(src, out)[path]()
    status = Path("/proc/self/status").read_text()
    print(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))  # KiB


def benchmark(work: Path, spec: SynthSpec, config: Config, reps: int, workers: int) -> None:
    src, out = work / "src", work / "shards"
    t0 = time.perf_counter()
    synth = write_dataset(spec, src)
    synth_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    report = prepare_dataset(src, out, config, splits=["train"], workers=workers, progress=False)
    prep_s = time.perf_counter() - t0
    torch.set_num_threads(1)
    paths = make_paths(src, out)
    for read in paths.values():  # warm-up: both sources now sit in the page cache
        read()
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    sizes: dict[str, tuple[int, int]] = {}
    for r in range(reps):
        for name in (list(paths) if r % 2 == 0 else list(reversed(paths))):
            t = time.perf_counter()
            sizes[name] = paths[name]()
            seconds[name].append(time.perf_counter() - t)
    rss = {name: peak_rss_mib(name, src, out) for name in ("idle", *paths)}

    buckets = ", ".join(f"{b.T}x{b.B}" for b in report.manifest.buckets)
    print(f"data: {spec.sessions} sessions, {synth.trials} trials, "
          f"bins min/median/max {'/'.join(map(str, synth.bins))}, "
          f"{synth.bytes / 1e9:.2f} GB of HDF5 (b2t-synth took {synth_s:.1f} s)")
    print(f"preprocess: {report.scanned_trials} trials -> {report.written_trials} train rows "
          f"({config.data.epochs} epochs) in {len(report.manifest.shards)} shards "
          f"({sum(s.bytes for s in report.manifest.shards) / 1e9:.2f} GB), buckets {buckets}, "
          f"{report.manifest.splits['train']['padding_rows']} padding rows")
    print(f"  {prep_s:.1f} s with {workers} worker(s) for scan + checks + writing = "
          f"{report.scanned_trials / prep_s:.0f} source trials/s; writing alone "
          f"{report.written_trials / report.write_seconds:.0f} rows/s")
    print(f"reading: median of {reps} paired passes over {sizes['shards'][0]} batches, "
          "one torch thread, warm page cache\n")
    print(f"{'path':<12} {'batches/s':>10} {'GB/s':>6} {'vs reference':>13} {'peak RSS MiB':>13} "
          f"{'(idle ' + format(rss['idle'], '.0f') + ')':>11}")
    reference = statistics.median(seconds["reference"])
    for name in paths:
        med = statistics.median(seconds[name])
        n, size = sizes[name]
        paired = statistics.median(r / s for s, r in zip(seconds[name], seconds["reference"]))
        print(f"{name:<12} {n / med:>10.1f} {size / med / 1e9:>6.2f} {reference / med:>12.1f}x "
              f"{rss[name]:>13.0f} {rss[name] - rss['idle']:>+11.0f}")
        if name != "reference":
            print(f"{'':<12} median of per-pass ratios {paired:.1f}x")
    print("\nGB/s counts delivered tensor bytes (bf16 features for shards, f32 for the reference); "
          "shards = WebDataset + decode_sample, shards-mmap = the probe reader above")


@click.command()
@click.option("--sessions", default=6, show_default=True)
@click.option("--train-trials", default=50, show_default=True, help="Per session.")
@click.option("--short", is_flag=True,
              help="b2t-synth's default lengths (about 70-400 bins) instead of real-like ones.")
@click.option("--batch-size", default=32, show_default=True,
              help="Rows per batch (the recipe's 64 leaves a few hundred trials mostly in half-empty tail batches).")
@click.option("--epochs", default=2, show_default=True, help="Train compositions written (more batches to time).")
@click.option("--reps", default=5, show_default=True)
@click.option("--workers", default=1, show_default=True, help="b2t-preprocess workers.")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path),
              help="Keep the data here (must not exist).")
@click.option("--child", type=click.Choice(["idle", "shards", "shards-mmap", "reference"]), hidden=True)
@click.option("--src", type=click.Path(path_type=Path), hidden=True)
@click.option("--out", type=click.Path(path_type=Path), hidden=True)
def main(sessions: int, train_trials: int, short: bool, batch_size: int, epochs: int, reps: int, workers: int,
         workdir: Path | None, child: str | None, src: Path | None, out: Path | None) -> None:
    """Benchmark reading shards vs per-batch HDF5 reading on b2t-synth data."""
    if child:
        run_child(child, src, out)
        return
    spec = SynthSpec(sessions=sessions, train_trials=train_trials, val_trials=0, test_trials=0, seed=1,
                     **({} if short else LONG))
    config = Config(data=DataConfig(n_buckets=4, batch_size=batch_size, days_per_batch=4, epochs=epochs,
                                    batches_per_shard=16), model=ModelConfig())
    if workdir:
        workdir.mkdir(parents=True)
        benchmark(workdir, spec, config, reps, workers)
    else:
        with tempfile.TemporaryDirectory(prefix="b2t-bench-") as tmp:
            benchmark(Path(tmp), spec, config, reps, workers)


if __name__ == "__main__":
    main()
