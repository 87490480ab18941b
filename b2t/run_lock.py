"""Locks on the folders b2t writes: one writer at a time, and no writer while someone reads.

A folder's lock is a file in it, held with flock(2), so the OS frees it when its holder
dies (kill -9 included) and a lock never outlives its process:
- `exclusive`: a writer's lock. b2t-preprocess holds OUT's (`.b2t-preprocess.lock`), each
  b2t-train process its RUN_DIR's (`.b2t-train.lock`, `.b2t-train.rank<r>.lock` for the
  other torchrun ranks): two trainers in one run directory logged every step twice and
  left whichever `last.safetensors` was written last.
- `shared`: a reader's lock on the same file. b2t-train and b2t-eval hold DATASET's for as
  long as they read it, so `b2t-preprocess --overwrite` refuses to replace shards under a
  run (which then trained on a mix of old and new shards), and a run refuses a dataset
  that a b2t-preprocess is writing. Any number of readers share it. A dataset the reader
  cannot write and that has no lock file yet is read without one (no b2t-preprocess of
  this user could write it either).
The holder of an exclusive lock writes its pid, host and start time into the file, so
the refusal says who has it. Lock files stay in their folder (removing one while another
process waits on it would let two processes hold "the" lock); a writer refused before it
wrote anything removes the one it created.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from b2t.errors import B2tError
from b2t.paths import MANIFEST_NAME

DATASET_LOCK = ".b2t-preprocess.lock"
RUN_LOCK = ".b2t-train.lock"


class LockedError(B2tError):
    """The folder is in use by another process; the message says by whom and what to do."""


def _holder(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError:
        text = ""
    return f" ({text})" if text else ""


def _try(f: IO, mode: int) -> bool:
    try:
        fcntl.flock(f, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextmanager
def exclusive(folder: Path, name: str, command: str, *, refused: type[BaseException] | None = None) -> Iterator[None]:
    """Hold `folder/name` exclusively for the block; LockedError naming the holder if another
    process holds it (a writer, or readers). `refused`: an exception type that, raised in the
    block, means nothing was written, so a lock file this call created is removed."""
    path = folder / name
    created = not path.exists()
    with open(path, "a+") as f:
        if not _try(f, fcntl.LOCK_EX):
            readers = _try(f, fcntl.LOCK_SH)  # only a writer's lock blocks a shared one
            if readers:
                fcntl.flock(f, fcntl.LOCK_UN)
                raise LockedError(f"{folder} is being read by a b2t-train or b2t-eval: wait until it finishes, "
                                  f"or write to another folder")
            raise LockedError(f"{folder} is in use by another {command}{_holder(path)}: wait until it finishes, "
                              f"or choose another folder")
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        f.flush()
        try:
            yield
        except BaseException as e:
            if created and refused is not None and isinstance(e, refused):
                path.unlink(missing_ok=True)
            raise


@contextmanager
def shared(folder: Path, name: str, writer: str) -> Iterator[None]:
    """Hold `folder/name` shared for the block (any number of readers; no writer): LockedError
    if `writer` (the command that writes the folder) holds it now."""
    path = folder / name
    try:
        f = open(path, "a+")
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        try:
            f = open(path)  # a read-only folder: its lock file, if there is one, opens for reading
        except FileNotFoundError:
            yield  # nobody can have locked it: no lock file, and none can be made
            return
    with f:
        if not _try(f, fcntl.LOCK_SH):
            raise LockedError(f"{folder} is being written by {writer}{_holder(path)}: wait until it finishes, "
                              "then run this again")
        yield


def reading_dataset(dataset: Path) -> contextlib.AbstractContextManager[None]:
    """The shared lock a reader (b2t-train, b2t-eval) holds on a b2t-preprocess output. A folder
    with no manifest is no dataset (yet): it gets no lock file, and the reader's own check
    refuses it (b2t-preprocess removes the manifest first and writes it last)."""
    if not (dataset / MANIFEST_NAME).exists():
        return contextlib.nullcontext()
    return shared(dataset, DATASET_LOCK, "a b2t-preprocess")


def run_lock_name(rank: int) -> str:
    """The lock file of one b2t-train process in its run directory (rank 0's is `RUN_LOCK`)."""
    return RUN_LOCK if rank == 0 else RUN_LOCK.replace(".lock", f".rank{rank}.lock")
