"""The warm-up's progress lines: numbered per piece as it starts and as it ends, expected times
from an earlier attempt or the same kind's last piece, a record per piece, no progress-bar
frames when the output is not a terminal."""

from __future__ import annotations

import io
import sys

import pytest

from b2t.contract import BucketShape
from b2t.engine.backend import backend_class
from b2t.train.warmup import warm_up_pieces
from b2t.train.warmup_progress import CompileEstimates, Piece, WarmUpReport

BUCKETS = [BucketShape(T=126, B=16, L=8), BucketShape(T=254, B=8, L=8)]


class Counter:
    """The compile counter the test moves (XLA counts graphs; None: a compiler that is not counted)."""

    def __init__(self, counted: bool = True) -> None:
        self.n, self.counted = 0, counted

    def __call__(self) -> int | None:
        return self.n if self.counted else None


def run_warm_up(report: WarmUpReport, counter: Counter, graphs: list[int]) -> None:
    for piece, n in zip(warm_up_pieces(BUCKETS, train=True), graphs):
        report(piece)
        counter.n += n
    report(None)
    report.close(len(BUCKETS))


def test_pieces_are_numbered_in_the_order_the_warm_up_runs_them():
    pieces = warm_up_pieces(BUCKETS, train=True)
    assert [(p.counter, str(p)) for p in pieces] == [
        ("1/6", "train step, bucket T=126 B=16"), ("2/6", "eval step, bucket T=126 B=16"),
        ("3/6", "train step, bucket T=254 B=8"), ("4/6", "eval step, bucket T=254 B=8"),
        ("5/6", "eval step again, bucket T=126 B=16"), ("6/6", "eval step again, bucket T=254 B=8")]
    assert [p.kind for p in warm_up_pieces(BUCKETS, train=False)] == ["eval step"] * 2 + ["eval step again"] * 2


def test_side_by_side_pieces_are_each_buckets_graphs_then_one_for_every_buckets_steps():
    pieces = warm_up_pieces(BUCKETS, train=True, ahead=True)
    assert [(p.counter, str(p)) for p in pieces] == [
        ("1/5", "train step, bucket T=126 B=16"), ("2/5", "eval step, bucket T=126 B=16"),
        ("3/5", "train step, bucket T=254 B=8"), ("4/5", "eval step, bucket T=254 B=8"),
        ("5/5", "steps of every bucket")]


def test_overlapping_pieces_end_with_the_graphs_and_time_they_are_given(capsys):
    """Side by side, pieces end out of order, each with its own graph count and end time (the
    compile counter counts every piece at once); the closing line says how they compiled."""
    counter, records, starts = Counter(), [], []
    report = WarmUpReport(True, counter, record=lambda p, g, s: records.append((p.counter, g, round(s))),
                          on_piece=starts.append)
    first, second, *_ = warm_up_pieces(BUCKETS, train=True, ahead=True)
    report.started(first)
    report.started(second)
    counter.n += 3
    report.finished(second, 1, end=report.open[second][0] + 4.0)
    report.finished(first, 2, end=report.open[first][0] + 9.0)
    report(None)
    report.side_by_side = "graphs compiled up to 2 at once"
    report.close(len(BUCKETS))
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("compiled 2/5: eval step, bucket T=126 B=16: 1 graph, 4.0 s")
    assert lines[3].startswith("compiled 1/5: train step, bucket T=126 B=16: 2 graphs, 9.0 s")
    assert lines[-1].endswith(" (graphs compiled up to 2 at once)")
    assert records == [("2/5", 1, 4), ("1/5", 2, 9)] and starts == [first, second, None]


