"""One WebDataset sample = one whole batch, in a pickle-free encoding.

Keys of a sample: `batch.safetensors` (every contract field, bf16 stored natively so it
round-trips bit-exactly) and `meta.json` (bucket index, split, epoch and, per row, the
trial identity, or null for padding rows). The writer and the reader both go through
this module, and decoding never calls pickle.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from b2t.contract import FIELDS

TENSORS_KEY = "batch.safetensors"
META_KEY = "meta.json"


def encode_sample(key: str, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> dict[str, Any]:
    """The dict `webdataset.TarWriter.write` takes for one batch."""
    return {
        "__key__": key,
        TENSORS_KEY: st_save({name: tensors[name].contiguous() for name in FIELDS}),
        META_KEY: json.dumps(meta, sort_keys=True).encode(),
    }


def decode_sample(sample: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensors and meta of one raw sample (bytes values, as WebDataset yields them undecoded)."""
    try:
        tensors = st_load(bytes(sample[TENSORS_KEY]))
        meta = json.loads(sample[META_KEY])
    except KeyError as e:
        raise ValueError(f"sample {sample.get('__key__')!r} from {sample.get('__url__')!r} lacks {e}") from None
    return tensors, meta
