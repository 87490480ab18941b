"""Reading the Brain-to-Text '25 HDF5 tree: find the sessions, validate every trial, re-read features.

The layout is docs/data-format.md. `scan_file` checks, for every trial, all that the
shard writer relies on (features included, read in chunks so a file never sits in memory
whole), so bad data is reported with its file and trial group before any shard is written,
never discovered half way or padded over. With `skip_bad` a bad trial becomes an
`Exclusion` that ends up in the manifest; nothing is dropped silently. A file that cannot be
read at all, or a split with no usable trial, is always an error.

Session identity: a session is a directory holding `data_{train,val,test}.hdf5`, named by the
directory (the day index is its position in the name-sorted list). Two directories with the
same name anywhere below the root are an error (their day index would be ambiguous), and so
is a trial whose `session` attribute names another session than its directory (the file was
moved or renamed, so which day it belongs to is unclear).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from b2t.contract import FEATURE_DIM, FEATURE_DTYPE, TRIAL_GROUP, trial_number
from b2t.data.manifest import SPLITS, Exclusion, file_sha256
from b2t.errors import UsageError
from b2t.paths import file_kind
from b2t.phonemes import SILENCE_ID
from b2t.text import normalize_text
from preprocess.trials import DataError, TrialRef

SPLIT_FILES: dict[str, str] = {split: f"data_{split}.hdf5" for split in SPLITS}
CHECK_ROWS = 2048
"""Feature rows read at a time by the NaN/Inf check (4 MiB of float32)."""


@dataclass(frozen=True)
class SessionFiles:
    session: str
    files: dict[str, Path]  # split -> path of its HDF5 file


def walk(root: Path) -> Iterator[tuple[Path, list[str], list[str]]]:
    """(folder, its sub-folder names, its file names) for `root` and every folder below it, in
    name order, following symlinked folders (a session folder may be a link to another disk)
    once: a folder reached twice (a link loop, or two links to one folder) is an error, never
    a silent skip or an endless walk."""
    reached: dict[str, Path] = {}
    for folder, dirs, files in os.walk(root, followlinks=True, onerror=_walk_error):
        real = os.path.realpath(folder)
        if real in reached:
            raise DataError(folder, None, f"leads to {real}, already reached as {reached[real]} (a link loop, or two "
                                          "links to one folder): keep one path to each session folder")
        reached[real] = Path(folder)
        dirs.sort()
        yield Path(folder), dirs, sorted(files)


def _walk_error(e: OSError) -> None:
    raise DataError(e.filename or "a folder", None, f"cannot be listed: {e.strerror or e}")


def discover_sessions(root: Path) -> list[SessionFiles]:
    """Every session directory below `root` (which may itself be one), sorted by name = day order."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(root, None, "is not a directory (expected the folder of t15.* session directories)")
    by_dir: dict[Path, dict[str, Path]] = defaultdict(dict)
    split_of = {name: split for split, name in SPLIT_FILES.items()}
    for folder, dirs, files in walk(root):
        for name in dirs:
            if name in split_of:  # else taken for an empty session folder, its split dropped with a misleading word
                raise DataError(folder / name, None, "is a folder: expected an HDF5 file")
        for name in files:
            if name.startswith("data_") and name.endswith(".hdf5"):
                if name not in split_of:
                    raise DataError(folder / name, None, f"unexpected file name: a session holds only {sorted(split_of)}")
                if (kind := file_kind(folder / name)) != "a regular file":  # a FIFO would block the reader for ever
                    raise DataError(folder / name, None, f"is {kind}, not a regular file: expected an HDF5 file")
                by_dir[folder][split_of[name]] = folder / name
    if not by_dir:
        raise DataError(root, None, f"no session found: no {'/'.join(SPLIT_FILES.values())} below it")
    sessions: dict[str, Path] = {}
    for directory in by_dir:
        if directory.name in sessions:
            raise DataError(
                directory, None, f"duplicate session name {directory.name!r}, also at {sessions[directory.name]}"
            )
        sessions[directory.name] = directory
    ordered = []
    for name in sorted(sessions):
        files = by_dir[sessions[name]]
        ordered.append(SessionFiles(name, {split: files[split] for split in SPLIT_FILES if split in files}))
    return ordered


def empty_folders(root: Path) -> list[Path]:
    """Folders below `root` that hold no session file and no folder: an empty session folder
    (a copy that did not finish, a day not downloaded), reported rather than skipped unseen."""
    root = Path(root)
    return [folder for folder, dirs, files in walk(root)
            if folder != root and not folder.name.startswith(".") and not dirs
            and not any(f in SPLIT_FILES.values() for f in files)]


