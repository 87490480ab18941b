"""Atomic file writes: a reader sees the old file or the whole new one, never a part.

Every output b2t writes (shards, manifests, checkpoints, eval reports) goes through
`atomic_file`: a temp file in the target's directory, fsynced, given the permissions a
plain `open` would give (`mkstemp` makes it 0600), then renamed over the target.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

_TEMP_PREFIX, _TEMP_SUFFIX = ".", ".tmp"


def is_temp_name(name: str) -> bool:
    """Whether `name` is an `atomic_file` temp file (one a killed writer may leave behind)."""
    return name.startswith(_TEMP_PREFIX) and name.endswith(_TEMP_SUFFIX)


def remove_stale_temps(directory: Path) -> list[Path]:
    """Delete the temp files a killed writer left in `directory` (call before writing there)."""
    stale = [p for p in sorted(directory.iterdir()) if is_temp_name(p.name) and p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def _default_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextmanager
def _temp_beside(path: Path) -> Iterator[tuple[int, str]]:
    """(fd, name) of a new temp file in `path`'s directory, removed if the block raises."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{_TEMP_PREFIX}{path.name}.", suffix=_TEMP_SUFFIX)
    except OSError as e:  # name the output, not the temp; in a folder that exists, ENOENT is one that takes no file
        if e.errno == errno.ENOENT:  # (/proc): not "it does not exist"
            raise OSError(None, f"cannot create a file in {path.parent} ({e.strerror})", str(path)) from None
        raise OSError(e.errno, e.strerror, str(path)) from None
    try:
        yield fd, tmp
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:  # a write or fsync (a full disk) names no file
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise


@contextmanager
def atomic_file(path: Path, *, buffering: int = -1) -> Iterator[BinaryIO]:
    """A binary file that becomes `path` when the block exits cleanly (and is removed otherwise).

    `buffering` sets the write buffer: shards pass a large one, because the page cache keeps
    a file written in large writes in large folios, which map and copy about twice as fast
    on read (tools/bench_data.py).
    """
    with _temp_beside(path) as (fd, tmp):
        with os.fdopen(fd, "wb", buffering=buffering) as f:
            yield f
            f.flush()
            os.fchmod(f.fileno(), _default_mode())
            os.fsync(f.fileno())
        os.replace(tmp, path)


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temp path for another program to write; it becomes `path` when the block exits cleanly.

    For outputs that a subprocess writes by name (it may replace the empty temp file it is
    given); like `atomic_file`, a failure leaves the old `path` and no temp behind.
    """
    with _temp_beside(path) as (fd, tmp):
        os.close(fd)
        yield Path(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fchmod(fd, _default_mode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    with atomic_file(path) as f:
        f.write(data)
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())
