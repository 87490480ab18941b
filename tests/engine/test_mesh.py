"""The SPMD mesh options (b2t.engine.mesh): parsing --devices/--mesh, buckets that must divide,
which dim of a weight the fsdp axis splits."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from b2t.config import MeshConfig
from b2t.contract import BucketShape
from b2t.engine.mesh import ParallelError, check_divisible, host_copy, mesh_axes, parse_devices, shard_dim


@pytest.mark.parametrize(("devices", "mesh", "want"), [
    (None, None, None), ("all", None, MeshConfig(data=-1)), ("4", None, MeshConfig(data=4)),
    (None, "data=8", MeshConfig(data=8)), (None, " data = all ", MeshConfig(data=-1)),
    (None, "fsdp=8", MeshConfig(data=1, fsdp=8)), (None, "data=2,fsdp=4", MeshConfig(data=2, fsdp=4)),
    (None, "fsdp=4, data=all", MeshConfig(data=-1, fsdp=4))])
def test_devices_and_mesh_options(devices, mesh, want):
    assert parse_devices(devices, mesh) == want


@pytest.mark.parametrize(("devices", "mesh", "message"), [
    ("0", None, "write 'all' or a positive device count"),
    ("two", None, "write 'all' or a positive device count"),
    (None, "model=4", "write --mesh data=N,fsdp=M"),
    (None, "data=2,data=4", "write --mesh data=N,fsdp=M"),
    (None, "fsdp=all", "write --mesh data=N,fsdp=M"),
    (None, "fsdp=0", "axis sizes must be >= 1"),
    ("4", "data=4", "give --devices or --mesh, not both")])
def test_bad_device_options_are_refused(devices, mesh, message):
    with pytest.raises(ParallelError, match=message):
        parse_devices(devices, mesh)


def test_mesh_axes_name_fsdp_only_when_it_shards():
    assert mesh_axes(4, 1) == {"data": 4}, "a data-parallel run records what it did before fsdp existed"
    assert mesh_axes(2, 4) == {"data": 2, "fsdp": 4}


def test_indivisible_buckets_are_refused_naming_both_numbers():
    check_divisible([BucketShape(T=100, B=16, L=8), BucketShape(T=200, B=8, L=8)], 4)
    with pytest.raises(ParallelError, match=r"do not divide over 4 devices in buckets T=300 B=6: .*row_multiple=4"):
        check_divisible([BucketShape(T=100, B=16, L=8), BucketShape(T=300, B=6, L=8)], 4)


@pytest.mark.parametrize(("shape", "fsdp", "dim"), [
    ((192, 7168), 8, 1), ((45, 512, 512), 8, 1), ((41,), 8, None), ((41, 64), 8, 1), ((1, 1, 64), 8, 2),
    ((192, 7168), 1, None), ((), 8, None), ((4, 6), 8, None)])
def test_weights_split_along_their_largest_evenly_divisible_dim(shape, fsdp, dim):
    assert shard_dim(shape, fsdp) == dim


@given(shape=st.lists(st.integers(1, 300), max_size=4), fsdp=st.sampled_from([2, 3, 4, 8]))
def test_the_split_dim_always_divides_and_none_larger_does(shape, fsdp):
    d = shard_dim(shape, fsdp)
    divisible = [n for n in shape if n % fsdp == 0]
    if d is None:
        assert not divisible
    else:
        assert shape[d] % fsdp == 0 and shape[d] == max(divisible)


def test_host_copy_is_a_copy_even_of_a_host_tensor():
    """The warm-up keeps its snapshot of the training state as host copies: on the CPU
    (eager), `.cpu()` returns the tensor itself, and the warm-up then restored nothing."""
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    copy = host_copy(t)
    t.add_(1)
    assert torch.equal(copy, torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert host_copy(t.t()).is_contiguous()
