"""One training step of configs/tiny.yaml on the XLA device, for tests/test_cpu_codegen.py.

`step` gives the step's loss and gradient norm as exact floats and the sha256 of the weights
after the AdamW update; run as a module it prints them as one JSON line. The test runs it in
its own process (the suite's emitters) and in a subprocess with the default ones: XLA_FLAGS
is read when torch_xla starts its client.

    python -m tests._cpu_codegen_probe SHARDS
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def step(shards: Path) -> dict[str, str]:
    from b2t.config import TINY_CONFIG, load_config
    from b2t.data.loader import StreamConfig, train_batches
    from b2t.data.manifest import Manifest
    from b2t.engine.backend import make_backend
    from b2t.engine.optim import make_optimizer
    from b2t.engine.step import Stepper, seeded_model
    from b2t.train.loop import weights_digest

    cfg = load_config(TINY_CONFIG, ["train.backend=xla"])
    manifest, backend = Manifest.load(shards), make_backend("xla")
    model = seeded_model(cfg, len(manifest.sessions), backend)
    stepper = Stepper(model, make_optimizer(model, cfg.optim), backend, cfg)
    shortest = next(b for b in train_batches(shards, manifest, StreamConfig()) if b.bucket == 0)  # the shortest T
    loss, norm = stepper.train_step([shortest], 1)
    return {"loss": float(loss.cpu()).hex(), "grad_norm": float(norm.cpu()).hex(), "weights": weights_digest(model)}


if __name__ == "__main__":
    import torch_xla

    torch_xla.device()  # before any backward, as the suite's conftest does
    print(json.dumps(step(Path(sys.argv[1]))))
