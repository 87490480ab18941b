"""Run by tests/plan/test_compile.py in a fresh process (the trace sets the CPU device count
and XLA's dump flags before torch_xla starts): the TPU check of the train step of a small GRU
model for each `TxBxHIDDEN` given (bins, rows, GRU units of its one layer; 2 sessions), on one
v5e chip or (`--target v5e-4 --mesh data=4`) data-parallel over four, traced for `--backend`;
one JSON line per step.

    python -m tests.plan._compile_probe [--backend openxla] [--target v5e-4 --mesh data=4] [--patch 1] \
        [--grad-accum 2] 64x4x16 ...
"""

import argparse
import json
import tempfile
from pathlib import Path

from b2t.config import Config, GRUConfig, ModelConfig, TrainConfig
from b2t.contract import BucketShape
from b2t.engine.mesh import parse_devices
from b2t.plan.capture import prepare_process, trace_backend
from b2t.plan.check import check_graph
from b2t.plan.targets import parse_target


def small(units: int, backend: str, patch: int | None, grad_accum: int = 1) -> Config:
    """A one-layer GRU model; `patch`: windows of that many bins every that many (default: the
    reference's 14 every 4), so a small patch makes the recurrence most of the step."""
    windows = {} if patch is None else {"patch_size": patch, "patch_stride": patch}
    return Config(model=ModelConfig(family="gru", gru=GRUConfig(n_units=units, n_layers=1, rnn_dropout=0.0), **windows),
                  train=TrainConfig(backend=backend, grad_accum=grad_accum))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="+")
    parser.add_argument("--backend", default="xla")
    parser.add_argument("--target", default="v5e-1")
    parser.add_argument("--mesh", default=None)
    parser.add_argument("--patch", type=int, default=None)
    parser.add_argument("--grad-accum", type=int, default=1)
    args = parser.parse_args()
    target = parse_target(args.target)
    with tempfile.TemporaryDirectory() as tmp:
        prepare_process(target.chips, Path(tmp))
        backend = trace_backend(parse_devices(None, args.mesh) if args.mesh else None, args.backend)
        for case in args.cases:
            T, B, units = (int(x) for x in case.split("x"))
            cfg = small(units, args.backend, args.patch, args.grad_accum)
            checked = check_graph(target, cfg, 2, backend, "train", BucketShape(T=T, B=B, L=8), Path(tmp),
                                  lambda _: None)
            c, m = checked.compiled, checked.compiled.memory
            parts = checked.parts or ((checked.graph, c),)
            print(json.dumps({"T": T, "B": B, "units": units, "fits": c.fits, "refusal": c.refusal,
                              "memory": None if m is None else {**m.__dict__, "total": m.total}, "flops": c.flops,
                              "parts": [{"part": g.part, "donors": len(g.donors), "handed": len(g.inputs_from),
                                         "resident": g.resident, "aliased": p.memory.aliased if p.memory else None}
                                        for g, p in parts]}), flush=True)


if __name__ == "__main__":
    main()
