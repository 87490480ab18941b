"""`b2t-train --plan --target` shows its table as it goes: each graph's row as soon as that graph
is compiled, with k/N and an expected time in the line before it (the compiler is faked here;
tests/tpu/test_compile.py runs the real one)."""

from __future__ import annotations

from pathlib import Path

from b2t.config import load_config
from b2t.contract import BucketShape
from b2t.tpu import check
from b2t.tpu.targets import parse_target

REPO = Path(__file__).resolve().parents[2]


def test_each_row_is_reported_as_soon_as_its_graph_is_compiled(monkeypatch):
    from tests.tpu.test_compile import Memory, _checked

    fits = Memory(arguments=40 * 1024**2, outputs=40 * 1024**2, aliased=40 * 1024**2, temp=10 * 1024**2,
                  code=5 * 1024**2)
    events: list[str] = []

    def fake_check_graph(target, cfg, n_days, backend, kind, shape, dump, report, counter="", expected=None):
        report(f"compiling {counter}: {kind} T={shape.T} ({expected})")
        events.append(f"compiled {kind} T={shape.T}")
        return _checked(kind, shape.T, shape.B, fits)

    monkeypatch.setattr(check, "prepare_process", lambda chips, dump: None)
    monkeypatch.setattr(check, "trace_backend", lambda mesh: None)
    monkeypatch.setattr(check, "check_graph", fake_check_graph)
    buckets = [BucketShape(T=126, B=16, L=8), BucketShape(T=254, B=16, L=8)]

    def report(line: str) -> None:
        events.append(line)

    text = check.run_check(parse_target("v5e-1"), load_config(REPO / "configs/tiny.yaml"), buckets, 5, report)
    assert events[0].startswith("TPU check: v5e-1") and "per chip, MiB" in events[0]
    progress = events[1:]
    assert progress[0] == "compiling 1/4: train T=126 (None)"
    assert progress[1] == "compiled train T=126"
    assert progress[2].startswith("train T=126 B=16") and progress[2].endswith("fits"), "its row, before the next graph"
    assert progress[3] == "compiling 2/4: eval T=126 (None)"
    assert progress[6] == "compiling 3/4: train T=254 (about 12 s, as T=126's)"
    assert progress[2] in text.splitlines(), "the same row in the final table"
