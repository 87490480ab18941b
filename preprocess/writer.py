"""Batch plans -> WebDataset shards of whole fixed-shape batches, written so a crash costs nothing.

Crash safety, in three rules:
- a shard is written under a temp name in OUT, fsynced, then renamed, so a shard name on
  disk always holds a complete shard;
- the run state (`.b2t-preprocess.json`) says which run OUT belongs to (a digest of the
  config, the source fingerprints and every batch plan) and lists each finished shard's
  size and sha256; it is replaced atomically after every shard;
- the manifest is written last, and removed before any shard is (re)written, so it never
  names a shard that is missing, partial or about to change.
A re-run with the same inputs and config checks each listed shard (size and sha256) and
writes only the rest; with other inputs or config it refuses unless told to overwrite.
SIGTERM or Ctrl-C (`b2t.signals`) kills the workers and removes their temp files: the
listed shards are kept for the re-run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Executor
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from webdataset import TarWriter

from b2t import signals
from b2t.atomic import atomic_file, atomic_write_text, is_temp_name, remove_stale_temps
from b2t.config import Config
from b2t.contract import INDEX_DTYPE, BucketShape, RowMeta, check_batch, empty_batch
from b2t.data.manifest import FORMAT_VERSION, MANIFEST_NAME, SPLITS, Exclusion, Manifest, ShardEntry
from b2t.data.sample import encode_sample
from b2t.errors import B2tError
from b2t.progress import progress_bar
from b2t.run_lock import DATASET_LOCK, exclusive
from b2t.workers import run_jobs, worker_pool
from preprocess.batching import BatchPlan, Layout, plan_layout
from preprocess.hdf5_source import (
    discover_sessions,
    file_fingerprint,
    read_features,
    scan_file,
    session_warnings,
)
from preprocess.trials import DataError, TrialRef

STATE_NAME = ".b2t-preprocess.json"
LOCK_NAME = DATASET_LOCK
STATE_VERSION = 1
WRITE_BUFFER = 32 << 20
"""Bytes buffered per shard write: large writes keep the shard in large page-cache folios."""
SHARD_NAME = re.compile(r"(train-e\d{3}|val|test)-\d{5}\.tar")
"""Names b2t-preprocess gives shards: train-e000-00000.tar, val-00000.tar, test-00000.tar."""


class OutputDirError(B2tError):
    """OUT cannot be written as asked (another run's data, or another process writing it)."""


# --- one batch -----------------------------------------------------------------------

def batch_tensors(plan: BatchPlan, shape: BucketShape, features: Sequence[np.ndarray]) -> dict[str, torch.Tensor]:
    """The contract tensors of `plan`; `features` are its trials' float32 (n, F), in row order.

    Everything beyond a row's length, and every padding row, stays zero (`empty_batch`).
    """
    batch = empty_batch(shape)
    rows = iter(features)
    for i, ref in enumerate(plan.rows):
        if ref is None:
            continue
        n, n_labels = ref.n_time_steps, len(ref.labels)
        batch["features"][i, :n] = torch.from_numpy(next(rows))  # (n, F), rounded to bf16 by the copy
        batch["seq_class_ids"][i, :n_labels] = torch.tensor(ref.labels, dtype=INDEX_DTYPE, device="cpu")
        batch["n_time_steps"][i] = n
        batch["phone_seq_lens"][i] = n_labels
        batch["day_indices"][i] = ref.day_index
        batch["valid"][i] = True
    check_batch(batch, shape)
    return batch


def trial_identity(ref: TrialRef, files: Mapping[str, str]) -> RowMeta:
    return RowMeta(session=ref.session, block=ref.block, trial=ref.trial, group=ref.group,
                   file=files[ref.file], sentence=ref.sentence)


def batch_meta(plan: BatchPlan, index: int, files: Mapping[str, str]) -> dict[str, Any]:
    """Where a batch came from: bucket, split, epoch, its index in the split, each row's trial."""
    return {"bucket": plan.bucket, "split": plan.split, "epoch": plan.epoch, "index": index,
            "rows": [None if r is None else trial_identity(r, files) for r in plan.rows]}


def sample_key(split: str, epoch: int, index: int) -> str:
    return f"train-e{epoch:03d}-{index:06d}" if split == "train" else f"{split}-{index:06d}"


# --- one shard -----------------------------------------------------------------------

@dataclass(frozen=True)
class ShardTask:
    name: str
    split: str
    epoch: int
    first_index: int  # index of its first batch within its split (and epoch)
    plans: tuple[BatchPlan, ...]

    @property
    def n_trials(self) -> int:
        return sum(len(p.trials) for p in self.plans)


def shard_name(split: str, epoch: int, k: int) -> str:
    return f"train-e{epoch:03d}-{k:05d}.tar" if split == "train" else f"{split}-{k:05d}.tar"


def shard_tasks(plans: Sequence[BatchPlan], batches_per_shard: int) -> list[ShardTask]:
    """Consecutive plans of one split (and epoch), `batches_per_shard` to a shard."""
    groups: dict[tuple[str, int], list[BatchPlan]] = {}
    for p in plans:
        groups.setdefault((p.split, p.epoch), []).append(p)
    return [
        ShardTask(shard_name(split, epoch, start // batches_per_shard), split, epoch, start,
                  tuple(members[start:start + batches_per_shard]))
        for (split, epoch), members in groups.items()
        for start in range(0, len(members), batches_per_shard)
    ]


class _HashingFile:
    """A write-only file that hashes what passes through, so a shard is never read back to hash it."""

    def __init__(self, f: Any):
        self.f, self.sha, self.bytes = f, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.bytes += len(data)
        return self.f.write(data)


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Parallelism here is one shard per process; torch's own threads would only fight them
    (on a busy machine the f32 -> bf16 copy ran many times slower with more threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def write_shard(task: ShardTask, buckets: Sequence[BucketShape], out: Path, files: Mapping[str, str]) -> ShardEntry:
    """Read the task's trials from HDF5 and write its shard atomically; returns its manifest entry."""
    with one_torch_thread():
        return _write_shard(task, buckets, out, files)


def _write_shard(task: ShardTask, buckets: Sequence[BucketShape], out: Path, files: Mapping[str, str]) -> ShardEntry:
    with atomic_file(out / task.name, buffering=WRITE_BUFFER) as f:
        hashing = _HashingFile(f)
        with TarWriter(hashing, mtime=0.0) as tar:  # fixed mtime: same plan, same bytes
            for i, plan in enumerate(task.plans):
                index = task.first_index + i
                tensors = batch_tensors(plan, buckets[plan.bucket], read_features(plan.trials))
                tar.write(encode_sample(sample_key(plan.split, plan.epoch, index), tensors,
                                        batch_meta(plan, index, files)))
    return ShardEntry(name=task.name, split=task.split, epoch=task.epoch, n_batches=len(task.plans),
                      n_trials=task.n_trials, bytes=hashing.bytes, sha256=hashing.sha.hexdigest())


# --- scanning the sources ------------------------------------------------------------

@dataclass(frozen=True)
class Scan:
    sessions: list[str]  # day index order
    refs: list[TrialRef]
    exclusions: list[Exclusion]  # bad trials skipped by --skip-bad
    sources: list[dict[str, Any]]  # per HDF5 file: path relative to the root, bytes, sha256
    files: dict[str, str]  # TrialRef.file -> path relative to the root
    warnings: list[str]  # what was found and skipped, e.g. empty session folders


def _scan_job(job: tuple[str, str, str, int], skip_bad: bool) -> tuple[list[TrialRef], list[Exclusion], dict[str, Any]]:
    path, split, session, day = job
    refs, excluded = scan_file(Path(path), split, session, day, skip_bad=skip_bad)
    return refs, excluded, file_fingerprint(Path(path))


def scan_sources(root: Path, splits: Sequence[str], *, skip_bad: bool, executor: Executor | None,
                 progress: bool) -> Scan:
    """Validate every trial of the chosen splits (in parallel over files) and fingerprint each file."""
    sessions = discover_sessions(root)
    jobs = [(str(s.files[split]), split, s.session, day)
            for day, s in enumerate(sessions) for split in splits if split in s.files]
    for split in splits:
        if not any(job[1] == split for job in jobs):
            raise DataError(root, None, f"no session has a data_{split}.hdf5 (drop {split!r} from --splits?)")
    results: list[Any] = [None] * len(jobs)
    with progress_bar(total=len(jobs), unit="file", desc="scanning", disable=not progress) as bar:
        for i, result in run_jobs(executor, _scan_job, jobs, skip_bad):
            results[i] = result
            bar.update(1)
    files = {job[0]: os.path.relpath(job[0], root) for job in jobs}
    return Scan(
        sessions=[s.session for s in sessions],
        refs=[ref for refs, _, _ in results for ref in refs],
        exclusions=[Exclusion(files[e.file], e.trial, e.reason) for _, excluded, _ in results for e in excluded],
        sources=[{**fp, "path": files[job[0]]} for job, (_, _, fp) in zip(jobs, results)],
        files=files,
        warnings=session_warnings(root, sessions),
    )


# --- the run state -------------------------------------------------------------------

def run_identity(config: Config, splits: Sequence[str], scan: Scan, layout: Layout, tasks: Sequence[ShardTask]) -> str:
    """A digest of everything a shard's bytes depend on: format, config, sources and every plan row."""
    h = hashlib.sha256(json.dumps({
        "format": [FORMAT_VERSION, STATE_VERSION], "config": config.shard_shaping(), "splits": list(splits),
        "sessions": scan.sessions, "sources": scan.sources, "buckets": [b.to_dict() for b in layout.buckets],
    }, sort_keys=True).encode())
    for t in tasks:
        rows = [[p.bucket, [None if r is None else [scan.files[r.file], r.group] for r in p.rows]] for p in t.plans]
        h.update(json.dumps([t.name, rows]).encode())
    return h.hexdigest()


def _differences(state: Mapping[str, Any], config: Config, splits: Sequence[str]) -> list[str]:
    diffs = []
    old = state.get("config", {})
    for section, values in config.shard_shaping().items():
        for key, value in values.items():
            was = old.get(section, {}).get(key)
            if was != value:
                diffs.append(f"{section}.{key}: {was!r} then, {value!r} now")
    if list(state.get("splits", [])) != list(splits):
        diffs.append(f"splits: {state.get('splits')} then, {list(splits)} now")
    return diffs


def _read_state(out: Path) -> dict[str, Any] | None:
    path = out / STATE_NAME
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise OutputDirError(f"{path} is unreadable ({e}): pass --overwrite to start OUT afresh") from None
    return state if state.get("version") == STATE_VERSION else None


def _is_ours(name: str) -> bool:
    return bool(SHARD_NAME.fullmatch(name)) or name in (MANIFEST_NAME, STATE_NAME, LOCK_NAME) or is_temp_name(name)


def clear_output(out: Path) -> None:
    """Remove what b2t-preprocess writes (manifest first, so it never outlives its shards)."""
    (out / MANIFEST_NAME).unlink(missing_ok=True)
    for p in out.iterdir():
        if p.name != LOCK_NAME and _is_ours(p.name):
            p.unlink()


def check_output(out: Path, config: Config, splits: Sequence[str], *, overwrite: bool) -> None:
    """Refuse (before any slow work) an OUT that holds another run's data, unless overwriting."""
    state = _read_state(out)
    foreign = sorted(p.name for p in out.iterdir() if p.name != LOCK_NAME and not is_temp_name(p.name))
    if state is None and foreign and not overwrite:
        raise OutputDirError(f"{out} is not empty and holds no b2t-preprocess run ({', '.join(foreign[:3])}, ...): "
                             "choose an empty directory, or pass --overwrite to replace b2t files there")
    diffs = _differences(state, config, splits) if state is not None else []
    if diffs and not overwrite:
        raise OutputDirError(f"{out} holds a dataset made with another config ({'; '.join(diffs)}): "
                             "use another directory, or pass --overwrite to replace it")


def _finished_shards(out: Path, state: Mapping[str, Any] | None, identity: str, tasks: Sequence[ShardTask],
                     executor: Executor | None) -> dict[str, ShardEntry]:
    """Entries of the shards a previous run of this same plan finished and that still check out."""
    if state is None or state.get("identity") != identity:
        return {}
    wanted = {t.name for t in tasks}
    listed = [ShardEntry(**e) for name, e in state.get("shards", {}).items() if name in wanted]
    present = [e for e in listed if (out / e.name).is_file() and (out / e.name).stat().st_size == e.bytes]
    finished = {}
    for i, fingerprint in run_jobs(executor, file_fingerprint, [out / e.name for e in present]):
        if fingerprint["sha256"] == present[i].sha256:
            finished[present[i].name] = present[i]
    return finished


def _save_state(out: Path, config: Config, splits: Sequence[str], identity: str,
                done: Mapping[str, ShardEntry]) -> None:
    atomic_write_text(out / STATE_NAME, json.dumps({
        "version": STATE_VERSION, "identity": identity, "config": config.shard_shaping(), "splits": list(splits),
        "shards": {name: asdict(e) for name, e in sorted(done.items())},
    }, indent=1) + "\n")


# --- the whole run -------------------------------------------------------------------

@dataclass(frozen=True)
class PrepareReport:
    out: Path
    manifest: Manifest
    written: int  # shards written by this run
    reused: int  # shards a previous run finished, verified and kept
    scanned_trials: int
    scan_seconds: float
    write_seconds: float
    written_trials: int  # valid rows in the shards written by this run
    unchanged: bool = False  # a finished dataset of the same inputs: checked by hashes, nothing scanned


def prepare_dataset(src: Path, out: Path, config: Config, *, splits: Sequence[str] = SPLITS, skip_bad: bool = False,
                    workers: int = 1, overwrite: bool = False, progress: bool = True) -> PrepareReport:
    """Scan SRC, plan the batches and write (or finish) the shards and manifest in OUT."""
    splits = [s for s in SPLITS if s in splits]
    out.mkdir(parents=True, exist_ok=True)
    pool = worker_pool(workers) if workers > 1 else nullcontext()
    signals.on_stop(lambda: remove_stale_temps(out))  # a stop kills the workers: their shard temps go too
    signals.describe_stop(lambda name: f"stopped by {name} before any shard was written")
    with exclusive(out, LOCK_NAME, "b2t-preprocess", refused=OutputDirError), pool as executor:
        check_output(out, config, splits, overwrite=overwrite)
        t0 = time.perf_counter()
        kept = unchanged_dataset(src, out, config, splits, skip_bad=skip_bad)
        if kept is not None:
            remove_stale_temps(out)  # left by a run that was killed mid-write
            return PrepareReport(out=out, manifest=kept, written=0, reused=len(kept.shards), scanned_trials=0,
                                 scan_seconds=time.perf_counter() - t0, write_seconds=0.0, written_trials=0,
                                 unchanged=True)
        scan = scan_sources(src, splits, skip_bad=skip_bad, executor=executor, progress=progress)
        layout = plan_layout(scan.refs, config.data, config.model, skip_bad=skip_bad)
        tasks = shard_tasks(layout.plans, config.data.batches_per_shard)
        identity = run_identity(config, splits, scan, layout, tasks)
        state = _read_state(out)
        if state is not None and state.get("identity") != identity and not overwrite:
            raise OutputDirError(f"{out} holds a dataset made from other source files or another plan "
                                 "(same config): use another directory, or pass --overwrite to replace it")
        if overwrite and (state is None or state.get("identity") != identity):
            clear_output(out)
            state = None
        remove_stale_temps(out)  # left by a run that was killed mid-write
        done = _finished_shards(out, state, identity, tasks, executor)
        scan_seconds = time.perf_counter() - t0

        pending = [t for t in tasks if t.name not in done]
        signals.describe_stop(lambda name: f"stopped by {name}: {len(done)} of {len(tasks)} shards of {out} are "
                                           "written and kept; the same command writes the rest")
        if pending:
            (out / MANIFEST_NAME).unlink(missing_ok=True)
            _save_state(out, config, splits, identity, done)
        t1 = time.perf_counter()
        with progress_bar(total=sum(t.n_trials for t in pending), unit="trial", desc="writing",
                          disable=not progress) as bar:
            for i, entry in run_jobs(executor, write_shard, pending, layout.buckets, out, scan.files):
                done[entry.name] = entry
                _save_state(out, config, splits, identity, done)
                bar.update(pending[i].n_trials)
        write_seconds = time.perf_counter() - t1
        manifest = build_manifest(config, scan, layout, [done[t.name] for t in tasks])
        if not _same_manifest(out, manifest):
            manifest.save(out)  # last: every shard it names is complete and hashed
    return PrepareReport(out=out, manifest=manifest, written=len(pending), reused=len(tasks) - len(pending),
                         scanned_trials=len(scan.refs), scan_seconds=scan_seconds, write_seconds=write_seconds,
                         written_trials=sum(t.n_trials for t in pending))


def unchanged_dataset(src: Path, out: Path, config: Config, splits: Sequence[str], *,
                      skip_bad: bool) -> Manifest | None:
    """OUT's manifest when a finished run made it from exactly these inputs: the same config,
    splits and sessions, every source file the same (path, size, sha256) and every shard as
    listed (size, sha256). A re-run then takes as long as hashing the files, not validating
    every trial again (33 s for the realistic demo data, 360 trials on 2 cores). None when
    anything differs, and when trials were excluded without --skip-bad now (the scan decides
    whether they still are bad)."""
    state = _read_state(out)
    try:
        manifest = Manifest.load(out)
    except (FileNotFoundError, ValueError):
        return None
    same_config = json.dumps(manifest.config, sort_keys=True) == json.dumps(config.shard_shaping(), sort_keys=True)
    if state is None or list(state.get("splits", [])) != list(splits) or not same_config:
        return None
    if manifest.exclusions and not skip_bad:
        return None
    sessions = discover_sessions(src)
    if [s.session for s in sessions] != manifest.sessions or session_warnings(src, sessions) != manifest.warnings:
        return None
    files = [s.files[split] for s in sessions for split in splits if split in s.files]
    if [os.path.relpath(f, src) for f in files] != [s["path"] for s in manifest.sources]:
        return None
    if any(f.stat().st_size != s["bytes"] for f, s in zip(files, manifest.sources)):
        return None
    if any(file_fingerprint(f)["sha256"] != s["sha256"] for f, s in zip(files, manifest.sources)):
        return None
    return None if manifest.shard_problems(out, tuple(splits), sha256=True) else manifest


def build_manifest(config: Config, scan: Scan, layout: Layout, shards: Sequence[ShardEntry]) -> Manifest:
    splits = {
        split: {**stats.to_dict(), "epochs": config.data.epochs if split == "train" else 1,
                "n_shards": sum(s.split == split for s in shards)}
        for split, stats in layout.stats.items()
    }
    planned = [Exclusion(scan.files[e.file], e.trial, e.reason) for e in layout.exclusions]
    return Manifest(sessions=scan.sessions, buckets=layout.buckets, shards=list(shards), splits=splits,
                    sources=scan.sources, config=config.shard_shaping(), exclusions=scan.exclusions + planned,
                    warnings=scan.warnings)


def _same_manifest(out: Path, manifest: Manifest) -> bool:
    try:
        return Manifest.load(out).to_json() == manifest.to_json()
    except (FileNotFoundError, ValueError):
        return False
