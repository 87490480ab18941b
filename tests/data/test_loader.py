"""Host splitting: N simulated hosts together read every shard (and so every batch) of a pass once."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from b2t.config import TINY_CONFIG, load_config
from b2t.data.loader import Batch, StreamConfig, eval_batches, pass_shards, train_batches
from b2t.data.manifest import SPLITS, Manifest
from preprocess.synth import SynthSpec, write_dataset
from preprocess.writer import prepare_dataset


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """Small shards (2 batches each), so every split has several: 3 sessions, 2 train compositions."""
    root = tmp_path_factory.mktemp("hosts")
    write_dataset(SynthSpec(sessions=3, train_trials=24, val_trials=8, test_trials=8, seed=1), root / "hdf5")
    cfg = load_config(TINY_CONFIG, ["data.batches_per_shard=2", "data.epochs=2"])
    prepare_dataset(root / "hdf5", root / "shards", cfg, workers=1, progress=False)
    return root / "shards"


def _identity(batch: Batch) -> tuple:
    """A batch by its bucket and rows (session, block, trial; None for padding rows)."""
    return (batch.bucket, *((r["session"], r["block"], r["trial"]) if r else None for r in batch.meta["rows"]))


def _pass_batches(root: Path, manifest: Manifest, cfg: StreamConfig, pass_index: int) -> list[tuple]:
    """The batches `cfg`'s host reads in train pass `pass_index`, read through the real stream."""
    before = sum(sum(s.n_batches for s in pass_shards(manifest, "train", p, cfg)) for p in range(pass_index))
    n = sum(s.n_batches for s in pass_shards(manifest, "train", pass_index, cfg))
    return [_identity(b) for b in itertools.islice(train_batches(root, manifest, cfg, start=before), n)]


@pytest.mark.parametrize("pass_index", [0, 1])
def test_two_hosts_read_every_train_batch_of_a_pass_exactly_once(shards, pass_index):
    manifest = Manifest.load(shards)
    hosts = [StreamConfig(seed=3, shuffle_buffer=4, rank=r, world=2) for r in range(2)]
    read = [_pass_batches(shards, manifest, h, pass_index) for h in hosts]
    alone = _pass_batches(shards, manifest, StreamConfig(seed=3, shuffle_buffer=4), pass_index)
    assert all(read), "both hosts get work"
    assert Counter(read[0] + read[1]) == Counter(alone), "together: every batch of the pass, each once"
    assert not set(read[0]) & set(read[1])
    names = [{s.name for s in pass_shards(manifest, "train", pass_index, h)} for h in hosts]
    epoch = manifest.epochs()[pass_index % len(manifest.epochs())]
    assert names[0] | names[1] == {s.name for s in manifest.shards_of("train", epoch)}
    assert not names[0] & names[1]


@pytest.mark.parametrize("split", ["val", "test"])
def test_two_hosts_read_every_eval_batch_once(shards, split):
    manifest = Manifest.load(shards)
    read = [[_identity(b) for b in eval_batches(shards, manifest, split, StreamConfig(rank=r, world=2))]
            for r in range(2)]
    alone = [_identity(b) for b in eval_batches(shards, manifest, split, StreamConfig())]
    assert all(read)
    assert Counter(read[0] + read[1]) == Counter(alone)
    assert len(alone) == manifest.splits[split]["n_batches"]


@given(data=st.data())
def test_any_world_partitions_the_shards_of_any_pass(shards, data):
    manifest = Manifest.load(shards)
    split = data.draw(st.sampled_from(SPLITS))
    pass_index = data.draw(st.integers(0, 3)) if split == "train" else 0
    n_shards = len(pass_shards(manifest, split, pass_index, StreamConfig(seed=7)))
    world = data.draw(st.integers(1, n_shards))
    shares = [pass_shards(manifest, split, pass_index, StreamConfig(seed=7, rank=r, world=world)) for r in range(world)]
    names = [s.name for share in shares for s in share]
    assert sorted(names) == sorted(s.name for s in pass_shards(manifest, split, pass_index, StreamConfig(seed=7)))
    assert len(set(names)) == len(names), "no shard read twice"
    assert max(map(len, shares)) - min(map(len, shares)) <= 1, "shares differ by at most one shard"


def test_more_hosts_than_shards_is_refused(shards):
    manifest = Manifest.load(shards)
    n_val = len(manifest.shards_of("val"))
    with pytest.raises(ValueError, match=rf"{n_val} val shards cannot feed {n_val + 1} hosts"):
        pass_shards(manifest, "val", 0, StreamConfig(rank=0, world=n_val + 1))


def test_rank_outside_world_is_refused():
    with pytest.raises(ValueError, match="reader rank 2 is not in 0..world-1 for world 2"):
        StreamConfig(rank=2, world=2)
