"""A few train steps and one eval on the XLA CPU device, on one device or SPMD meshes.

Run by tests/engine/test_parallel.py and test_fsdp.py: in a subprocess with CPU_NUM_DEVICES
virtual devices for the meshes (SPMD must be switched on before XLA computes anything,
which the pytest process already did), and in the pytest process for the single-device
reference. Both start from the same checkpoint and step the same batches, so their losses
and final weights must agree. One subprocess may run several meshes in turn (`--mesh`
repeated), each writing OUT_DIR/mesh<i>/probe.json and final.safetensors.

    python -m tests.engine._parallel_probe SHARDS INIT OUT_DIR --mesh data=2,fsdp=4 [--backend openxla]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from b2t.config import TINY_CONFIG, load_config
from b2t.data.loader import Batch, StreamConfig, train_batches
from b2t.data.manifest import Manifest
from b2t.decoding import decode_batches, summarize
from b2t.engine.backend import enable_spmd, make_backend
from b2t.engine.checkpoint import TrainState, load_checkpoint, save_checkpoint
from b2t.engine.mesh import SpmdMesh, device_bytes, parse_devices, sharding_spec
from b2t.engine.optim import make_optimizer
from b2t.engine.step import Stepper, seeded_model

REPO = Path(__file__).resolve().parents[2]


def order(steps: int) -> tuple[int, ...]:
    """Buckets of the stepped batches: 0, 0, then 1 and 0 in turn, so each bucket comes back after
    the other was compiled (5 steps: 0, 0, 1, 0, 1)."""
    return (0, 0, *((1, 0) * steps))[:steps]


def probe_batches(shards: Path, manifest: Manifest, steps: int) -> list[Batch]:
    """The first train batches of buckets 0 and 1, in `order(steps)` (host tensors)."""
    want = order(steps)
    by_bucket: dict[int, list[Batch]] = {0: [], 1: []}
    for batch in train_batches(shards, manifest, StreamConfig(seed=0)):
        if batch.bucket in by_bucket and len(by_bucket[batch.bucket]) < want.count(batch.bucket):
            by_bucket[batch.bucket].append(batch)
        if all(len(v) == want.count(k) for k, v in by_bucket.items()):
            return [by_bucket[b].pop(0) for b in want]
    raise AssertionError("unreachable: the train stream is endless")


def evaluate(stepper: Stepper, batch: Batch) -> dict[str, Any]:
    """Per-row losses, greedy phonemes and PER of `batch` (device tensors, as the evaluator hands them)."""
    placed = batch.to(stepper.backend.device)  # labels are read from the host batch
    results = list(decode_batches(lambda _: stepper.eval_step(placed), [batch]))
    return {"eval_nll": [r.loss for r in results], "phonemes": [list(r.decoded_phonemes) for r in results],
            "per": summarize(results).per.rate()}


def run(shards: Path, init: Path, out_dir: Path, mesh: SpmdMesh | None, backend_name: str = "xla",
        steps: int = 5, config: Path = TINY_CONFIG) -> dict[str, Any]:
    """Step `steps` batches from checkpoint `init` (a resume), eval the last one; save out_dir/final.safetensors."""
    cfg = load_config(config, [f"train.backend={backend_name}"])
    manifest = Manifest.load(shards)
    backend = make_backend(backend_name, mesh=mesh)
    model = seeded_model(cfg, len(manifest.sessions), backend)
    optimizer = make_optimizer(model, cfg.optim)
    load_checkpoint(init, model, optimizer)
    stepper = Stepper(model, optimizer, backend, cfg)
    backend.sync()  # the zero moments Stepper makes become device data, as after a warm-up
    batches = probe_batches(shards, manifest, steps)
    start = backend.stats()
    trace = []
    for step, batch in enumerate(batches):
        loss, norm = stepper.train_step([batch], step + 1)  # seed and lr of step 0 are graph constants
        trace.append({"bucket": batch.bucket, "loss": float(loss.cpu()), "grad_norm": float(norm.cpu()),
                      "compilations": backend.stats().since(start).compilations})
    trained = backend.stats().since(start).compilations
    evaluation = evaluate(stepper, batches[-1])
    fallbacks = backend.stats().since(start).fallbacks
    placed = backend.place(batches[0].tensors)
    before_save = backend.stats().compilations
    save_checkpoint(out_dir / "final.safetensors", model, optimizer, TrainState(step=len(batches)))
    save_compilations = backend.stats().compilations - before_save
    params = list(model.parameters())
    moments = [v for p in params for v in optimizer.state[p].values() if v.shape == p.shape]
    first_gru = next(p for name, p in model.named_parameters() if name.endswith("gru.weight_ih_l0"))
    return {
        "steps": trace,
        **evaluation,
        "train_compilations": trained,
        "eval_compilations": backend.stats().since(start).compilations - trained - save_compilations,
        "save_compilations": save_compilations,
        "batch_sharding": {k: sharding_spec(v) for k, v in placed.items()},
        "weight_sharding": {k: sharding_spec(v) for k, v in model.named_parameters()},
        "grads_kept": sum(p.grad is not None for p in params),  # between steps: none (each step makes its own)
        "moment_sharding": sharding_spec(optimizer.state[first_gru]["exp_avg"]),
        "state_bytes": {"weights": device_bytes(params), "moments": device_bytes(moments)} if mesh is not None else {},
        "fallbacks": fallbacks,  # ops run on the host during the steps and the eval
    }


def evaluate_checkpoint(shards: Path, path: Path, backend_name: str = "xla", steps: int = 5) -> dict[str, Any]:
    """`evaluate` of checkpoint `path` on this process's device, on the batch `run` evaluates."""
    cfg = load_config(TINY_CONFIG, [f"train.backend={backend_name}"])
    manifest = Manifest.load(shards)
    backend = make_backend(backend_name)
    model = seeded_model(cfg, len(manifest.sessions), backend)
    load_checkpoint(path, model)
    return evaluate(Stepper(model, None, backend, cfg), probe_batches(shards, manifest, steps)[-1])