def test_piped_lines_say_k_of_n_as_each_piece_starts_and_ends(capsys):
    counter, records = Counter(), []
    report = WarmUpReport(True, counter, record=lambda p, g, s: records.append((p.counter, g)))
    run_warm_up(report, counter, [3, 1, 2, 1, 0, 1])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "compiling 1/6: train step, bucket T=126 B=16 (the first compile can take minutes)"
    assert lines[1].startswith("compiled 1/6: train step, bucket T=126 B=16: 3 graphs, ")
    assert lines[4].startswith("compiling 3/6: train step, bucket T=254 B=8 (about ") and "as T=126's" in lines[4]
    assert lines[9].startswith("compiled 5/6: eval step again, bucket T=126 B=16: no new graph (cached), ")
    assert lines[-1].startswith("warm-up: 8 graphs for 2 buckets in ")
    assert len(lines) == 2 * 6 + 1
    assert records == [("1/6", 3), ("2/6", 1), ("3/6", 2), ("4/6", 1), ("5/6", 0), ("6/6", 1)]


def test_an_earlier_attempts_times_are_the_expected_ones(capsys):
    earlier = [{"kind": "compiled", "piece": "train step, bucket T=254 B=8", "graphs": 2, "seconds": 49.0},
               {"kind": "compiled", "piece": "eval step, bucket T=254 B=8", "graphs": 0, "seconds": 0.1},  # a cache hit
               {"kind": "train", "step": 3}]
    estimates = CompileEstimates.from_records(earlier)
    piece = Piece("train step", 254, 8, 3, 6)
    assert estimates.estimate(str(piece), piece.kind) == "about 49 s, as last time"
    assert estimates.estimate("eval step, bucket T=254 B=8", "eval step") is None, "a cache hit predicts nothing"
    estimates.observe("eval step", "T=126", 100.0)
    assert estimates.estimate("eval step, bucket T=254 B=8", "eval step") == "about 1.7 min, as T=126's"


@pytest.mark.parametrize(("backend", "counted", "n_lines"), [("inductor", False, 13), ("eager", False, 1)])
def test_uncounted_compilers_give_times_only_and_eager_one_line(capsys, backend, counted, n_lines):
    counter = Counter(counted)
    run_warm_up(WarmUpReport(backend_class(backend).compiles, counter), counter, [1] * 6)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == n_lines
    assert "graph" not in " ".join(lines)
    if backend == "eager":
        assert lines[0].startswith("warm-up: nothing to compile (eager) for 2 buckets in ")
    else:
        assert lines[1].startswith("compiled 1/6: train step, bucket T=126 B=16: ") and lines[1].endswith(" s")


def test_disabled_reports_still_record(capsys):
    counter, records = Counter(), []
    run_warm_up(WarmUpReport(True, counter, record=lambda p, g, s: records.append(g), enabled=False), counter,
                [1, 1, 1, 1, 0, 0])
    assert capsys.readouterr().out == ""
    assert records == [1, 1, 1, 1, 0, 0]


def test_a_real_xla_backend_reports_the_graph_it_compiled_and_not_the_cached_one(capsys):
    import torch

    from b2t.engine.backend import make_backend

    backend = make_backend("xla")
    x = torch.arange(21.0).reshape(7, 3).to(backend.device)
    graphs = []
    report = WarmUpReport(True, lambda: backend.stats().compilations, record=lambda p, g, s: graphs.append(g))
    for i in (1, 2):
        report(Piece("a graph", 7, 3, i, 2))
        (x * 7.25 - 0.5).cpu()  # a graph no other test compiles; the second time it is cached
    report(None)
    assert graphs == [1, 0]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_sees_what_compiles_now_in_the_bar_and_keeps_the_end_lines(capsys, monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    counter = Counter()
    run_warm_up(WarmUpReport(True, counter), counter, [3, 1, 2, 1, 0, 1])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [f"compiled {k}/6" for k in range(1, 7)] + ["warm-up"]
    assert "compiling 1/6: train step, bucket T=126 B=16 (the first compile can take minutes)" in terminal.getvalue()
    assert "compiling 3/6: train step, bucket T=254 B=8 (about " in terminal.getvalue()
