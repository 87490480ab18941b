"""Data-path benchmark: our shards through b2t's loader vs a loader like the public baseline's.

Every path delivers the same batches (the same trials, batch by batch, taken from the
shards' own meta) through `DataLoader(batch_size=None)`:
- b2t loader: `b2t.data.loader.train_batches`, the trainer's own stream (WebDataset
  pipeline with the memory-mapped tar stage; tensors view the page-cached shard);
- no checks: the same stream with its per-row contract checks (`b2t.data.rows`) switched
  off, so the pair shows what the checks cost;
- wds stream: the same shards through WebDataset's streaming tar reader and
  `decode_sample` (what the loader did before the mapped stage), for comparison;
- reference: like the baseline's dataset, each batch opens the HDF5 file of each of its
  days, reads every chosen trial (features, phoneme ids, transcription, attributes) and
  pads to the batch's longest trial with `pad_sequence` (f32 features).
Each path is timed with three consumers: `read` (the loop gets the batch and touches
nothing), `copy` (every delivered tensor is copied once into a reused host buffer, as a
host-to-device DMA would read it) and `xla` (every tensor moved to the XLA CPU device,
as the trainer does). Timings are paired in one process (repetitions alternate the path
order; medians reported), torch runs one thread, and peak RSS comes from a child process
that makes one `copy` pass and reports its own high-water mark (Linux).

    python tools/bench_data.py                # 300 trials of about 350-1,900 bins
    python tools/bench_data.py --short        # b2t-synth's default, shorter trials
    python tools/bench_data.py --short --paths "b2t loader" --paths "no checks"   # what the row checks cost
"""

from __future__ import annotations

import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import click
import h5py
import torch
import webdataset as wds
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

from b2t.config import Config, DataConfig, ModelConfig
from b2t.data import loader
from b2t.data.loader import StreamConfig, train_batches
from b2t.data.manifest import Manifest
from b2t.data.sample import decode_sample
from preprocess.synth import SynthSpec, write_dataset
from preprocess.writer import prepare_dataset

LONG = {"words": (4, 16), "bins_per_phoneme": (12, 32), "rest_bins": (20, 100)}
"""b2t-synth options for the real data's length range (about 350-1,900 bins, median ~1,050)."""

PATHS = ("b2t loader", "no checks", "wds stream", "reference")
CONSUMERS = ("read", "copy", "xla")
Composition = list[tuple[str, str, int]]  # per batch: (file relative to the source, trial group, day index)
Batches = Callable[[], Iterable[dict[str, torch.Tensor]]]


class WdsStream(torch.utils.data.IterableDataset):
    """The shards through WebDataset's streaming tar reader: payloads arrive as bytes."""

    def __init__(self, urls: list[str]):
        self.urls = urls

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for sample in wds.WebDataset(self.urls, shardshuffle=False, empty_check=False):
            yield decode_sample(sample)[0]


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


class Consumer:
    """What the loop does with each delivered batch; see the module docstring."""

    def __init__(self, kind: str):
        self.kind = kind
        self.staging = torch.empty(0, dtype=torch.uint8)
        self.device = None
        if kind == "xla":
            os.environ.setdefault("PJRT_DEVICE", "CPU")
            import torch_xla

            self.device, self.sync = torch_xla.device(), torch_xla.sync

    def __call__(self, batch: dict[str, torch.Tensor]) -> int:
        size = sum(t.nbytes for t in batch.values())
        if self.kind == "copy":
            if self.staging.numel() < size:
                self.staging = torch.empty(size, dtype=torch.uint8)
            offset = 0
            for t in batch.values():
                self.staging[offset:offset + t.nbytes].copy_(t.reshape(-1).view(torch.uint8))
                offset += t.nbytes
        elif self.kind == "xla":
            on_device = [t.to(self.device) for t in batch.values()]
            self.sync(wait=True)
            del on_device
        return size


def one_pass(batches: Batches, consume: Consumer) -> tuple[int, int]:
    """(batches, delivered tensor bytes) of one full pass, as a trainer's loop would pull them."""
    n, size = 0, 0
    for batch in batches():
        n += 1
        size += consume(batch)
    return n, size


def compositions(out: Path, manifest: Manifest) -> list[Composition]:
    """The trials of every train batch, in the loader's order, from the shards' own meta."""
    return [[(r["file"], r["group"], manifest.sessions.index(r["session"])) for r in batch.meta["rows"] if r]
            for batch in loader_batches(out, manifest)]


def loader_batches(out: Path, manifest: Manifest) -> Iterator:
    """Every train batch of every written composition once, through the trainer's stream."""
    n = sum(s.n_batches for s in manifest.shards_of("train"))
    return itertools.islice(train_batches(out, manifest, StreamConfig()), n)


def unchecked(batches: Batches) -> Batches:
    """`batches` with the reader's row checks (b2t.data.rows) switched off: the pair shows what they cost."""
    def run() -> Iterator[dict[str, torch.Tensor]]:
        saved = loader.row_problems
        loader.row_problems = lambda *args: []
        try:
            yield from batches()
        finally:
            loader.row_problems = saved
    return run