def spawn(shards: Path, init: Path, out_dir: Path, n_devices: int, meshes: list[str], backend: str = "xla",
          steps: int = 5, config: Path = TINY_CONFIG) -> subprocess.Popen:
    """This probe in a subprocess on `n_devices` virtual CPU devices, one run per mesh in `meshes`."""
    args = [a for m in meshes for a in ("--mesh", m)]
    return subprocess.Popen(
        [sys.executable, "-m", "tests.engine._parallel_probe", str(shards), str(init), str(out_dir),
         *args, "--backend", backend, "--steps", str(steps), "--config", str(config)],
        cwd=REPO, env={**os.environ, "CPU_NUM_DEVICES": str(n_devices), "PJRT_DEVICE": "CPU"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def results(proc: subprocess.Popen, out_dir: Path, n_meshes: int, timeout: float = 600) -> list[dict[str, Any]]:
    """Wait for a `spawn`ed probe and read each mesh's probe.json (its output tail on failure)."""
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:]
    return [json.loads((out_dir / f"mesh{i}" / "probe.json").read_text()) for i in range(n_meshes)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shards", type=Path)
    parser.add_argument("init", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--mesh", action="append", required=True, help="data=N,fsdp=M or all (repeatable)")
    parser.add_argument("--backend", default="xla", choices=("xla", "openxla"))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--config", type=Path, default=TINY_CONFIG, help="the model and recipe (default: tiny)")
    args = parser.parse_args()
    for i, text in enumerate(args.mesh):
        cfg = parse_devices("all", None) if text == "all" else parse_devices(None, text)
        out = args.out_dir / f"mesh{i}"
        out.mkdir(parents=True, exist_ok=True)
        result = run(args.shards, args.init, out, enable_spmd(cfg, args.backend), args.backend, args.steps, args.config)
        (out / "probe.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
