"""One training step of configs/tiny.yaml on the XLA device, for tests/test_cpu_codegen.py.

`step` gives the step's loss, gradient norm and largest learning rate as exact floats and
writes the weights after the AdamW update to an .npz; run as a module it prints the floats as
one JSON line. The test runs it in its own process (the suite's emitters) and in a subprocess
with the default ones: XLA_FLAGS is read when torch_xla starts its client.

    python -m tests._cpu_codegen_probe SHARDS WEIGHTS.npz
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def step(shards: Path, weights: Path) -> dict[str, str]:
    import numpy as np

    from b2t.config import TINY_CONFIG, load_config
    from b2t.data.loader import StreamConfig, train_batches
    from b2t.data.manifest import Manifest
    from b2t.engine.backend import make_backend
    from b2t.engine.mesh import host_copy
    from b2t.engine.optim import make_optimizer
    from b2t.engine.step import Stepper, seeded_model

    cfg = load_config(TINY_CONFIG, ["train.backend=xla"])
    manifest, backend = Manifest.load(shards), make_backend("xla")
    model = seeded_model(cfg, len(manifest.sessions), backend)
    stepper = Stepper(model, make_optimizer(model, cfg.optim), backend, cfg)
    shortest = next(b for b in train_batches(shards, manifest, StreamConfig()) if b.bucket == 0)  # the shortest T
    loss, norm = stepper.train_step([shortest], 1)
    np.savez(weights, **{k: host_copy(v).float().numpy() for k, v in model.state_dict().items()})
    return {"loss": float(loss.cpu()).hex(), "grad_norm": float(norm.cpu()).hex(), "lr": max(stepper.lrs.values()).hex()}


if __name__ == "__main__":
    import torch_xla

    torch_xla.device()  # before any backward, as the suite's conftest does
    print(json.dumps(step(Path(sys.argv[1]), Path(sys.argv[2]))))
