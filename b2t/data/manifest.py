"""`manifest.json`: what a preprocessed dataset holds, written last by the preprocessor.

The trainer reads the bucket table (to warm up every shape before the loop), the session
list (day index order, stored with checkpoints) and the shard list from here; `verify`
checks every shard's size and sha256 against it. A manifest exists only once every shard
it names is complete, so a manifest never points at a partial shard.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from b2t.atomic import atomic_write_text
from b2t.contract import FIELDS, BucketShape

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class ShardEntry:
    name: str  # file name inside the dataset directory
    split: str
    epoch: int  # train composition index; 0 for val/test
    n_batches: int
    n_trials: int  # valid rows
    bytes: int
    sha256: str


def file_sha256(path: str | Path) -> str:
    """sha256 of a file, streamed in 1 MiB reads."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def shard_problem(root: str | Path, entry: ShardEntry, *, sha256: bool) -> str | None:
    """What is wrong with one listed shard on disk (missing, size, and with `sha256` its
    digest), naming it; None when it matches the manifest."""
    path = Path(root) / entry.name
    if not path.is_file():
        return f"{entry.name}: missing"
    size = path.stat().st_size
    if size != entry.bytes:
        return f"{entry.name}: {size} bytes, the manifest says {entry.bytes}"
    if sha256 and (digest := file_sha256(path)) != entry.sha256:
        return f"{entry.name}: sha256 {digest[:16]}... differs from the manifest's {entry.sha256[:16]}..."
    return None


@dataclass(frozen=True)
class Exclusion:
    file: str
    trial: str  # HDF5 group name, e.g. trial_0007
    reason: str


@dataclass
class Manifest:
    sessions: list[str]  # day index order
    buckets: list[BucketShape]
    shards: list[ShardEntry]
    splits: dict[str, dict[str, Any]]  # per split: n_trials, n_batches, padding_fraction, ...
    sources: list[dict[str, Any]]  # per HDF5 file: path, bytes, sha256
    config: dict[str, Any]  # the data and model sections used
    exclusions: list[Exclusion] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # inputs skipped without being an error (empty folders)
    version: int = FORMAT_VERSION

    def dtypes(self) -> dict[str, str]:
        return {name: str(f.dtype).removeprefix("torch.") for name, f in FIELDS.items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "sessions": self.sessions,
            "buckets": [b.to_dict() for b in self.buckets],
            "fields": {name: {"dtype": dt, "dims": list(FIELDS[name].dims)} for name, dt in self.dtypes().items()},
            "shards": [asdict(s) for s in self.shards],
            "splits": self.splits,
            "sources": self.sources,
            "config": self.config,
            "exclusions": [asdict(e) for e in self.exclusions],
            "warnings": self.warnings,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Manifest:
        if d.get("version") != FORMAT_VERSION:
            raise ValueError(f"manifest format version {d.get('version')} is not {FORMAT_VERSION}: re-run b2t-preprocess")
        m = cls(
            sessions=list(d["sessions"]),
            buckets=[BucketShape.from_dict(b) for b in d["buckets"]],
            shards=[ShardEntry(**s) for s in d["shards"]],
            splits=d["splits"],
            sources=d["sources"],
            config=d["config"],
            exclusions=[Exclusion(**e) for e in d["exclusions"]],
            warnings=list(d.get("warnings", [])),
        )
        if d.get("fields", {}) and {k: v["dtype"] for k, v in d["fields"].items()} != m.dtypes():
            raise ValueError("manifest field dtypes differ from this b2t's batch contract: re-run b2t-preprocess")
        return m

    def save(self, directory: str | Path) -> Path:
        """Write atomically (temp file + rename), so readers see the old or the new manifest."""
        return atomic_write_text(Path(directory) / MANIFEST_NAME, json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> Manifest:
        path = Path(directory) / MANIFEST_NAME
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: run b2t-preprocess first (or it did not finish)")
        try:
            return cls.from_json(json.loads(path.read_text()))
        except (KeyError, TypeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path} is not a valid b2t manifest: {e}") from None

    def shards_of(self, split: str, epoch: int | None = None) -> list[ShardEntry]:
        return [s for s in self.shards if s.split == split and (epoch is None or s.epoch == epoch)]

    def shard_problems(self, root: str | Path, splits: tuple[str, ...] = SPLITS, *, sha256: bool) -> list[str]:
        """What is wrong on disk with the shards of `splits` (see `shard_problem`), one line each."""
        found = (shard_problem(root, s, sha256=sha256) for s in self.shards if s.split in splits)
        return [p for p in found if p is not None]

    def epochs(self, split: str = "train") -> list[int]:
        return sorted({s.epoch for s in self.shards_of(split)})
