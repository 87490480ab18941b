"""Shards -> batches through WebDataset with `batch_size=None`: a sample already is a batch.

The order of train batches is a pure function of (seed, pass, rank), so a resumed run
skips exactly the batches it has consumed and sees the same stream as an uninterrupted
one. Pass p reads the manifest's train composition `p % epochs` with its shards in a
seeded order, then shuffles batches in a seeded buffer. Each host (rank of world) reads
every world-th shard of that order (the same order on every host, since it depends on the
seed and pass only), so the hosts together read each shard of a pass exactly once; each
loader worker reads its share of those (`wds.split_by_worker`). Val and test are split
the same way, in manifest order. The tar stage is `mapped_tar_samples`: shards are read
in place from the page cache instead of streamed through Python copies (see its module).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import resource
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import webdataset as wds
from torch.utils.data import DataLoader

from b2t.contract import FIELDS, Batch, check_batch
from b2t.data.manifest import Manifest, ShardEntry, shard_path
from b2t.data.mapped_tar import mapped_tar_samples
from b2t.data.rows import compiled_checks, row_problems
from b2t.data.sample import as_tensors, decode_fields
from b2t.errors import B2tError, DatasetError


@dataclass(frozen=True)
class StreamConfig:
    seed: int = 0
    shuffle_buffer: int = 1  # batches held for shuffling; 1 = manifest order
    num_workers: int = 0
    rank: int = 0  # this host (or torchrun process) among `world` readers
    world: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ValueError(f"reader rank {self.rank} is not in 0..world-1 for world {self.world}")


class _Decoder:
    """Picklable decode stage (runs in loader workers) that also enforces the contract: shapes
    and dtypes, and every row's lengths, labels and day index (`b2t.data.rows`)."""

    def __init__(self, manifest: Manifest):
        self.buckets = manifest.buckets
        self.n_sessions = len(manifest.sessions)
        self.patching = manifest.patching()
        compiled_checks()  # in the main process: forked workers inherit the compiled checks

    def __call__(self, sample: dict[str, Any]) -> Batch:
        fields, meta = decode_fields(sample)
        tensors = as_tensors(fields)
        try:
            bucket = meta.get("bucket") if isinstance(meta, dict) else None
            if not isinstance(bucket, int) or not 0 <= bucket < len(self.buckets):
                raise DatasetError(f"meta bucket {bucket!r} is not an index into the manifest's {len(self.buckets)} buckets")
            check_batch(tensors, self.buckets[bucket])
            if problems := row_problems(fields, self.buckets[bucket], self.n_sessions, self.patching):
                raise DatasetError("; ".join(problems) + ": run b2t-preprocess verify on the dataset, then rewrite it")
        except ValueError as e:
            raise DatasetError(f"{sample.get('__url__')}: sample {sample.get('__key__')}: {e}") from None
        return Batch(bucket, tensors, meta)


def pass_shards(manifest: Manifest, split: str, pass_index: int, cfg: StreamConfig) -> list[ShardEntry]:
    """The shards this rank reads in pass `pass_index` of `split` (train: seeded order)."""
    if split == "train":
        epochs = manifest.epochs("train")
        if not epochs:
            raise DatasetError("the dataset has no train shards: preprocess with the train split")
        shards = manifest.shards_of("train", epochs[pass_index % len(epochs)])
        random.Random(f"{cfg.seed}:{pass_index}").shuffle(shards)
    else:
        shards = manifest.shards_of(split)
        if not shards:
            raise DatasetError(f"the dataset has no {split} shards: preprocess with the {split} split")
    if len(shards) < cfg.world:
        raise DatasetError(
            f"{len(shards)} {split} shards cannot feed {cfg.world} hosts: "
            "preprocess with fewer batches_per_shard so shards outnumber hosts"
        )
    return shards[cfg.rank :: cfg.world]


PREFETCH = 2
"""Batches each loader worker keeps in flight (torch's `prefetch_factor` default)."""


def fds_needed(workers: int) -> int:
    """File descriptors a stream with `workers` loader workers may hold at once: each batch
    in flight holds one per tensor (torch shares them through fds), a train and a val stream
    can be open together, and the consumer holds a batch or two."""
    return 2 * workers * PREFETCH * len(FIELDS) + 2 * len(FIELDS)


def check_open_files(workers: int) -> None:
    """Make room for `workers` loader workers' file descriptors (the soft limit raised to the
    hard one), or a B2tError saying how: out of descriptors, torch's fd sharing printed
    `OSError: [Errno 24]` from a queue thread and the loader waited for ever."""
    if workers == 0:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > soft):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    in_use = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0
    need = fds_needed(workers)
    if soft != resource.RLIM_INFINITY and soft - in_use < need:
        raise B2tError(f"the open-file limit (ulimit -n) is {soft} with {in_use} files open, and {workers} "
                       f"loader workers need about {need} more: raise it (ulimit -n 4096) or set train.num_workers=0")


def _read(root: Path, manifest: Manifest, shards: list[ShardEntry], cfg: StreamConfig, shuffle_seed: str) -> Iterator[Batch]:
    stages: list[Any] = [
        wds.SimpleShardList([str(shard_path(root, s)) for s in shards]),
        wds.split_by_worker,
        mapped_tar_samples,
    ]
    if cfg.shuffle_buffer > 1:
        stages.append(wds.shuffle(cfg.shuffle_buffer, initial=cfg.shuffle_buffer, seed=shuffle_seed))
    stages.append(wds.map(_Decoder(manifest)))
    workers = min(cfg.num_workers, len(shards))
    check_open_files(workers)
    loader = DataLoader(
        wds.DataPipeline(*stages),
        batch_size=None,
        num_workers=workers,
        prefetch_factor=PREFETCH if workers else None,
        collate_fn=None,
    )
    yield from loader


def train_batches(root: str | Path, manifest: Manifest, cfg: StreamConfig, *, start: int = 0) -> Iterator[Batch]:
    """Endless train stream; `start` batches (counted from the very first) are skipped."""
    root = Path(root)
    for p in itertools.count():
        shards = pass_shards(manifest, "train", p, cfg)
        n = sum(s.n_batches for s in shards)
        if start >= n:
            start -= n
            continue
        stream = _read(root, manifest, shards, cfg, shuffle_seed=f"{cfg.seed}:{p}:shuffle")
        yield from itertools.islice(stream, start, None)
        start = 0


def eval_batches(root: str | Path, manifest: Manifest, split: str, cfg: StreamConfig) -> Iterator[Batch]:
    """Every batch of `split` (val/test) once, in manifest order per worker."""
    unshuffled = dataclasses.replace(cfg, shuffle_buffer=1)
    yield from _read(Path(root), manifest, pass_shards(manifest, split, 0, unshuffled), unshuffled, "")
