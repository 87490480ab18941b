"""Progress output: a bar on a terminal, plain lines in a log (no carriage-return frames)."""

from __future__ import annotations

import io

import b2t.progress as progress


def test_a_piped_bar_writes_whole_lines_and_no_carriage_returns(monkeypatch):
    log = io.StringIO()
    monkeypatch.setattr(progress.sys, "stderr", log)
    monkeypatch.setattr(progress, "LOG_INTERVAL", 0.0)
    with progress.progress_bar(total=3, desc="writing", unit="trial") as bar:
        for _ in range(3):
            bar.update(1)
    text = log.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert lines[-1].startswith("writing: 100%") and "3/3" in lines[-1]
    assert all(line.strip() for line in lines)


def test_a_disabled_bar_writes_nothing(monkeypatch):
    log = io.StringIO()
    monkeypatch.setattr(progress.sys, "stderr", log)
    for _ in progress.progress_bar(range(3), disable=True):
        pass
    assert log.getvalue() == ""
