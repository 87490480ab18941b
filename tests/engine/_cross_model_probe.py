"""Models trained one after another in one fresh process: each a few steps of b2t's train step
on one synthetic batch, then one eval step on it (as validation does), on the XLA CPU device;
a model given 0 steps is only evaluated, without an optimizer (as b2t-eval evaluates).

Run by tests/engine/test_cross_model.py, in subprocesses: what a process traced before (torch_xla's
scan caches, its graph cache) is what the test is about, so each sequence needs a process of its
own. Prints one JSON line: per model in turn, its per-step losses and grad norms and the eval's
per-row losses.

    python -m tests.engine._cross_model_probe xla noise_separating:3 gru:3
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from b2t.config import CONFIG_DIR, TINY_CONFIG, load_config
from b2t.contract import FEATURE_DTYPE, Batch, BucketShape, empty_batch
from b2t.engine.backend import make_backend
from b2t.engine.optim import make_optimizer
from b2t.engine.step import Stepper
from b2t.model.registry import build_model

MODELS: dict[str, tuple[Path, tuple[str, ...]]] = {
    "gru": (TINY_CONFIG, ()),
    "gru_small": (TINY_CONFIG, ("model.gru.n_units=32", "model.gru.n_layers=1")),
    "noise_separating": (CONFIG_DIR / "noise_tiny.yaml", ("model.noise_separating.clean.n_layers=1",)),
}
"""The models a probe can train, by name: a config and its overrides (the noise-separating family
with one clean GRU layer: the same three GRUs and two heads, a shorter compile)."""

SHAPE = BucketShape(T=62, B=4, L=8)
"""13 output frames (tiny's 14-bin patches, stride 4): room for up to 6 labels and their repeats."""
N_DAYS = 2


def probe_batch() -> Batch:
    """One batch of `SHAPE`, every row valid and feasible for CTC: random features, 3-6 labels."""
    g = torch.Generator().manual_seed(0)
    t = empty_batch(SHAPE)
    t["features"] = torch.randn(t["features"].shape, generator=g).to(FEATURE_DTYPE)
    t["n_time_steps"].fill_(SHAPE.T)
    t["phone_seq_lens"] = torch.randint(3, 7, (SHAPE.B,), generator=g, dtype=torch.int32)
    labels = torch.randint(1, 41, (SHAPE.B, SHAPE.L), generator=g, dtype=torch.int32)
    t["seq_class_ids"] = torch.where(torch.arange(SHAPE.L) < t["phone_seq_lens"][:, None], labels, 0).to(torch.int32)
    t["day_indices"] = torch.arange(SHAPE.B, dtype=torch.int32) % N_DAYS
    t["valid"].fill_(True)
    return Batch(0, t, {})


def run(name: str, steps: int, backend_name: str) -> dict[str, Any]:
    """Model `name` from seed 0 through `steps` train steps and one eval step, all on `probe_batch`."""
    config, overrides = MODELS[name]
    cfg = load_config(config, [*overrides, f"train.backend={backend_name}", "optim.warmup_steps=1"])  # full lr at once
    backend = make_backend(backend_name)
    torch.manual_seed(0)
    model = build_model(cfg.model, N_DAYS).to(backend.device)
    stepper = Stepper(model, make_optimizer(model, cfg.optim) if steps else None, backend, cfg)
    batch = probe_batch()
    losses, norms = [], []
    for step in range(1, steps + 1):
        loss, norm = stepper.train_step([batch], step)
        losses.append(float(loss.cpu()))
        norms.append(float(norm.cpu()))
    nll, _, _ = stepper.eval_step(batch)
    return {"losses": losses, "grad_norms": norms, "eval_nll": nll.cpu().tolist()}


def _model(text: str) -> tuple[str, int]:
    name, steps = text.split(":")
    if name not in MODELS:
        raise argparse.ArgumentTypeError(f"{name!r} is none of {sorted(MODELS)}")
    return name, int(steps)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("backend", choices=("xla", "openxla"))
    parser.add_argument("models", nargs="+", type=_model, help="NAME:STEPS, trained in this order")
    args = parser.parse_args()
    print(json.dumps([run(name, steps, args.backend) for name, steps in args.models]))


if __name__ == "__main__":
    main()
