"""Progress bars for every CLI: tqdm on a terminal, plain lines in a log.

tqdm redraws its line with carriage returns, which a piped log (`b2t-train ... > run.log`,
a batch scheduler) keeps as one endless line of frames. When its stream is not a terminal,
`progress_bar` writes each refresh as a line of its own, at most one per `LOG_INTERVAL`
seconds, plus the last state when the bar closes.
"""

from __future__ import annotations

import io
import sys
from typing import Any

from tqdm import tqdm

LOG_INTERVAL = 30.0
"""Seconds between two progress lines in a log."""


class _Lines(io.TextIOBase):
    """A tqdm stream for a log: each frame a line; the blank frames tqdm clears with are dropped."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        line = text.replace("\r", "").strip()
        if line:
            self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(iterable: Any = None, *, disable: bool = False, **kwargs: Any) -> tqdm:
    """`tqdm(iterable, **kwargs)` on stderr; on a non-terminal stderr, plain lines (see above)."""
    stream = sys.stderr
    if disable or stream.isatty():
        return tqdm(iterable, disable=disable, dynamic_ncols=True, **kwargs)
    return tqdm(iterable, file=_Lines(stream), mininterval=LOG_INTERVAL, ncols=100, **kwargs)


def duration(seconds: float) -> str:
    """`12.3 s` under a minute, else `m:ss` or `h:mm:ss`: how long a phase took, for a person."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
