"""The training loop: compile every bucket before the loop, then train with no new graphs.

    manifest -> model + AdamW -> (resume) -> warm up each bucket shape -> loop:
        batches -> Stepper.train_step -> every log_every: read losses (one host sync)
        every val_every: greedy PER on val (best.safetensors) ; every checkpoint_every: last
    -> compile accounting (fails the run past --max-compiles)
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from b2t.config import Config
from b2t.contract import LOSS_DTYPE, BucketShape, empty_batch
from b2t.data.loader import Batch, StreamConfig, eval_batches, train_batches
from b2t.data.manifest import Manifest
from b2t.evaluate import decode_batches, summarize
from b2t.model.decoder import GRUDecoder
from b2t.train.backend import Backend, make_backend
from b2t.train.checkpoint import TrainState, load_checkpoint, save_checkpoint
from b2t.train.optim import lr_at, make_optimizer
from b2t.train.step import Stepper

LAST, BEST, METRICS = "last.safetensors", "best.safetensors", "metrics.jsonl"


class TrainingError(RuntimeError):
    """The run cannot continue; the message says why and what to do."""


@dataclass
class RunOptions:
    resume: bool = False
    max_compiles: int | None = None  # fail the run if XLA compiled more graphs than this
    progress: bool = True
    device: str | None = None


class MetricsLog:
    """JSON lines, appended and flushed per record so a killed run keeps what it logged."""

    def __init__(self, path: Path):
        self.path = path

    def write(self, kind: str, **fields: Any) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"kind": kind, **fields}) + "\n")


def check_compatible(manifest: Manifest, cfg: Config) -> None:
    """The model's patching must be the one the buckets were aligned to."""
    used = manifest.config.get("model", {})
    for key in ("patch_size", "patch_stride"):
        if used.get(key) != getattr(cfg.model, key):
            raise TrainingError(
                f"model.{key}={getattr(cfg.model, key)} but the shards were bucketed for {key}={used.get(key)}: "
                "re-run b2t-preprocess with this config or use the config the shards were made with"
            )


def build_model(manifest: Manifest, cfg: Config, backend: Backend) -> GRUDecoder:
    torch.manual_seed(cfg.train.seed)
    return GRUDecoder(len(manifest.sessions), cfg.model, xla=backend.xla).to(backend.device)


def _resume_state(path: Path, model: GRUDecoder, optimizer: torch.optim.Optimizer,
                  manifest: Manifest, cfg: Config) -> TrainState:
    state = load_checkpoint(path, model, optimizer)
    if state.sessions != manifest.sessions:
        raise TrainingError(f"{path} was trained on sessions {state.sessions[:3]}..., the shards hold "
                            f"{manifest.sessions[:3]}...: day indices would not match")
    saved = {k: v for k, v in state.config.items() if k != "train"}
    now = {k: v for k, v in cfg.to_dict().items() if k != "train"}
    if saved != now:
        changed = sorted(k for k in now if saved.get(k) != now[k])
        raise TrainingError(f"{path} was trained with different {changed} settings: resume with the same config")
    return state


def warm_up(stepper: Stepper, manifest: Manifest, bar: tqdm | None) -> None:
    """Compile each bucket's train and eval graphs on an all-padding batch, before the loop."""
    with stepper.preserved_state():
        for i, shape in enumerate(manifest.buckets):
            _warm_bucket(stepper, i, shape, len(manifest.buckets), bar)


def _warm_bucket(stepper: Stepper, i: int, shape: BucketShape, n: int, bar: tqdm | None) -> None:
    msg = f"compiling bucket T={shape.T} B={shape.B} ({i + 1}/{n}; first compile can take minutes)"
    if bar is not None:
        bar.set_description_str(msg)
    t0 = time.perf_counter()
    stepper.warm_up(Batch(i, empty_batch(shape, stepper.backend.device), {}))
    if bar is not None:
        bar.write(f"{msg}: {time.perf_counter() - t0:.1f} s")


def validate(stepper: Stepper, dataset: Path, manifest: Manifest, cfg: Config) -> dict[str, Any]:
    batches = eval_batches(dataset, manifest, "val", StreamConfig(seed=cfg.train.seed, num_workers=cfg.train.num_workers))
    return summarize(decode_batches(stepper, batches)).to_dict()


