"""What a person sees while graphs compile: a numbered line per piece with its expected time,
and the record of what each piece cost.

The warm-up (`b2t.train.warmup`) and the TPU check (`b2t.plan.check`) both compile a known
list of pieces, in turn or side by side; whatever runs them tells `WarmUpReport.started` and
`.finished` about each (side by side, with each piece's own graph count and end time).
Expected times come from `CompileEstimates`: the same piece's time in an earlier attempt of
the run (its `compiled` records in metrics.jsonl), else the time of this warm-up's earlier
piece of the same kind (the GRU and CTC scans make a graph's compile time nearly independent
of T).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from b2t.engine.backend import Backend
from b2t.progress import duration, progress_bar

PIECE_RECORD = "compiled"
"""metrics.jsonl's kind for one warm-up piece: piece, index, of, graphs (None: not counted), seconds;
written as each piece ends, so pieces compiled side by side come in the order they finished."""


@dataclass(frozen=True)
class Piece:
    """One unit of the warm-up: a bucket's train steps, its eval step, or its eval step again;
    after graphs compiled side by side, the steps of every bucket (no bucket of its own, T and B
    0). `index` counts from 1 to `total`, the number of pieces of the whole warm-up."""

    kind: str  # "train step", "eval step", "eval step again", "steps of every bucket"
    T: int
    B: int
    index: int
    total: int

    def __str__(self) -> str:
        return f"{self.kind}, bucket T={self.T} B={self.B}" if self.T else self.kind

    @property
    def counter(self) -> str:
        return f"{self.index}/{self.total}"


class CompileEstimates:
    """Expected compile seconds per piece: an earlier attempt's time of the same piece, else this
    run's time of the last piece of the same kind. `estimate` says which, for the user."""

    def __init__(self, earlier: Mapping[str, float] | None = None) -> None:
        self.earlier = dict(earlier or {})
        self.by_kind: dict[str, tuple[str, float]] = {}  # kind -> (what it was, seconds)

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]]) -> CompileEstimates:
        """From a run's metrics records: the latest time of every piece an earlier attempt compiled
        (pieces that compiled nothing, cache hits, are left out: they predict nothing)."""
        earlier = {r["piece"]: float(r["seconds"]) for r in records
                   if r.get("kind") == PIECE_RECORD and r.get("graphs") != 0
                   and isinstance(r.get("piece"), str) and isinstance(r.get("seconds"), (int, float))}
        return cls(earlier)

    def estimate(self, what: str, kind: str) -> str | None:
        """`about 49 s, as last time` / `about 49 s, as T=162's`, or None when nothing is known."""
        if what in self.earlier:
            return f"about {_duration(self.earlier[what])}, as last time"
        if kind in self.by_kind:
            like, seconds = self.by_kind[kind]
            return f"about {_duration(seconds)}, as {like}'s"
        return None

    def observe(self, kind: str, like: str, seconds: float) -> None:
        self.by_kind[kind] = (like, seconds)


