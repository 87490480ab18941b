"""The SPMD mesh options (b2t.train.mesh): parsing --devices/--mesh, buckets that must divide."""

from __future__ import annotations

import pytest

from b2t.contract import BucketShape
from b2t.train.mesh import ParallelError, check_divisible, parse_devices


@pytest.mark.parametrize(("devices", "mesh", "want"), [
    (None, None, None), ("all", None, -1), ("4", None, 4), (None, "data=8", 8), (None, " data = all ", -1)])
def test_devices_and_mesh_options(devices, mesh, want):
    assert parse_devices(devices, mesh) == want


@pytest.mark.parametrize(("devices", "mesh", "message"), [
    ("0", None, "write 'all' or a positive device count"),
    ("two", None, "write 'all' or a positive device count"),
    (None, "model=4", "only a 1-D data mesh is supported"),
    ("4", "data=4", "give --devices or --mesh, not both")])
def test_bad_device_options_are_refused(devices, mesh, message):
    with pytest.raises(ParallelError, match=message):
        parse_devices(devices, mesh)


def test_indivisible_buckets_are_refused_naming_both_numbers():
    check_divisible([BucketShape(T=100, B=16, L=8), BucketShape(T=200, B=8, L=8)], 4)
    with pytest.raises(ParallelError, match=r"do not divide over 4 devices in buckets T=300 B=6: .*row_multiple=4"):
        check_divisible([BucketShape(T=100, B=16, L=8), BucketShape(T=300, B=6, L=8)], 4)