def train(dataset: str | Path, run_dir: str | Path, cfg: Config, opts: RunOptions = RunOptions()) -> dict[str, Any]:
    """Train on the shards in `dataset`, writing checkpoints and metrics to `run_dir`."""
    dataset, run_dir = Path(dataset), Path(run_dir)
    manifest = Manifest.load(dataset)
    check_compatible(manifest, cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    if (run_dir / LAST).exists() and not opts.resume:
        raise TrainingError(f"{run_dir / LAST} exists: pass --resume to continue it, or choose a new run directory")
    backend = make_backend(cfg.train.backend, opts.device)
    model = build_model(manifest, cfg, backend)
    optimizer = make_optimizer(model, cfg.optim)
    state = (_resume_state(run_dir / LAST, model, optimizer, manifest, cfg) if opts.resume
             else TrainState(sessions=manifest.sessions, config=cfg.to_dict()))
    log = MetricsLog(run_dir / METRICS)
    stepper = Stepper(model, optimizer, backend, cfg)
    has_val = bool(manifest.shards_of("val"))

    bar = tqdm(total=cfg.train.steps, initial=state.step, unit="step", disable=not opts.progress, dynamic_ncols=True)
    warm_up(stepper, manifest, bar)
    warm = backend.stats()
    log.write("compile", phase="warm-up", buckets=len(manifest.buckets), **warm.to_dict())
    bar.set_description_str("training")

    stream = train_batches(dataset, manifest, StreamConfig(
        seed=cfg.train.seed, shuffle_buffer=cfg.train.shuffle_buffer, num_workers=cfg.train.num_workers),
        start=state.batches)
    loss_sum = torch.zeros((), dtype=LOSS_DTYPE, device=backend.device)
    window, t_window = 0, time.perf_counter()
    while state.step < cfg.train.steps:
        micro = [next(stream).to(backend.device) for _ in range(cfg.train.grad_accum)]
        loss, norm = stepper.train_step(micro, state.step)
        loss_sum += loss
        state.step += 1
        state.batches += len(micro)
        window += 1
        bar.update(1)
        last_step = state.step == cfg.train.steps
        if state.step % cfg.train.log_every == 0 or last_step:
            mean_loss = float(loss_sum.cpu()) / window  # the deliberate host sync of the loop
            if not math.isfinite(mean_loss):
                raise TrainingError(f"non-finite loss ({mean_loss}) in steps {state.step - window + 1}..{state.step}: "
                                    "lower optim.lr or check the input features; last good checkpoint: "
                                    f"{run_dir / LAST if (run_dir / LAST).exists() else 'none'}")
            rate, o = window / (time.perf_counter() - t_window), cfg.optim
            log.write("train", step=state.step, loss=mean_loss, grad_norm=float(norm.cpu()), steps_per_s=rate,
                      lr=lr_at(state.step - 1, o.lr, o.lr_min, o.warmup_steps, o.decay_steps), **backend.stats().to_dict())
            bar.set_postfix(loss=f"{mean_loss:.3f}", steps_s=f"{rate:.2f}")
            loss_sum.zero_()
            window, t_window = 0, time.perf_counter()
        if has_val and (state.step % cfg.train.val_every == 0 or last_step):
            val = validate(stepper, dataset, manifest, cfg)
            log.write("val", step=state.step, **val)
            bar.write(f"step {state.step}: val PER {val['per']:.4f}, loss {val['loss']:.3f}")
            if val["per"] < state.best_per:
                state.best_per, state.best_step = val["per"], state.step
                save_checkpoint(run_dir / BEST, model, None, state)
        if state.step % cfg.train.checkpoint_every == 0 or last_step:
            save_checkpoint(run_dir / LAST, model, optimizer, state)
    bar.close()

    final = backend.stats()
    summary = {"steps": state.step, "best_per": state.best_per, "best_step": state.best_step,
               "warm_up": warm.to_dict(), "final": final.to_dict(), "buckets": len(manifest.buckets)}
    log.write("summary", **summary)
    if opts.max_compiles is not None and final.compilations > opts.max_compiles:
        raise TrainingError(f"{final.compilations} XLA compilations exceed --max-compiles {opts.max_compiles} "
                            f"for {len(manifest.buckets)} buckets: see {run_dir / METRICS} for when they happened")
    return summary
