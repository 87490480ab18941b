"""`b2t-plan --target` shows its table as it goes: each step's row as soon as that step
is compiled, with k/N and an expected time in the line before it (the compiler is faked here;
tests/plan/test_compile.py and test_side_by_side.py run the real one)."""

from __future__ import annotations

from pathlib import Path

from b2t.config import load_config
from b2t.contract import BucketShape
from b2t.plan import check, side_by_side
from b2t.plan.targets import parse_target

REPO = Path(__file__).resolve().parents[2]


def test_each_row_is_reported_as_soon_as_its_step_is_compiled(monkeypatch):
    from tests.plan.test_compile import Memory, _checked

    fits = Memory(arguments=40 * 1024**2, outputs=40 * 1024**2, aliased=40 * 1024**2, temp=10 * 1024**2,
                  code=5 * 1024**2)
    events: list[str] = []

    def fake_traced(cfg, n_days, backend, kind, shape, dump, report):
        return [_checked(kind, shape.T, shape.B, fits).graph]

    def fake_compile_step(target, parts):
        events.append(f"compiled {parts[0].kind} T={parts[0].bucket.T}")
        return [_checked(parts[0].kind, parts[0].bucket.T, parts[0].rows, fits).compiled]

    monkeypatch.setattr(check, "prepare_process", lambda chips, dump: None)
    monkeypatch.setattr(check, "trace_backend", lambda mesh, name: None)
    monkeypatch.setattr(check, "traced", fake_traced)
    monkeypatch.setattr(side_by_side, "compile_step", fake_compile_step)
    buckets = [BucketShape(T=126, B=16, L=8), BucketShape(T=254, B=16, L=8)]

    text = check.run_check(parse_target("v5e-1"), load_config(REPO / "configs/tiny.yaml"), buckets, 5,
                           events.append, jobs=1)
    assert events[0].startswith("TPU check: v5e-1") and "per chip, MiB" in events[0]
    progress = [e for e in events[1:] if not e.startswith("compiled the ")]
    assert progress[0] == "compiling 4 steps for v5e-1, 1 at a time"
    assert progress[1] == "compiling 1/4: the train step of bucket T=126 B=16"
    assert progress[2] == "compiled train T=126"
    assert progress[3].startswith("train T=126 B=16") and progress[3].endswith("fits"), "its row, before the next step"
    assert progress[4] == "compiling 2/4: the eval step of bucket T=126 B=16"
    assert progress[7] == "compiling 3/4: the train step of bucket T=254 B=16 (about 12 s, as T=126's)"
    assert progress[3] in text.splitlines(), "the same row in the final table"
