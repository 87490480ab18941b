"""Run by tests/plan/test_side_by_side.py in a fresh process (the trace sets XLA's flags before
torch_xla starts): trace a small GRU model's train and eval steps, compile them for one v5e chip
side by side (2 jobs) and one after the other, print one JSON line."""

import json
import tempfile
from pathlib import Path

from b2t.contract import BucketShape
from b2t.plan.capture import prepare_process, trace, trace_backend
from b2t.plan.side_by_side import compile_all, compile_step
from b2t.plan.targets import parse_target
from tests.plan._compile_probe import small


def main() -> None:
    target = parse_target("v5e-1")
    with tempfile.TemporaryDirectory() as tmp:
        prepare_process(target.chips, Path(tmp))
        backend = trace_backend(None)
        cfg, shape = small(16, "xla", None), BucketShape(T=64, B=4, L=8)
        steps = [trace(cfg, 2, backend, kind, shape, Path(tmp)) for kind in ("train", "eval")]
        lines: list[str] = []
        together, memory, wall = compile_all(target, steps, 2, lines.append)
        together = [c for step in together for c in step]
        alone = [c for parts in steps for c in compile_step(target, parts)]
        print(json.dumps({"together": [c.memory.__dict__ for c in together], "alone": [c.memory.__dict__ for c in alone],
                          "fits": [c.fits for c in together], "most_at_once": memory.most_at_once,
                          "before": memory.before, "peak": memory.peak, "wall": wall,
                          "seconds": [c.seconds for c in together], "lines": lines}), flush=True)


if __name__ == "__main__":
    main()