def _duration(seconds: float) -> str:
    """A rough expected time: `49 s`, `1.7 min`."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


class WarmUpReport:
    """The warm-up's lines. Piped output (a log): per piece `compiling 3/9: train step, bucket
    T=246 B=16 (about 49 s, as last time)` when it starts and `compiled 3/9: ...: 2 graphs, 50.0 s`
    when it ends (`no new graph (cached)` where XLA found its graphs compiled); on a terminal a
    bar over the pieces says what compiles now, and only the end lines stay. Then
    `warm-up: 10 graphs for 3 buckets in 2:47`. Eager compiles nothing and shows only that
    last line; inductor's graphs are not counted, so its lines give times only.

    `compilations`: the backend's XLA compile counter (None off XLA); `record(piece, graphs,
    seconds)` stores each finished piece (metrics.jsonl); `enabled`: print anything (False on a
    data-parallel run's other ranks); `bar`: the live bar on a terminal (off with --no-progress);
    `cache_line`: what the persistent compilation cache did, printed after the last line
    (`CompileStats.cache_line`); `on_piece(piece)`: called as each piece starts, and with None
    once the last has ended (the trainer checks its compile budget there)."""

    def __init__(self, compiles: bool, compilations: Callable[[], int | None], *,
                 estimates: CompileEstimates | None = None,
                 record: Callable[[Piece, int | None, float], None] | None = None, enabled: bool = True,
                 bar: bool = True, cache_line: Callable[[], str | None] = lambda: None,
                 on_piece: Callable[[Piece | None], None] = lambda piece: None) -> None:
        self.compilations, self.cache_line, self.on_piece = compilations, cache_line, on_piece
        self.estimates = estimates or CompileEstimates()
        self.record, self.enabled, self.show_bar = record, enabled, bar
        self.compiles = compiles
        self.side_by_side: str | None = None  # how the graphs compiled, for the closing line
        self.bar: tqdm | None = None
        self.open: dict[Piece, tuple[float, int | None]] = {}  # started pieces: (start time, counter then)
        self.current: Piece | None = None
        self.t0, self.before = time.perf_counter(), compilations()

    @classmethod
    def for_backend(cls, backend: Backend, **options: Any) -> WarmUpReport:
        """The report of a warm-up on `backend`, counting its XLA compilations where it has them."""
        xla = backend.xla
        return cls(backend.compiles, lambda: backend.stats().compilations if xla else None,
                   cache_line=lambda: backend.stats().cache_line(), **options)

    @property
    def live(self) -> bool:
        return self.bar is not None and not self.bar.disable

    @classmethod
    def quiet(cls, backend: Backend) -> WarmUpReport:
        """A report that shows and records nothing (tools, tests)."""
        return cls(backend.compiles, lambda: None, enabled=False, bar=False)

    def started(self, piece: Piece) -> None:
        self.on_piece(piece)
        if self.bar is None:
            self.bar = progress_bar(total=piece.total, unit="piece", leave=False, bar_format="{desc}",
                                    disable=not (self.enabled and self.show_bar and self.compiles and sys.stderr.isatty()))
        self.open[piece] = (time.perf_counter(), self.compilations())
        if not (self.enabled and self.compiles):
            return
        expected = self.estimates.estimate(str(piece), piece.kind)
        hint = f" ({expected})" if expected else " (the first compile can take minutes)" if piece.index == 1 else ""
        line = f"compiling {piece.counter}: {piece}{hint}"
        if self.live:
            self.bar.set_description_str(line)
        else:
            tqdm.write(line)

    def finished(self, piece: Piece, graphs: int | None = None, end: float | None = None) -> None:
        """`piece` has ended: at `end` (perf_counter seconds; default now) with `graphs` compiled
        (default: the counter's rise since it started, which pieces compiling side by side
        cannot use)."""
        t_start, before = self.open.pop(piece)
        seconds = (time.perf_counter() if end is None else end) - t_start
        if graphs is None:
            after = self.compilations()
            graphs = None if before is None or after is None else after - before
        if graphs != 0:
            self.estimates.observe(piece.kind, f"T={piece.T}", seconds)
        if self.record is not None:
            self.record(piece, graphs, seconds)
        if self.live:
            self.bar.update(1)
        if not (self.enabled and self.compiles):
            return
        what = ("no new graph (cached)" if graphs == 0 else f"{graphs} graph{'s' * (graphs != 1)}"
                if graphs is not None else "")
        tqdm.write(f"compiled {piece.counter}: {piece}: {what + ', ' if what else ''}{seconds:.1f} s")

    def __call__(self, piece: Piece | None) -> None:
        """The sequential protocol `b2t.train.warmup.warm_up` drives: each call ends the piece
        before it and starts `piece`; None ends the last one."""
        if self.current is not None:
            self.finished(self.current)
        self.current = piece
        if piece is not None:
            self.started(piece)
        else:
            self.on_piece(None)

    def close(self, buckets: int) -> tuple[float, int | None]:
        """The closing `warm-up: ...` line; returns (seconds, graphs compiled; None off XLA)."""
        if self.bar is not None:
            self.bar.close()
        seconds, after = time.perf_counter() - self.t0, self.compilations()
        graphs = None if after is None or self.before is None else after - self.before
        if self.enabled:
            what = ("nothing to compile (eager)" if not self.compiles else f"{graphs} graph{'s' * (graphs != 1)}"
                    if graphs is not None else "compiled")
            how = f" ({self.side_by_side})" if self.side_by_side else ""
            tqdm.write(f"warm-up: {what} for {buckets} bucket{'s' * (buckets != 1)} in {duration(seconds)}{how}")
            if (cache := self.cache_line()) is not None:
                tqdm.write(cache)
        return seconds, graphs