def make_paths(src: Path, out: Path) -> dict[str, Batches]:
    manifest = Manifest.load(out)
    wds_urls = [str(out / s.name) for e in manifest.epochs("train") for s in manifest.shards_of("train", e)]
    reference = ReferenceBatches(src, compositions(out, manifest))
    return {
        "b2t loader": lambda: (b.tensors for b in loader_batches(out, manifest)),
        "no checks": unchecked(lambda: (b.tensors for b in loader_batches(out, manifest))),
        "wds stream": lambda: DataLoader(WdsStream(wds_urls), batch_size=None, num_workers=0),
        "reference": lambda: DataLoader(reference, batch_size=None, num_workers=0),
    }


def peak_rss_mib(path: str, src: Path, out: Path) -> float:
    """Peak RSS of a child that makes one `copy` pass of `path` (or only imports, for 'idle').

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
        one_pass(make_paths(src, out)[path], Consumer("copy"))
    status = Path("/proc/self/status").read_text()
    print(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))  # KiB


def time_paths(paths: dict[str, Batches], consume: Consumer, reps: int) -> dict[str, tuple[float, float, int, int]]:
    """Per path: (median and best seconds per pass, batches, bytes); passes alternate the path order."""
    for batches in paths.values():  # warm-up: every source now sits in the page cache
        one_pass(batches, consume)
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    sizes: dict[str, tuple[int, int]] = {}
    for r in range(reps):
        for name in (list(paths) if r % 2 == 0 else list(reversed(paths))):
            t = time.perf_counter()
            sizes[name] = one_pass(paths[name], consume)
            seconds[name].append(time.perf_counter() - t)
    return {name: (statistics.median(seconds[name]), min(seconds[name]), *sizes[name]) for name in paths}


def benchmark(work: Path, spec: SynthSpec, config: Config, reps: int, workers: int, chosen: tuple[str, ...]) -> None:
    src, out = work / "src", work / "shards"
    t0 = time.perf_counter()
    synth = write_dataset(spec, src)
    synth_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    report = prepare_dataset(src, out, config, splits=["train"], workers=workers, progress=False)
    prep_s = time.perf_counter() - t0
    torch.set_num_threads(1)
    paths = {name: batches for name, batches in make_paths(src, out).items() if name in chosen}
    timed = {kind: time_paths(paths, Consumer(kind), reps) for kind in CONSUMERS}
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
    base = list(paths)[-1]  # the "vs" column's path: the reference unless --paths leaves it out
    print(f"reading: median (best) of {reps} paired passes over {timed['read'][base][2]} batches per consumer, "
          "one torch thread, warm page cache\n")
    print(f"{'path':<11}" + "".join(f"{kind + ' b/s (best)':>20} {'vs ' + base[:4]:>8} {'GB/s':>5}" for kind in CONSUMERS)
          + f"  peak RSS MiB (idle {rss['idle']:.0f})")
    for name in paths:
        row = f"{name:<11}"
        for kind in CONSUMERS:
            seconds, best, n, size = timed[kind][name]
            row += (f"{n / seconds:>11.1f} ({n / best:>6.1f}) {timed[kind][base][0] / seconds:>7.2f}x "
                    f"{size / seconds / 1e9:>5.2f}")
        print(row + f"  {rss[name]:>8.0f} ({rss[name] - rss['idle']:+.0f})")
    print("\nGB/s counts delivered tensor bytes (bf16 features for shards, f32 for the reference). "
          "read: the batch reaches the loop; copy: + every byte copied once on the host; "
          "xla: + moved to the XLA CPU device")


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
@click.option("--paths", "chosen", multiple=True, type=click.Choice(PATHS), default=PATHS, show_default=True,
              help="Paths to time (repeatable), e.g. only the loader with and without its row checks.")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path),
              help="Keep the data here (must not exist).")
@click.option("--child", type=click.Choice(["idle", *PATHS]), hidden=True)
@click.option("--src", type=click.Path(path_type=Path), hidden=True)
@click.option("--out", type=click.Path(path_type=Path), hidden=True)
def main(sessions: int, train_trials: int, short: bool, batch_size: int, epochs: int, reps: int, workers: int,
         chosen: tuple[str, ...], workdir: Path | None, child: str | None, src: Path | None, out: Path | None) -> None:
    """Benchmark reading shards vs per-batch HDF5 reading on b2t-synth data."""
    if child:
        run_child(child, src, out)
        return
    spec = SynthSpec(sessions=sessions, train_trials=train_trials, val_trials=0, test_trials=0, seed=1,
                     **({} if short else LONG))
    config = Config(data=DataConfig(n_buckets=4, batch_size=batch_size, days_per_batch=4, epochs=epochs,
                                    batches_per_shard=16), model=ModelConfig())
    if workdir:
        if workdir.exists():
            raise click.UsageError(f"--workdir {workdir} exists: the bench writes fresh data: remove it or name a new one")
        workdir.mkdir(parents=True)
        benchmark(workdir, spec, config, reps, workers, chosen)
    else:
        with tempfile.TemporaryDirectory(prefix="b2t-bench-") as tmp:
            benchmark(Path(tmp), spec, config, reps, workers, chosen)


if __name__ == "__main__":
    main()
