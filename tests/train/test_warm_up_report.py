"""The warm-up's progress lines: one per piece that compiled, none for cached graphs, and no
progress-bar frames when the output is not a terminal."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from tqdm import tqdm

from b2t.train.warmup import WarmUpReport


class FakeBackend:
    """A backend whose compile counter the test moves (XLA counts graphs; eager compiles none)."""

    def __init__(self, name: str = "openxla", xla: bool = True) -> None:
        self.name, self.xla, self.compiled = name, xla, 0

    def stats(self) -> SimpleNamespace:
        return SimpleNamespace(compilations=self.compiled)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run_warm_up(backend: FakeBackend, stream: io.StringIO, capsys) -> tuple[list[str], str]:
    """Three pieces: the first compiles 3 graphs, the second (a cache hit) none, the third 1."""
    with tqdm(total=0, bar_format="{desc}", file=stream) as bar:
        report = WarmUpReport(bar, backend)
        for what, graphs in (("train step, bucket T=126 B=16", 3), ("eval step again, bucket T=126 B=16", 0),
                             ("eval step, bucket T=254 B=8", 1)):
            report(what)
            backend.compiled += graphs
        report("")
    return capsys.readouterr().out.splitlines(), stream.getvalue()


def test_one_line_per_piece_that_compiled_and_no_frames_when_piped(capsys):
    lines, frames = run_warm_up(FakeBackend(), io.StringIO(), capsys)
    assert [line.rsplit(",", 1)[0] for line in lines] == [
        "compiled train step, bucket T=126 B=16: 3 graphs", "compiled eval step, bucket T=254 B=8: 1 graph"]
    assert "compiling" not in frames, "a piped bar shows no live description"


def test_a_terminal_also_sees_what_compiles_now(capsys):
    lines, frames = run_warm_up(FakeBackend(), Terminal(), capsys)
    assert len(lines) == 2
    assert "compiling train step, bucket T=126 B=16 (the first compile can take minutes)" in frames
    assert "compiling eval step, bucket T=254 B=8" in frames


@pytest.mark.parametrize(("backend", "n_lines"), [(FakeBackend("inductor", xla=False), 3),
                                                  (FakeBackend("eager", xla=False), 0)])
def test_uncounted_compilers_report_each_piece_and_eager_none(capsys, backend, n_lines):
    lines, _ = run_warm_up(backend, io.StringIO(), capsys)
    assert len(lines) == n_lines and all(line.startswith("compiled ") for line in lines)


def test_a_real_xla_backend_reports_the_graph_it_compiled_and_not_the_cached_one(capsys):
    import torch

    from b2t.train.backend import make_backend

    backend = make_backend("xla")
    x = torch.arange(21.0).reshape(7, 3).to(backend.device)
    with tqdm(total=0, bar_format="{desc}", file=io.StringIO()) as bar:
        report = WarmUpReport(bar, backend)
        for what in ("a new graph", "the same graph again"):
            report(what)
            (x * 7.25 - 0.5).cpu()  # a graph no other test compiles; the second time it is cached
        report("")
    assert [line.rsplit(",", 1)[0] for line in capsys.readouterr().out.splitlines()] == ["compiled a new graph: 1 graph"]
