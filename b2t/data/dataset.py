"""A preprocessed dataset as a run reads it: opened and checked once, then asked for batches.

`Dataset.open(root, cfg)` does every check a run or an evaluation needs before its first
batch, in one place: the manifest loads (`Manifest.load`), its patching is the config's (the
buckets were aligned to it), the shards of the splits read are present with their manifest
sizes (and with `verify`, digests), and where the config's data section differs from the one
the shards were made with, a note says the shards' values train. From then on the dataset
travels as one value: its root, its manifest and its batches.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from b2t.config import Config
from b2t.contract import Batch, BucketShape
from b2t.data.loader import StreamConfig, eval_batches, pass_shards, train_batches
from b2t.data.manifest import Manifest, ShardEntry
from b2t.errors import DatasetError


@dataclass(frozen=True)
class Dataset:
    """A b2t-preprocess output at `root` and its manifest."""

    root: Path
    manifest: Manifest
    notes: list[str] = field(default_factory=list)  # what the caller should tell the user (config differences, ...)

    @classmethod
    def open(cls, root: str | Path, cfg: Config | None = None, *, splits: tuple[str, ...] = (),
             verify: bool = False) -> Dataset:
        """The dataset at `root`, checked for a run of `cfg` (patching) that reads `splits`
        (their shards present, sizes as listed; with `verify`, sha256 as listed too)."""
        root = Path(root)
        manifest = Manifest.load(root)
        notes = []
        if cfg is not None:
            manifest.check_patching(cfg.model)
            manifest.check_start_cut(cfg.augment.max_start_cut)
            notes += manifest.config_differences(cfg.data)
        t0 = time.perf_counter()
        problems = manifest.shard_problems(root, splits, sha256=verify) if splits else []
        if problems:
            raise DatasetError(f"{len(problems)} shards of {root} do not match its manifest ({'; '.join(problems[:3])}): "
                               f"run b2t-preprocess verify {root}, then rerun b2t-preprocess to rewrite them")
        if verify and splits:
            n = sum(len(manifest.shards_of(s)) for s in splits)
            notes.append(f"verified the sha256 of {n} shards in {time.perf_counter() - t0:.1f} s")
        return cls(root, manifest, notes)

    @property
    def sessions(self) -> list[str]:
        return self.manifest.sessions

    @property
    def buckets(self) -> list[BucketShape]:
        return self.manifest.buckets

    def identity(self) -> dict[str, str]:
        """What a checkpoint records of the data it was trained on (`--resume` checks it)."""
        return {"path": str(self.root), "identity": self.manifest.identity()}

    def has(self, split: str) -> bool:
        return bool(self.manifest.shards_of(split))

    def n_batches(self, split: str) -> int:
        return sum(s.n_batches for s in self.manifest.shards_of(split))

    def train_batches(self, cfg: StreamConfig, *, start: int = 0) -> Iterator[Batch]:
        """The endless train stream (`b2t.data.loader.train_batches`), `start` batches skipped."""
        return train_batches(self.root, self.manifest, cfg, start=start)

    def eval_batches(self, split: str, cfg: StreamConfig) -> Iterator[Batch]:
        """Every batch of `split` once (`b2t.data.loader.eval_batches`)."""
        return eval_batches(self.root, self.manifest, split, cfg)

    def first_pass(self, cfg: StreamConfig) -> list[ShardEntry]:
        """The train shards this reader takes in its first pass (recorded in a run's layout record)."""
        return pass_shards(self.manifest, "train", 0, cfg)

