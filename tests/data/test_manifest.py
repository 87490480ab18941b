"""Shards against their manifest: missing and resized ones cheaply, a flipped byte by sha256; a
config against the patching the shards were bucketed for."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

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


def _edited(shards, tmp_path, edit) -> Path:
    """A copy of the dataset's manifest (alone) with `edit(raw)` applied to its JSON."""
    import json

    raw = json.loads((shards / "manifest.json").read_text())
    edit(raw)
    (tmp_path / "manifest.json").write_text(json.dumps(raw))
    return tmp_path


def _set_bucket_t(value):
    return lambda raw: raw["buckets"][0].update(T=value)


@pytest.mark.parametrize("edit, message", [
    (_set_bucket_t(10**30), r"T=1000000000000000000000000000000: expected integers in 1\.\.1048576"),  # rc 70 in torch
    (_set_bucket_t("206"), r"T='206'"), (_set_bucket_t(206.5), r"T=206\.5"), (_set_bucket_t(True), r"T=True"),  # trained
    (lambda raw: raw["shards"].append(raw["shards"][0]), r"shard \S+\.tar is listed 2 times"),  # trained on it twice
    (lambda raw: raw["shards"][0].update(n_batches=200), r"split \w+: its shards hold \d+ batches, its stats say"),
    (lambda raw: raw.update(version="1"), r"manifest format version '1' is not 1"),
    (lambda raw: raw.update(buckets=None), r"buckets is a JSON NoneType, expected a list"),
    (lambda raw: raw.update(sessions=[]), r"sessions must be a non-empty list"),
    (lambda raw: raw["config"].update(model="x"), r"model.patch_size=None, patch_stride=None: expected integers"),
])
def test_a_manifest_that_b2t_preprocess_did_not_write_is_refused_naming_it(tiny_dataset, tmp_path, edit, message):
    """Each of these loaded (some trained, exit 0) or failed deep inside a run, naming no file."""
    root = _edited(tiny_dataset[1], tmp_path, edit)
    with pytest.raises(DatasetError, match=rf"^{root / 'manifest.json'} is not a valid b2t manifest: .*{message}"):
        Manifest.load(root)


def test_a_start_cut_of_whole_trials_is_refused(tiny_dataset):
    """augment.max_start_cut=100000 trained, exit 0, on rows cut to nothing."""
    shards = tiny_dataset[1]
    shortest = min(b.T for b in Manifest.load(shards).buckets)
    Dataset.open(shards, load_config(TINY_CONFIG, [f"augment.max_start_cut={shortest - 1}"]))
    with pytest.raises(DatasetError, match=rf"augment.max_start_cut={shortest} cuts whole trials: the shortest "
                                           rf"bucket holds trials of at most {shortest} bins"):
        Dataset.open(shards, load_config(TINY_CONFIG, [f"augment.max_start_cut={shortest}"]))
