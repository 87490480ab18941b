"""Atomic outputs: the whole new file or the old one, with the permissions `open` would give."""

from __future__ import annotations

import os
import stat

import pytest

from b2t.atomic import atomic_file, atomic_write_text, remove_stale_temps


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_the_file_gets_the_permissions_of_a_plain_open(tmp_path, umask):
    before = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "ours", "x")
        (tmp_path / "plain").write_text("x")
    finally:
        os.umask(before)
    mode = stat.S_IMODE((tmp_path / "ours").stat().st_mode)
    assert mode == stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o666 & ~umask


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    path = atomic_write_text(tmp_path / "out.json", "old")
    with pytest.raises(RuntimeError), atomic_file(path, buffering=1 << 20) as f:
        f.write(b"new, half written")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_stale_temps_of_a_killed_writer_are_removed(tmp_path):
    atomic_write_text(tmp_path / "last.safetensors", "kept")
    (tmp_path / ".last.safetensors.abc123.tmp").write_text("half")  # what a kill -9 mid-write leaves
    (tmp_path / "notes.tmp").write_text("not ours")
    removed = remove_stale_temps(tmp_path)
    assert [p.name for p in removed] == [".last.safetensors.abc123.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.safetensors", "notes.tmp"]
