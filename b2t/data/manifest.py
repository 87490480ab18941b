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
from b2t.config import SHARD_SHAPING_MODEL_KEYS
from b2t.contract import FIELDS, BucketShape
from b2t.errors import DatasetError, MissingInput
from b2t.paths import MANIFEST_NAME, file_kind, not_regular

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

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or self.name in ("", ".", "..") or "/" in self.name or "\\" in self.name:
            raise DatasetError(f"shard name {self.name!r} is not a file name inside the dataset directory")
        if self.split not in SPLITS:
            raise DatasetError(f"shard {self.name}: split {self.split!r} is not one of {', '.join(SPLITS)}")
        for key in ("epoch", "n_batches", "n_trials", "bytes"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise DatasetError(f"shard {self.name}: {key} is {value!r}, expected an integer >= 0")
        if not isinstance(self.sha256, str):
            raise DatasetError(f"shard {self.name}: sha256 is {self.sha256!r}, expected a hex string")


def shard_path(root: str | Path, entry: ShardEntry) -> Path:
    """Where `entry` lives: inside `root`'s tree once every link is resolved (a link to a file in
    a sub-folder is fine), else ValueError (a manifest never points the reader at another
    directory's files)."""
    root = Path(root)
    path = root / entry.name
    resolved, inside = path.resolve(), root.resolve()
    if resolved == inside or not resolved.is_relative_to(inside):
        raise DatasetError(f"{path} resolves to {resolved}, outside the dataset directory {inside}: "
                           "a manifest names only shards inside its own directory; re-run b2t-preprocess")
    return path


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
    path = shard_path(root, entry)
    if not path.exists():
        return f"{entry.name}: missing"
    if (kind := file_kind(path)) != "a regular file":
        return f"{entry.name}: is {kind}, expected a shard file"
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

    def identity(self) -> str:
        """sha256 of what the batches are: sessions, buckets and every shard's name and digest. A
        run records it so that `--resume` never continues on other data."""
        data = [self.sessions, [b.to_dict() for b in self.buckets], [[s.name, s.sha256] for s in self.shards]]
        return hashlib.sha256(json.dumps(data).encode()).hexdigest()

    def patching(self) -> tuple[int, int]:
        """(patch_size, patch_stride) the buckets were aligned to (the manifest's model section)."""
        model = self.config.get("model") if isinstance(self.config, dict) else None
        size, stride = (model.get("patch_size"), model.get("patch_stride")) if isinstance(model, dict) else (None, None)
        if not (isinstance(size, int) and isinstance(stride, int) and 1 <= stride <= size):
            raise DatasetError(f"model.patch_size={size!r}, patch_stride={stride!r}: expected integers, 1 <= stride <= size")
        return size, stride

    def check_patching(self, model: Any) -> None:
        """The `model` config section's (a ModelConfig) patching must be the one the buckets
        were aligned to (`patching`, the one reader of the manifest's model section)."""
        used = dict(zip(SHARD_SHAPING_MODEL_KEYS, self.patching(), strict=True))
        for key in SHARD_SHAPING_MODEL_KEYS:
            if used[key] != getattr(model, key):
                raise DatasetError(
                    f"model.{key}={getattr(model, key)} but the shards were bucketed for {key}={used[key]}: "
                    "re-run b2t-preprocess with this config or use the config the shards were made with")

    def check_start_cut(self, max_start_cut: int) -> None:
        """augment.max_start_cut must leave trials of the shortest bucket something to train on
        (a cut of every bin trained on empty rows without a word)."""
        shortest = min((b.T for b in self.buckets), default=None)
        if shortest is not None and max_start_cut >= shortest:
            raise DatasetError(f"augment.max_start_cut={max_start_cut} cuts whole trials: the shortest bucket holds "
                               f"trials of at most {shortest} bins; choose a cut of a few bins (the baseline's is 2)")

    def config_differences(self, data: Any) -> list[str]:
        """A note when the `data` config section (a DataConfig) differs from the one the shards
        were made with: the trainer reads batches as written, so the shards' values win."""
        made = self.config.get("data", {})
        now = asdict(data)
        keys = [k for k in now if k in made and made[k] != now[k]]
        if not keys:
            return []
        return [f"the shards were made with {', '.join(f'data.{k}={made[k]!r}' for k in keys)}; the config says "
                f"{', '.join(f'{now[k]!r}' for k in keys)}: the shards' values are the ones that train (the data "
                "section only steers b2t-preprocess; re-run it to change them)"]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Manifest:
        if not isinstance(d, dict):
            raise DatasetError(f"the top level is a JSON {type(d).__name__}, expected an object")
        if d.get("version") != FORMAT_VERSION:
            raise DatasetError(f"manifest format version {d.get('version')!r} is not {FORMAT_VERSION}: "
                               "re-run b2t-preprocess")
        for key in ("sessions", "buckets", "shards", "exclusions", "warnings"):  # list() reads a string as letters
            if not isinstance(d.get(key, []), list):
                raise DatasetError(f"{key} is a JSON {type(d[key]).__name__}, expected a list")
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
        if not m.sessions or not all(isinstance(x, str) for x in m.sessions) or len(set(m.sessions)) != len(m.sessions):
            raise DatasetError("sessions must be a non-empty list of distinct session names")
        if not all(isinstance(x, dict) for x in (m.splits, m.config)):
            raise DatasetError("splits and config must be JSON objects")
        m.patching()  # the model section the buckets were aligned to, read by every run
        m.check_listing()
        if d.get("fields", {}) and {k: v["dtype"] for k, v in d["fields"].items()} != m.dtypes():
            raise DatasetError("manifest field dtypes differ from this b2t's batch contract: re-run b2t-preprocess")
        return m

    def check_listing(self) -> None:
        """Each shard listed once, and each split's shards holding the batches its stats count:
        a shard listed twice trained twice as often, and b2t-train read it without a word."""
        names = [s.name for s in self.shards]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise DatasetError(f"shard {twice[0]} is listed {names.count(twice[0])} times")
        for split, stats in self.splits.items():
            listed = sum(s.n_batches for s in self.shards_of(split))
            if listed != stats["n_batches"]:
                raise DatasetError(f"split {split}: its shards hold {listed} batches, its stats say {stats['n_batches']}")

    def save(self, directory: str | Path) -> Path:
        """Write atomically (temp file + rename), so readers see the old or the new manifest."""
        return atomic_write_text(Path(directory) / MANIFEST_NAME, json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> Manifest:
        path = Path(directory) / MANIFEST_NAME
        if not path.exists():
            raise MissingInput(f"{path} not found: run b2t-preprocess first (or it did not finish)")
        if (why := not_regular(path)) is not None:
            raise DatasetError(f"{why}: expected a b2t manifest")
        try:
            return cls.from_json(json.loads(path.read_bytes()))
        except UnicodeDecodeError:
            raise DatasetError(f"{path} is not a valid b2t manifest: not UTF-8 JSON text") from None
        except (KeyError, TypeError, AttributeError, ValueError) as e:  # ValueError covers JSONDecodeError
            what = f"missing key {e}" if isinstance(e, KeyError) else str(e)
            raise DatasetError(f"{path} is not a valid b2t manifest: {what}") from None

    def shards_of(self, split: str, epoch: int | None = None) -> list[ShardEntry]:
        return [s for s in self.shards if s.split == split and (epoch is None or s.epoch == epoch)]

    def shard_problems(self, root: str | Path, splits: tuple[str, ...] = SPLITS, *, sha256: bool) -> list[str]:
        """What is wrong on disk with the shards of `splits` (see `shard_problem`), one line each."""
        found = (shard_problem(root, s, sha256=sha256) for s in self.shards if s.split in splits)
        return [p for p in found if p is not None]

    def epochs(self, split: str = "train") -> list[int]:
        return sorted({s.epoch for s in self.shards_of(split)})
