"""Shards against their manifest: missing and resized ones cheaply, a flipped byte by sha256; a
config against the patching the shards were bucketed for."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from b2t.config import TINY_CONFIG, load_config
from b2t.data.dataset import Dataset
from b2t.data.manifest import Manifest
from b2t.errors import DatasetError


def test_shard_problems_name_each_bad_shard(tiny_dataset, tmp_path):
    _, shards = tiny_dataset
    root = tmp_path / "shards"
    shutil.copytree(shards, root)
    manifest = Manifest.load(root)
    assert manifest.shard_problems(root, sha256=True) == []
    missing, short, flipped = (s.name for s in manifest.shards_of("train")[:3])
    (root / missing).unlink()
    (root / short).write_bytes((root / short).read_bytes()[:-512])
    data = bytearray((root / flipped).read_bytes())
    data[len(data) // 2] ^= 0x01
    (root / flipped).write_bytes(bytes(data))
    cheap = manifest.shard_problems(root, sha256=False)
    assert cheap == [f"{missing}: missing", f"{short}: {(root / short).stat().st_size} "
                     f"bytes, the manifest says {manifest.shards_of('train')[1].bytes}"]
    full = manifest.shard_problems(root, sha256=True)
    assert full[:2] == cheap and full[2].startswith(f"{flipped}: sha256 ") and "differs from the manifest" in full[2]
    assert manifest.shard_problems(root, ("val",), sha256=True) == []


def test_a_folder_in_a_shards_place_is_not_called_missing(tiny_dataset, tmp_path):
    """It was reported as missing, of a path the user can see."""
    root = tmp_path / "shards"
    shutil.copytree(tiny_dataset[1], root)
    manifest = Manifest.load(root)
    name = manifest.shards_of("val")[0].name
    (root / name).unlink()
    (root / name).mkdir()
    assert manifest.shard_problems(root, ("val",), sha256=False) == [f"{name}: is a folder, expected a shard file"]


def test_a_shard_linked_to_a_file_in_a_sub_folder_is_inside(tiny_dataset, tmp_path):
    """Issue 35 case 20: it was refused as "outside" the dataset directory."""
    from b2t.data.loader import StreamConfig, eval_batches

    root = tmp_path / "shards"
    shutil.copytree(tiny_dataset[1], root)
    manifest = Manifest.load(root)
    name = manifest.shards_of("val")[0].name
    (root / "store").mkdir()
    (root / name).rename(root / "store" / name)
    (root / name).symlink_to(root / "store" / name)
    assert manifest.shard_problems(root, ("val",), sha256=True) == []
    assert len(list(eval_batches(root, manifest, "val", StreamConfig()))) == sum(s.n_batches for s in
                                                                                manifest.shards_of("val"))


def test_a_config_with_other_patching_is_refused_naming_both(tiny_dataset):
    """The buckets were aligned to the patching the shards were made with: another one would
    cut different patches from the same padded lengths."""
    shards = tiny_dataset[1]
    cfg = load_config(TINY_CONFIG)
    Manifest.load(shards).check_patching(cfg.model)
    other = replace(cfg, model=replace(cfg.model, patch_stride=cfg.model.patch_stride + 1))
    with pytest.raises(DatasetError, match=rf"model.patch_stride={cfg.model.patch_stride + 1} but the shards were "
                                           rf"bucketed for patch_stride={cfg.model.patch_stride}: re-run b2t-preprocess"):
        Dataset.open(shards, other)
