"""A resumed run compiles exactly the graphs a fresh run compiles: in the process that trained
(its XLA graph cache then makes the resumed warm-up compile nothing) and, through the CLI, in
a process of its own (the same count). What once broke it: the checkpoint's optimizer state
loaded in another order than a fresh run makes it, and AdamW's 0-dim step counts, which
torch_xla shares by value (b2t.engine.optim.step_count)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch_xla

from b2t.config import TINY_CONFIG, load_config
from b2t.contract import Batch, BucketShape, empty_batch
from b2t.engine.backend import make_backend
from b2t.engine.checkpoint import TrainState, load_checkpoint, save_checkpoint
from b2t.engine.optim import make_optimizer
from b2t.engine.step import Stepper
from b2t.model.registry import build_model
from b2t.train.warmup import warm_up

BUCKET = BucketShape(T=30, B=4, L=8)


def _update_graph_hash(stepper: Stepper) -> bytes:
    """The hash of the lazy graph an optimizer update traces (clip + AdamW), not compiled: the
    graph's tensors in the order a sync takes them (creation order, by torch_xla's tensor id)."""
    model, optimizer = stepper.model, stepper.optimizer
    for i, p in enumerate(model.parameters()):  # what a backward leaves (uploads: device data)
        p.grad = torch.full(p.shape, 0.01 * (i + 1)).to(p.device)
    stepper.update(1)
    live = [*model.parameters(), *(t for s in optimizer.state.values() for t in s.values()),
            *(g["lr"] for g in optimizer.param_groups)]
    live.sort(key=lambda t: torch_xla._XLAC._xla_get_tensor_id(t))
    return torch_xla._XLAC._get_graph_hash(live)


def test_a_loaded_optimizer_state_traces_the_fresh_runs_update_graph(tmp_path):
    """The fast twin of the test below: the update graph is traced, never compiled. A file's
    state once came back in its sorted key order with 0-dim step counts, which torch_xla
    shares by value: another graph than a fresh run's."""
    cfg = load_config(TINY_CONFIG, ["train.backend=xla"])
    backend = make_backend("xla")

    def stepper() -> Stepper:
        torch.manual_seed(0)
        model = build_model(cfg.model, 11).to(backend.device)  # 11 days: parameter 10 sorts before 2
        return Stepper(model, make_optimizer(model, cfg.optim), backend, cfg)

    trained = stepper()
    for s in trained.optimizer.state.values():
        s["step"].copy_(torch.full(s["step"].shape, 3.0))  # the counts of a run 3 steps in
    save_checkpoint(tmp_path / "last.safetensors", trained.model, trained.optimizer, TrainState(step=3))
    want = _update_graph_hash(stepper())
    resumed = stepper()
    load_checkpoint(tmp_path / "last.safetensors", resumed.model, resumed.optimizer)
    assert _update_graph_hash(resumed) == want


@pytest.mark.slow
@pytest.mark.parametrize("name", ["xla", "openxla"])
def test_a_resumed_warm_up_compiles_nothing_the_trained_process_had_not(tmp_path, name):
    cfg = load_config(TINY_CONFIG, [f"train.backend={name}"])
    backend = make_backend(name)

    def model_and_optimizer():
        torch.manual_seed(0)
        model = build_model(cfg.model, 2).to(backend.device)
        return model, make_optimizer(model, cfg.optim)

    model, optimizer = model_and_optimizer()
    stepper = Stepper(model, optimizer, backend, cfg)
    warm_up(stepper, [BUCKET])
    for step in (1, 2, 3):
        stepper.train_step([Batch(0, empty_batch(BUCKET), {})], step)
    save_checkpoint(tmp_path / "last.safetensors", model, optimizer, TrainState(step=3))
    trained = backend.stats().compilations

    model, optimizer = model_and_optimizer()
    load_checkpoint(tmp_path / "last.safetensors", model, optimizer)  # before the Stepper, as the trainer does
    warm_up(Stepper(model, optimizer, backend, cfg), [BUCKET])
    assert backend.stats().compilations == trained


def _warm_up_compilations(run_dir) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r["compilations"] for r in map(json.loads, lines) if r["kind"] == "compile" and r["phase"] == "warm-up"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["xla", "openxla"])
def test_through_the_cli_a_resumed_run_compiles_what_a_fresh_one_did(tiny_dataset, tmp_path, name):
    """Each run its own process, as users run them: the resumed warm-up compiles as many graphs."""
    _, shards = tiny_dataset
    run = tmp_path / "run"
    base = [str(Path(sys.executable).parent / "b2t-train"), str(shards), str(run), "--config", str(TINY_CONFIG),
            "--backend", name, "--no-progress", "--set", "train.val_every=1000", "--set", "train.checkpoint_every=2"]
    subprocess.run([*base, "--set", "train.steps=2"], check=True, capture_output=True)
    subprocess.run([*base, "--set", "train.steps=4", "--resume"], check=True, capture_output=True)
    fresh, resumed = _warm_up_compilations(run)
    assert resumed == fresh
