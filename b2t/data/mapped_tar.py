"""Local shards -> WebDataset samples whose payloads are views of the memory-mapped tar.

WebDataset's `tarfile_to_samples` streams a tar through Python's tarfile, copying each
payload into bytes that the decoder copies again into tensors: about three copies of every
batch, which made reading our shards no faster than the baseline's HDF5 loader
(tools/bench_data.py). Shards are local, immutable files (written under a temp name, then
renamed), so here each is indexed once (tar headers only) and mapped copy-on-write, and
each payload is passed on as a memoryview of the mapping; `decode_sample` then builds the
tensors on those same bytes. A batch's bytes are first touched by whoever consumes them
(the host-to-device copy), straight from the page cache. Copy-on-write keeps the tensors
writable without ever writing to a shard. A mapping lives as long as a tensor views it.
"""

from __future__ import annotations

import mmap
import tarfile
from collections.abc import Iterable, Iterator
from typing import Any

from b2t.errors import DatasetError


def shard_samples(path: str) -> Iterator[dict[str, Any]]:
    """The samples of one tar shard, grouped by key as WebDataset groups them."""
    try:
        with tarfile.open(path, "r:") as tar:
            members = tar.getmembers()
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError, tarfile.TarError) as e:
        raise DatasetError(f"{path}: not a readable tar shard: {e}") from None
    view = memoryview(mapped)
    sample: dict[str, Any] = {}
    for member in members:
        if not member.isfile():
            raise DatasetError(f"{path}: tar member {member.name!r} is not a regular file")
        end = member.offset_data + member.size
        if end > len(view):
            raise DatasetError(f"{path}: tar member {member.name!r} ends at byte {end}, past the end "
                               f"of the {len(view)}-byte file (truncated?)")
        folder, slash, name = member.name.rpartition("/")
        base, _, ext = name.partition(".")  # WebDataset's rule: the key ends at the name's first dot
        key = folder + slash + base
        if sample.get("__key__") != key:
            if sample:
                yield sample
            sample = {"__key__": key, "__url__": path}
        if ext in sample:
            raise DatasetError(f"{path}: sample {key!r} holds {ext!r} twice")
        sample[ext] = view[member.offset_data : end]
    if sample:
        yield sample


def mapped_tar_samples(shards: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """WebDataset pipeline stage in `tarfile_to_samples`' slot: {'url': local path} -> samples."""
    for shard in shards:
        yield from shard_samples(shard["url"])
