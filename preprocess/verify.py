"""`b2t-preprocess verify DIR`: does every shard still match the manifest, byte for byte and batch by batch?

A trainer that meets a bad shard hours into a run loses the run; checking sizes and
sha256 first (cheap) and then decoding every batch against the contract (thorough)
moves that failure to a command that names the shard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from b2t.contract import BucketShape, check_batch, check_rows
from b2t.data.manifest import Manifest, ShardEntry, shard_path, shard_problem
from b2t.data.mapped_tar import shard_samples
from b2t.data.rows import row_problems
from b2t.data.sample import decode_sample
from preprocess.writer import one_torch_thread


@dataclass
class VerifyReport:
    directory: Path
    shards: int = 0  # shards the manifest lists
    batches: int = 0  # batches decoded and checked
    errors: list[str] = field(default_factory=list)  # each names its shard
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def summary(self) -> str:
        verdict = "OK" if self.ok else f"FAILED ({len(self.errors)} problems)"
        lines = [f"{self.directory}: {verdict}: {self.shards} shards, {self.batches} batches decoded"]
        lines += [f"  error: {e}" for e in self.errors] + [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def batch_problems(tensors: dict[str, torch.Tensor], meta: dict[str, Any], shape: BucketShape,
                   n_sessions: int, patching: tuple[int, int] | None = None) -> list[str]:
    """What is wrong with one decoded batch beyond the contract's shapes and dtypes: its rows
    (`b2t.data.rows`, the reader's own checks; CTC feasibility too when `patching` is given),
    its meta rows and its features (finite, zero beyond each row's length)."""
    try:
        check_batch(tensors, shape)
    except ValueError as e:
        return [str(e)]
    valid, lengths = tensors["valid"], tensors["n_time_steps"]
    problems = row_problems(tensors, shape, n_sessions, patching)
    try:
        check_rows(meta["rows"], valid)
    except (ValueError, KeyError, TypeError) as e:
        problems.append(f"meta rows: {e}" if not isinstance(e, ValueError) else str(e))
    finite = torch.isfinite(tensors["features"])  # (B, T, F)
    if not bool(finite.all()):
        row, t, channel = (int(i) for i in (~finite).nonzero()[0])
        problems.append(f"features are NaN/Inf at row {row}, bin {t}, channel {channel}")
    time_mask = torch.arange(shape.T, dtype=torch.int32, device="cpu")[None, :] < lengths[:, None]  # (B, T)
    if bool(tensors["features"][~time_mask].any()):
        problems.append("features are nonzero beyond a row's n_time_steps")
    return problems


def _check_samples(path: Path, entry: ShardEntry, manifest: Manifest) -> tuple[int, list[str]]:
    """Decode every batch of one shard; (batches read, problems naming the shard and batch)."""
    problems, batches, trials = [], 0, 0
    for sample in shard_samples(str(path)):
        key = sample["__key__"]
        try:
            tensors, meta = decode_sample(sample)
            if not 0 <= meta["bucket"] < len(manifest.buckets):
                raise IndexError(f"bucket {meta['bucket']} is not one of the manifest's {len(manifest.buckets)}")
            shape = manifest.buckets[meta["bucket"]]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            problems.append(f"{entry.name}: batch {key} does not decode: {e}")
            continue
        batches += 1
        trials += int(tensors["valid"].sum())
        if (meta.get("split"), meta.get("epoch")) != (entry.split, entry.epoch):
            problems.append(f"{entry.name}: batch {key} says split {meta.get('split')} epoch {meta.get('epoch')}")
        found = batch_problems(tensors, meta, shape, len(manifest.sessions), manifest.patching())
        problems += [f"{entry.name}: batch {key}: {p}" for p in found]
    if (batches, trials) != (entry.n_batches, entry.n_trials):
        problems.append(f"{entry.name}: holds {batches} batches / {trials} trials, "
                        f"the manifest says {entry.n_batches} / {entry.n_trials}")
    return batches, problems


def verify(directory: str | Path, *, decode: bool = True) -> VerifyReport:
    """Check every shard the manifest lists (existence, size, sha256 and, with `decode`, each batch)."""
    directory = Path(directory)
    report = VerifyReport(directory)
    try:
        manifest = Manifest.load(directory)
    except (FileNotFoundError, ValueError) as e:
        report.errors.append(str(e))
        return report
    report.shards = len(manifest.shards)
    for entry in manifest.shards:
        try:
            path = shard_path(directory, entry)
            problem = shard_problem(directory, entry, sha256=True)
        except ValueError as e:  # a name that leads outside the directory
            problem = str(e)
        if problem is not None:
            report.errors.append(problem)
            continue
        if decode:
            try:
                with one_torch_thread():
                    batches, problems = _check_samples(path, entry, manifest)
            except (OSError, ValueError) as e:  # a tar that cannot be read at all
                batches, problems = 0, [f"{entry.name}: unreadable: {e}"]
            report.batches += batches
            report.errors += problems
    listed_names = {s.name for s in manifest.shards}
    for path in sorted(directory.glob("*.tar")):
        if path.name not in listed_names:
            report.warnings.append(f"{path.name}: on disk but not in the manifest (left from another run?)")
    return report