def session_warnings(root: Path, sessions: Sequence[SessionFiles]) -> list[str]:
    """What the manifest records as found and not used: empty folders, and sessions with
    neither train nor val data (a day layer that no trial trains; its test trials are kept)."""
    folders = [f"{os.path.relpath(p, root)}: empty folder (no {'/'.join(SPLIT_FILES.values())}): skipped, "
               "no session made of it" for p in empty_folders(root)]
    untrained = [f"{s.session}: no {SPLIT_FILES['train']} and no {SPLIT_FILES['val']} (only "
                 f"{', '.join(SPLIT_FILES[k] for k in s.files)}): kept, but no trial trains or validates its day layer"
                 for s in sessions if not {"train", "val"} & set(s.files)]
    return folders + untrained


@contextmanager
def _open(path: Path) -> Iterator[h5py.File]:
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise DataError(path, None, f"cannot be read as HDF5 (missing, truncated or not HDF5): {e}") from None
    with f:
        yield f


def scan_file(
    path: Path, split: str, session: str, day_index: int, *, skip_bad: bool
) -> tuple[list[TrialRef], list[Exclusion]]:
    """Validate every trial of one split file; bad trials raise, or with `skip_bad` are excluded."""
    if split not in SPLIT_FILES:
        raise UsageError(f"split must be one of {list(SPLIT_FILES)}, got {split!r}")
    refs: list[TrialRef] = []
    excluded: list[Exclusion] = []
    with _open(path) as f:
        for name in _trial_names(f, path):
            try:
                refs.append(_scan_trial(f, path, name, split, session, day_index))
            except DataError as e:
                if not skip_bad:
                    raise
                excluded.append(Exclusion(str(path), name, e.problem))
            except (OSError, RuntimeError, KeyError) as e:  # h5py's errors for corrupt storage (KeyError: an
                # object header it cannot decode, "Unable to synchronously open object")
                raise DataError(path, name, f"cannot be read: {e}") from None
    if not refs:
        problem = f"all {len(excluded)} trials are bad" if excluded else "has no trial groups"
        raise DataError(path, None, f"empty {split} split: {problem}")
    return refs, excluded


def _trial_names(f: h5py.File, path: Path) -> list[str]:
    """The trial groups in trial order; any other top-level object is an error, not ignored."""
    seen: dict[int, str] = {}
    for name in f:
        if not TRIAL_GROUP.fullmatch(name):
            raise DataError(path, name, "unexpected top-level object (a file holds only trial_NNNN groups)")
        if (other := seen.setdefault(trial_number(name), name)) != name:  # trial_00 and trial_0000: one trial twice
            raise DataError(path, name, f"has the trial number of {other}: each trial group names one trial")
    return sorted(f, key=trial_number)


def _scan_trial(f: h5py.File, path: Path, name: str, split: str, session: str, day_index: int) -> TrialRef:
    def bad(problem: str) -> DataError:
        return DataError(path, name, problem)

    g = f[name]
    if not isinstance(g, h5py.Group):
        raise bad("is not a group")
    labelled = split != "test"
    datasets = ("input_features",) + (("seq_class_ids", "transcription") if labelled else ())
    attrs = ("n_time_steps", "session", "block_num", "trial_num") + (("seq_len", "sentence_label") if labelled else ())
    for ds in datasets:
        if not isinstance(g.get(ds), h5py.Dataset):
            raise bad(f"missing dataset {ds!r}")
    for attr in attrs:
        if attr not in g.attrs:
            raise bad(f"missing attribute {attr!r}")

    x = g["input_features"]
    if x.ndim != 2 or x.shape[1] != FEATURE_DIM or x.dtype.kind != "f":
        raise bad(f"input_features is {x.dtype} {list(x.shape)}, expected float [n_time_steps, {FEATURE_DIM}]")
    n = _int_attr(g, "n_time_steps", bad)
    if n != x.shape[0]:
        raise bad(f"n_time_steps attribute is {n} but input_features has {x.shape[0]} rows")
    if n < 1:
        raise bad("input_features has no rows")
    _check_finite(x, bad)
    if (named := _str_attr(g, "session", bad)) != session:
        raise bad(f"session attribute is {named!r} but the file is in session directory {session!r}")

    labels: tuple[int, ...] = ()
    sentence = None
    if labelled:
        ids = g["seq_class_ids"]
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise bad(f"seq_class_ids is {ids.dtype} {list(ids.shape)}, expected a 1-D integer array")
        seq_len = _int_attr(g, "seq_len", bad)
        if not 1 <= seq_len <= ids.shape[0]:
            raise bad(f"seq_len {seq_len} is outside 1..{ids.shape[0]} (the width of seq_class_ids)")
        valid = ids[:seq_len]
        wrong = np.flatnonzero((valid < 1) | (valid > SILENCE_ID))
        if wrong.size:
            raise bad(f"seq_class_ids[{wrong[0]}] is {valid[wrong[0]]}, outside the phoneme ids 1..{SILENCE_ID}")
        labels = tuple(int(v) for v in valid)
        sentence = _str_attr(g, "sentence_label", bad)
        if not normalize_text(sentence):
            raise bad(f"sentence_label {sentence!r} has no words, but seq_class_ids holds {seq_len} phonemes: "
                      "a labelled trial needs its sentence (WER is scored against it)")
    return TrialRef(
        file=str(path),
        group=name,
        split=split,
        session=session,
        day_index=day_index,
        block=_int_attr(g, "block_num", bad),
        trial=_int_attr(g, "trial_num", bad),
        n_time_steps=n,
        labels=labels,
        sentence=sentence,
    )


