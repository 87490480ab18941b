"""One WebDataset sample = one whole batch, in a pickle-free encoding.

Keys of a sample: `batch.safetensors` (every contract field, bf16 stored natively so it
round-trips bit-exactly) and `meta.json` (bucket index, split, epoch and, per row, the
trial identity, or null for padding rows). The writer and the reader both go through
this module, and decoding never calls pickle.

Encoding uses the safetensors library. Decoding reads the format (a little-endian u64
header length, a JSON header, then raw little-endian data) itself, because the library
has no zero-copy load from a buffer: `safetensors.torch.load` copies every tensor, and
`safe_open` maps a whole file, not a member of a tar. Here the tensors view the sample's
own bytes, which for local shards are the page-cached shard itself (b2t.data.mapped_tar).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from safetensors.torch import save as st_save

from b2t.contract import FIELDS
from b2t.errors import DatasetError

TENSORS_KEY = "batch.safetensors"
META_KEY = "meta.json"

_DTYPES = {"BF16": torch.bfloat16, "F32": torch.float32, "I32": torch.int32, "I64": torch.int64, "BOOL": torch.bool}
"""safetensors dtype names this codec reads (the contract uses BF16, I32 and BOOL)."""
_NUMPY = {torch.float32: np.float32, torch.int32: np.int32, torch.int64: np.int64, torch.bool: np.bool_}


def encode_sample(key: str, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> dict[str, Any]:
    """The dict `webdataset.TarWriter.write` takes for one batch."""
    return {
        "__key__": key,
        TENSORS_KEY: st_save({name: tensors[name].contiguous() for name in FIELDS}),
        META_KEY: json.dumps(meta, sort_keys=True).encode(),
    }


def field_views(data: bytes | memoryview) -> dict[str, np.ndarray | torch.Tensor]:
    """The fields of safetensors `data`, viewing its bytes in place when they are writable:
    numpy arrays for every dtype numpy has (the reader's row checks read these), torch
    tensors for bf16, which numpy lacks. `tensor_views` makes them all tensors, sharing memory.

    Read-only data (bytes from a streaming reader) is copied once, so that every view
    handed on owns writable memory either way.
    """
    buffer = memoryview(data)
    if buffer.readonly:
        buffer = memoryview(bytearray(buffer))
    if len(buffer) < 8:
        raise DatasetError(f"safetensors data of {len(buffer)} bytes has no header")
    (n,) = struct.unpack_from("<Q", buffer)
    if 8 + n > len(buffer):
        raise DatasetError(f"safetensors header of {n} bytes runs past the {len(buffer)} bytes of data")
    header = json.loads(bytes(buffer[8 : 8 + n]))
    body = buffer[8 + n :]
    fields: dict[str, np.ndarray | torch.Tensor] = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(spec["dtype"])
        if dtype is None:
            raise DatasetError(f"tensor {name!r} has dtype {spec['dtype']!r}, not one of {sorted(_DTYPES)}")
        shape, (lo, hi) = [int(d) for d in spec["shape"]], spec["data_offsets"]
        count = math.prod(shape)
        if not 0 <= lo <= hi <= len(body) or hi - lo != count * dtype.itemsize:
            raise DatasetError(f"tensor {name!r}: bytes {lo}..{hi} of {len(body)} cannot hold {dtype} {shape}")
        if lo % dtype.itemsize:  # safetensors writes each tensor aligned to its dtype; compiled readers rely on it
            raise DatasetError(f"tensor {name!r}: {dtype} data at byte {lo} is not aligned to its {dtype.itemsize}-byte items")
        if dtype == torch.bfloat16:
            flat = torch.frombuffer(body[lo:hi], dtype=dtype) if hi > lo else torch.empty(0, dtype=dtype)
            fields[name] = flat.reshape(shape)
        else:
            fields[name] = np.frombuffer(body, dtype=_NUMPY[dtype], count=count, offset=lo).reshape(shape)
    return fields


def as_tensors(fields: Mapping[str, np.ndarray | torch.Tensor]) -> dict[str, torch.Tensor]:
    """`field_views`' fields as torch tensors on the same memory."""
    return {name: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for name, v in fields.items()}


def tensor_views(data: bytes | memoryview) -> dict[str, torch.Tensor]:
    """The tensors of safetensors `data`, viewing its bytes (see `field_views`)."""
    return as_tensors(field_views(data))


def decode_fields(sample: Mapping[str, Any]) -> tuple[dict[str, np.ndarray | torch.Tensor], dict[str, Any]]:
    """`field_views` and meta of one raw sample (bytes or memoryview values, undecoded)."""
    where = f"sample {sample.get('__key__')!r} from {sample.get('__url__')!r}"
    missing = [k for k in (TENSORS_KEY, META_KEY) if k not in sample]
    if missing:
        raise DatasetError(f"{where} lacks {missing}")
    try:
        return field_views(sample[TENSORS_KEY]), json.loads(bytes(sample[META_KEY]))
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise DatasetError(f"{where} does not decode: {e!r}") from None


def decode_sample(sample: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensors and meta of one raw sample."""
    fields, meta = decode_fields(sample)
    return as_tensors(fields), meta
