"""Run by tests/tpu/test_compile.py in a fresh process (the trace sets the CPU device count
and XLA's dump flags before torch_xla starts): trace the train step of a small GRU model for
each `TxBxHIDDEN` given (bins, rows, GRU units of its one layer; 2 sessions),
compile each for one v5e chip, print one JSON line per graph."""

import json
import sys
import tempfile
from pathlib import Path

from b2t.config import Config, GRUConfig, ModelConfig
from b2t.contract import BucketShape
from b2t.tpu.capture import prepare_process, trace, trace_backend
from b2t.tpu.compiler import compile_for
from b2t.tpu.targets import parse_target


def small(units: int) -> Config:
    return Config(model=ModelConfig(family="gru", gru=GRUConfig(n_units=units, n_layers=1, rnn_dropout=0.0)))


def main() -> None:
    target = parse_target("v5e-1")
    with tempfile.TemporaryDirectory() as tmp:
        prepare_process(target.chips, Path(tmp))
        backend = trace_backend(None)
        for arg in sys.argv[1:]:
            T, B, units = (int(x) for x in arg.split("x"))
            graph = trace(small(units), 2, backend, "train", BucketShape(T=T, B=B, L=8), Path(tmp))
            c = compile_for(target, graph.hlo, graph.donors)
            m = c.memory
            print(json.dumps({"T": T, "B": B, "units": units, "donors": len(graph.donors), "fits": c.fits, "refusal": c.refusal,
                              "memory": None if m is None else {**m.__dict__, "total": m.total},
                              "flops": c.flops}), flush=True)


if __name__ == "__main__":
    main()