def _check_finite(x: h5py.Dataset, bad: Callable[[str], DataError]) -> None:
    """Every value finite as stored and after the cast to the shards' feature dtype (bf16):
    float64 1e300 or float32 3.4e38 are finite in the file but Inf in a shard."""
    for start in range(0, x.shape[0], CHECK_ROWS):
        rows = x[start : start + CHECK_ROWS]  # (rows, F), the file's dtype
        finite = np.isfinite(rows)
        if not finite.all():
            row, channel = np.argwhere(~finite)[0]
            raise bad(f"input_features has NaN/Inf at row {start + row}, channel {channel}")
        with np.errstate(over="ignore"):  # float64 -> float32 overflow is what is checked next
            stored = torch.from_numpy(np.asarray(rows, dtype=np.float32)).to(FEATURE_DTYPE)  # as the writer casts
        overflow = ~torch.isfinite(stored)
        if bool(overflow.any()):
            row, channel = (int(i) for i in overflow.nonzero()[0])
            raise bad(f"input_features at row {start + row}, channel {channel} is {rows[row, channel]:g}, "
                      f"beyond the range of {str(FEATURE_DTYPE).removeprefix('torch.')} (max "
                      f"{torch.finfo(FEATURE_DTYPE).max:.4g}), the dtype shards store: it would become Inf; "
                      "rescale the features")


def _int_attr(g: h5py.Group, name: str, bad: Callable[[str], DataError]) -> int:
    value = np.asarray(g.attrs[name])
    if value.size != 1 or value.dtype.kind not in "iu":
        raise bad(f"attribute {name!r} is {value.dtype} {list(value.shape)}, expected one integer")
    return int(value.reshape(()))


def _str_attr(g: h5py.Group, name: str, bad: Callable[[str], DataError]) -> str:
    value = g.attrs[name]
    try:
        if isinstance(value, bytes):
            value = value.decode("utf-8")
        elif isinstance(value, str):
            value.encode("utf-8")  # h5py hands undecodable bytes on as surrogate escapes
    except UnicodeError as e:
        raise bad(f"attribute {name!r} is not UTF-8 text ({e.reason} at character {e.start}: {value!r}): "
                  "re-encode it as UTF-8") from None
    if not isinstance(value, str):
        raise bad(f"attribute {name!r} is {type(value).__name__}, expected a string")
    return value


def read_features(refs: Sequence[TrialRef]) -> list[np.ndarray]:
    """Each trial's float32 (n_time_steps, F) features, in `refs` order; each file opened once."""
    out: dict[int, np.ndarray] = {}
    by_file: dict[str, list[int]] = defaultdict(list)
    for i, ref in enumerate(refs):
        by_file[ref.file].append(i)
    for file, indices in by_file.items():
        with _open(Path(file)) as f:
            for i in indices:
                ref = refs[i]
                try:
                    x = np.asarray(f[ref.group]["input_features"][()], dtype=np.float32)
                except (KeyError, OSError, RuntimeError) as e:
                    raise DataError(file, ref.group, f"cannot read input_features: {e}") from None
                if x.shape != (ref.n_time_steps, FEATURE_DIM):
                    raise DataError(
                        file,
                        ref.group,
                        f"input_features is {list(x.shape)} now, "
                        f"[{ref.n_time_steps}, {FEATURE_DIM}] when scanned: the file changed",
                    )
                out[i] = x
    return [out[i] for i in range(len(refs))]


def file_fingerprint(path: Path) -> dict[str, Any]:
    """`path` (as given), size and streamed sha256: what the manifest records per source file."""
    return {"path": str(path), "bytes": Path(path).stat().st_size, "sha256": file_sha256(path)}
