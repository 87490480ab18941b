"""Atomic outputs: the whole new file or the old one, with the permissions `open` would give."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from b2t.atomic import atomic_file, atomic_path, atomic_write_text, remove_stale_temps


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


def _child_writes(path, text: str, code: int) -> None:
    """Another program writes `path` by name (as KenLM's build_binary does), then exits `code`."""
    subprocess.run([sys.executable, "-c", f"import sys; open(sys.argv[1], 'w').write({text!r}); sys.exit({code})",
                    str(path)], check=True)


def test_a_path_another_program_writes_appears_whole_with_plain_permissions(tmp_path):
    target = atomic_write_text(tmp_path / "lm.bin", "old")
    before = os.umask(0o027)
    try:
        with atomic_path(target) as tmp:
            assert tmp.parent == tmp_path and tmp != target
            _child_writes(tmp, "new", 0)
            assert target.read_text() == "old"  # a reader still sees the old file
    finally:
        os.umask(before)
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lm.bin"]


def test_a_failed_program_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    target = atomic_write_text(tmp_path / "lm.bin", "old")
    with pytest.raises(subprocess.CalledProcessError), atomic_path(target) as tmp:
        _child_writes(tmp, "half a model", 1)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lm.bin"]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc, a folder that takes no new file")
def test_a_folder_that_takes_no_file_is_named_with_the_output_not_the_temp():
    """'/proc/.lm.arpa.a8gjnl5z.tmp: No such file or directory (it does not exist)', of a folder that exists."""
    from b2t.cli.rule import os_error_line

    with pytest.raises(OSError) as caught:
        atomic_write_text(Path("/proc/lm.arpa"), "x")
    assert os_error_line(caught.value) == "/proc/lm.arpa: cannot create a file in /proc (No such file or directory)"
