"""The zero-copy shard path: same samples as WebDataset, same tensors as safetensors, clear errors."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
import webdataset as wds
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from b2t.data.mapped_tar import shard_samples
from b2t.data.sample import TENSORS_KEY, decode_sample, tensor_views

DTYPES = (torch.bfloat16, torch.float32, torch.int32, torch.int64, torch.bool)


@st.composite
def tensor_dicts(draw) -> dict[str, torch.Tensor]:
    names = draw(st.lists(st.text("abcdefgh_", min_size=1, max_size=8), min_size=1, max_size=5, unique=True))
    out = {}
    for name in names:
        shape = draw(st.lists(st.integers(0, 5), min_size=0, max_size=3))
        seed = draw(st.integers(0, 2**31 - 1))
        values = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 1000
        out[name] = values.to(draw(st.sampled_from(DTYPES)))
    return out


@given(tensor_dicts())
def test_tensor_views_equal_the_safetensors_library(tensors):
    data = st_save(tensors)
    ours, theirs = tensor_views(data), st_load(data)
    assert ours.keys() == theirs.keys()
    for name, t in theirs.items():
        assert ours[name].dtype == t.dtype and ours[name].shape == t.shape
        assert torch.equal(_bits(ours[name]), _bits(t))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def _first_shard(shards: Path) -> Path:
    return sorted(shards.glob("train-*.tar"))[0]


def test_mapped_samples_equal_webdatasets_own_reading(tiny_dataset):
    path = str(_first_shard(tiny_dataset[1]))
    ours = list(shard_samples(path))
    theirs = list(wds.WebDataset(path, shardshuffle=False, empty_check=False))
    assert [s["__key__"] for s in ours] == [s["__key__"] for s in theirs] and len(ours) > 1
    for a, b in zip(ours, theirs):
        assert {k for k in a if not k.startswith("__")} == {k for k in b if not k.startswith("__")}
        assert all(bytes(a[k]) == b[k] for k in a if not k.startswith("__"))


def test_batches_are_writable_views_that_never_write_the_shard(tiny_dataset, tmp_path):
    path = tmp_path / "copy.tar"
    shutil.copy(_first_shard(tiny_dataset[1]), path)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    tensors, _ = decode_sample(next(shard_samples(str(path))))
    tensors["features"].fill_(7.0)  # copy-on-write: private to this process
    assert bool((tensors["features"] == 7.0).all())
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    fresh, _ = decode_sample(next(shard_samples(str(path))))
    assert not bool((fresh["features"] == 7.0).all())


def test_a_truncated_shard_is_refused_naming_it(tiny_dataset, tmp_path):
    data = _first_shard(tiny_dataset[1]).read_bytes()
    path = tmp_path / "cut.tar"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"{path}: .*(truncated|not a readable tar)"):
        list(shard_samples(str(path)))


@pytest.mark.parametrize("content", [b"", b"not a tar at all" * 64])
def test_a_file_that_is_not_a_tar_is_refused_naming_it(tmp_path, content):
    path = tmp_path / "bad.tar"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=rf"{path}: not a readable tar shard"):
        list(shard_samples(str(path)))


def test_a_bad_safetensors_header_names_the_sample_and_shard(tiny_dataset):
    path = str(_first_shard(tiny_dataset[1]))
    sample = next(shard_samples(path))
    data = bytearray(sample[TENSORS_KEY])
    (n,) = struct.unpack_from("<Q", data)
    header = json.loads(bytes(data[8 : 8 + n]))
    header["features"]["data_offsets"][1] += 2  # one bf16 more than the shape holds
    blob = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    assert len(blob) == n
    data[8 : 8 + n] = blob
    with pytest.raises(ValueError, match=rf"sample '{sample['__key__']}' from '{path}' does not decode: .*features"):
        decode_sample({**sample, TENSORS_KEY: memoryview(data)})


def test_a_tensor_not_aligned_to_its_items_is_refused():
    """safetensors aligns each tensor to its dtype; an edited header that does not would hand the
    compiled row check (b2t.data.rows) an array it refuses with a TypeError instead of a message."""
    header = {"a": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]},
              "b": {"dtype": "I32", "shape": [1], "data_offsets": [2, 6]}}
    blob = json.dumps(header).encode()
    with pytest.raises(ValueError, match=r"tensor 'b': torch.int32 data at byte 2 is not aligned to its 4-byte items"):
        tensor_views(struct.pack("<Q", len(blob)) + blob + bytes(6))
