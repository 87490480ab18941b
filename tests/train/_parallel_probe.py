"""A few train steps and one eval on the XLA CPU device, on one device or an SPMD mesh.

Run by tests/train/test_parallel.py: in a subprocess with CPU_NUM_DEVICES=4 for the mesh
(SPMD must be switched on before XLA computes anything, which the pytest process already
did), and in the pytest process for the single-device reference. Both start from the same
checkpoint and step the same batches, so their losses and final weights must agree.

    python -m tests.train._parallel_probe SHARDS INIT OUT_DIR --devices all [--backend openxla]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from b2t.config import TINY_CONFIG, load_config
from b2t.data.loader import Batch, StreamConfig, train_batches
from b2t.data.manifest import Manifest
from b2t.train.backend import make_backend
from b2t.train.checkpoint import TrainState, load_checkpoint, save_checkpoint
from b2t.train.loop import run_model
from b2t.train.mesh import SpmdMesh, enable_spmd, parse_devices, sharding_spec
from b2t.train.optim import make_optimizer
from b2t.train.step import Stepper

ORDER = (0, 0, 1, 0, 1)
"""Buckets of the stepped batches: each bucket comes back after the other was compiled."""


def probe_batches(shards: Path, manifest: Manifest) -> list[Batch]:
    """The first train batches of buckets 0 and 1, in ORDER (host tensors)."""
    by_bucket: dict[int, list[Batch]] = {0: [], 1: []}
    for batch in train_batches(shards, manifest, StreamConfig(seed=0)):
        if batch.bucket in by_bucket and len(by_bucket[batch.bucket]) < ORDER.count(batch.bucket):
            by_bucket[batch.bucket].append(batch)
        if all(len(v) == ORDER.count(k) for k, v in by_bucket.items()):
            return [by_bucket[b].pop(0) for b in ORDER]
    raise AssertionError("unreachable: the train stream is endless")


def run(shards: Path, init: Path, out_dir: Path, mesh: SpmdMesh | None, backend_name: str = "xla") -> dict[str, Any]:
    """Step ORDER's batches from checkpoint `init`, eval the last one; save out_dir/final.safetensors."""
    cfg = load_config(TINY_CONFIG, [f"train.backend={backend_name}"])
    manifest = Manifest.load(shards)
    backend = make_backend(backend_name, mesh=mesh)
    model = run_model(manifest, cfg, backend)
    optimizer = make_optimizer(model, cfg.optim)
    load_checkpoint(init, model, optimizer)
    stepper = Stepper(model, optimizer, backend, cfg)
    backend.sync()  # the zero gradients and moments Stepper makes become device data, as after a warm-up
    batches = probe_batches(shards, manifest)
    start = backend.stats()
    steps = []
    for step, batch in enumerate(batches):
        loss, norm = stepper.train_step([batch], step + 1)  # seed and lr of step 0 are graph constants
        steps.append({"bucket": batch.bucket, "loss": float(loss.cpu()), "grad_norm": float(norm.cpu()),
                      "compilations": backend.stats().since(start).compilations})
    trained = backend.stats().since(start).compilations
    nll, _, _ = stepper.eval_step(batches[-1].to(backend.device))  # device tensors, as the evaluator hands them
    fallbacks = backend.stats().since(start).fallbacks
    placed = backend.place(batches[0].tensors)
    save_checkpoint(out_dir / "final.safetensors", model, optimizer, TrainState(step=len(batches)))
    return {
        "steps": steps,
        "eval_nll": nll.cpu().tolist(),
        "train_compilations": trained,
        "eval_compilations": backend.stats().since(start).compilations - trained,
        "batch_sharding": {k: sharding_spec(v) for k, v in placed.items()},
        "weight_sharding": sharding_spec(model.gru.weight_ih_l0),
        "fallbacks": fallbacks,  # ops run on the host during the steps and the eval
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shards", type=Path)
    parser.add_argument("init", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--devices", default=None)
    parser.add_argument("--backend", default="xla", choices=("xla", "openxla"))
    args = parser.parse_args()
    requested = parse_devices(args.devices, None)
    mesh = enable_spmd(requested) if requested is not None else None
    result = run(args.shards, args.init, args.out_dir, mesh, args.backend)
    (args.out_dir / "probe.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
