"""The training loop: compile every bucket before the loop, then train with no new graphs.

    manifest -> model + AdamW -> (resume) -> warm up each bucket shape -> loop:
        batches -> Stepper.train_step -> every log_every: read losses (one host sync)
        every val_every: greedy PER on val (best.safetensors) ; every checkpoint_every: last
    -> compile accounting (fails the run past --max-compiles)

Data-parallel runs (`b2t.train.parallel`): on an SPMD mesh one process steps every device
and nothing else changes; under torchrun every rank runs this loop on its share of the
shards, and only rank 0 validates, writes checkpoints and `metrics.jsonl` (the other ranks
log to `metrics.rank<r>.jsonl`).
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from b2t.atomic import remove_stale_temps
from b2t.config import Config
from b2t.contract import empty_batch
from b2t.data.loader import Batch, StreamConfig, eval_batches, pass_shards, train_batches
from b2t.data.manifest import Manifest
from b2t.evaluate import decode_batches, summarize
from b2t.model.decoder import GRUDecoder
from b2t.train.backend import Backend, describe, make_backend
from b2t.train.checkpoint import TrainState, load_checkpoint, read_state, save_checkpoint
from b2t.train.init_from import init_from_checkpoint
from b2t.train.metrics_log import MetricsLog, read_records
from b2t.train.optim import lr_at, make_optimizer
from b2t.train.parallel import Layout, check_divisible, close_ddp, make_layout, wrap_ddp
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
    devices: int | None = None  # data-parallel over this many devices (-1: all); None: one device
    init_from: Path | None = None  # a fresh run starts from this checkpoint's weights (b2t.train.init_from)
    verify_data: bool = False  # sha256 of every shard against the manifest before training


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
    state = read_state(path)
    if state.sessions != manifest.sessions:
        raise TrainingError(f"{path} was trained on sessions {state.sessions[:3]}..., the shards hold "
                            f"{manifest.sessions[:3]}...: day indices would not match")
    saved = {k: v for k, v in state.config.items() if k != "train"}
    now = {k: v for k, v in cfg.to_dict().items() if k != "train"}
    if saved != now:
        changed = sorted(k for k in now if saved.get(k) != now[k])
        raise TrainingError(f"{path} was trained with different {changed} settings: resume with the same config")
    return load_checkpoint(path, model, optimizer)


def warm_up(stepper: Stepper, manifest: Manifest, bar: tqdm) -> None:
    """Compile every bucket's train and eval graphs on all-padding batches, before the loop."""
    batches = [Batch(i, empty_batch(shape), {}).to(stepper.backend.device)  # host -> device, as in training
               for i, shape in enumerate(manifest.buckets)]
    started = [time.perf_counter(), ""]

    def report(what: str) -> None:
        if started[1]:
            bar.write(f"compiled {started[1]}: {time.perf_counter() - started[0]:.1f} s")
        started[:] = [time.perf_counter(), what]
        bar.set_description_str(f"compiling {what} (first compile can take minutes)")

    stepper.warm_up(batches, report)
    report("")


def validate(stepper: Stepper, dataset: Path, manifest: Manifest, cfg: Config) -> dict[str, Any]:
    batches = eval_batches(dataset, manifest, "val", StreamConfig(seed=cfg.train.seed, num_workers=cfg.train.num_workers))
    return summarize(decode_batches(stepper, batches)).to_dict()


def _check_same_readers(run_dir: Path, layout: Layout) -> None:
    """A resumed run skips `batches` batches of each reader's stream, which is only the same
    position in the data when the shards are split over as many readers as before."""
    before = [r["world"] for r in read_records(run_dir / METRICS) if r.get("kind") == "layout"]
    if before and before[-1] != layout.world:
        raise TrainingError(f"{run_dir} was trained with {before[-1]} data readers (hosts or torchrun processes), "
                            f"this run has {layout.world}: resume with {before[-1]}")


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of the weights in state-dict order: equal on every replica of a data-parallel run."""
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def train(dataset: str | Path, run_dir: str | Path, cfg: Config, opts: RunOptions = RunOptions()) -> dict[str, Any]:
    """Train on the shards in `dataset`, writing checkpoints and metrics to `run_dir`."""
    dataset, run_dir = Path(dataset), Path(run_dir)
    manifest = Manifest.load(dataset)
    check_compatible(manifest, cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(run_dir)  # a checkpoint write cut short by a kill
    if (run_dir / LAST).exists() and not opts.resume:
        raise TrainingError(f"{run_dir / LAST} exists: pass --resume to continue it, or choose a new run directory")
    if opts.resume and not (run_dir / LAST).exists():
        tqdm.write(f"note: no {run_dir / LAST} yet (stopped before its first checkpoint): starting from scratch")
        opts = replace(opts, resume=False)
    check_shards(dataset, manifest, sha256=opts.verify_data)
    layout, mesh, rank_device = make_layout(cfg.train.backend, opts.devices)
    try:
        return _train(dataset, run_dir, manifest, cfg, opts, layout,
                      make_backend(cfg.train.backend, opts.device or rank_device, mesh))
    finally:
        if layout.kind == "ddp":
            close_ddp()


def check_shards(dataset: Path, manifest: Manifest, *, sha256: bool) -> None:
    """Every train and val shard present with its manifest size (and, with `sha256`, digest)."""
    t0 = time.perf_counter()
    problems = manifest.shard_problems(dataset, ("train", "val"), sha256=sha256)
    if problems:
        raise TrainingError(f"{len(problems)} shards of {dataset} do not match its manifest ({'; '.join(problems[:3])}): "
                            f"run b2t-preprocess verify {dataset}, then rerun b2t-preprocess to rewrite them")
    if sha256:
        tqdm.write(f"verified the sha256 of {len(manifest.shards_of('train')) + len(manifest.shards_of('val'))} "
                   f"shards in {time.perf_counter() - t0:.1f} s")


def _train(dataset: Path, run_dir: Path, manifest: Manifest, cfg: Config, opts: RunOptions,
           layout: Layout, backend: Backend) -> dict[str, Any]:
    if layout.kind == "spmd":
        check_divisible(manifest.buckets, layout.devices)
    model = build_model(manifest, cfg, backend)
    forward = wrap_ddp(model, backend.device) if layout.kind == "ddp" else None
    optimizer = make_optimizer(model, cfg.optim)
    if opts.resume:
        _check_same_readers(run_dir, layout)
    state = (_resume_state(run_dir / LAST, model, optimizer, manifest, cfg) if opts.resume
             else TrainState(sessions=manifest.sessions, config=cfg.to_dict()))
    log = MetricsLog(run_dir / (METRICS if layout.is_main else f"metrics.rank{layout.rank}.jsonl"),
                     tensorboard=layout.is_main, resume_step=state.step if opts.resume else None)
    if layout.is_main:
        tqdm.write(describe(backend))
    if opts.init_from is not None and not opts.resume:
        init = init_from_checkpoint(opts.init_from, model, manifest.sessions, cfg)
        log.write("init", source=str(init.source), kept=init.kept, new=init.new)
        tqdm.write(init.summary())
    stepper = Stepper(model, optimizer, backend, cfg, forward)
    has_val = bool(manifest.shards_of("val")) and layout.is_main
    stream_cfg = StreamConfig(seed=cfg.train.seed, shuffle_buffer=cfg.train.shuffle_buffer,
                              num_workers=cfg.train.num_workers, rank=layout.rank, world=layout.world)
    log.write("layout", parallel=layout.kind, rank=layout.rank, world=layout.world, devices=layout.devices,
              first_pass_shards=[s.name for s in pass_shards(manifest, "train", 0, stream_cfg)])

    bar = tqdm(total=cfg.train.steps, initial=state.step, unit="step", dynamic_ncols=True,
               disable=not (opts.progress and layout.is_main))
    warm_up(stepper, manifest, bar)
    warm = backend.stats()
    log.write("compile", phase="warm-up", buckets=len(manifest.buckets), **warm.to_dict())
    bar.set_description_str("training")

    stream = train_batches(dataset, manifest, stream_cfg, start=state.batches)
    window, t_window = 0, time.perf_counter()
    while state.step < cfg.train.steps:
        micro = [next(stream) for _ in range(cfg.train.grad_accum)]  # the stepper places them
        _, norm = stepper.train_step(micro, state.step)
        state.step += 1
        state.batches += len(micro)
        window += 1
        bar.update(1)
        last_step = state.step == cfg.train.steps
        if state.step % cfg.train.log_every == 0 or last_step:
            mean_loss = stepper.take_loss_total() / window
            if not math.isfinite(mean_loss):
                raise TrainingError(f"non-finite loss ({mean_loss}) in steps {state.step - window + 1}..{state.step}: "
                                    "lower optim.lr or check the input features; last good checkpoint: "
                                    f"{run_dir / LAST if (run_dir / LAST).exists() else 'none'}")
            rate, o = window / (time.perf_counter() - t_window), cfg.optim
            log.write("train", step=state.step, loss=mean_loss, grad_norm=float(norm.cpu()), steps_per_s=rate,
                      lr=lr_at(state.step - 1, o.lr, o.lr_min, o.warmup_steps, o.decay_steps),
                      lr_day=lr_at(state.step - 1, o.lr_day, o.lr_day_min, o.warmup_steps, o.decay_steps),
                      **backend.stats().to_dict())
            bar.set_postfix(loss=f"{mean_loss:.3f}", steps_s=f"{rate:.2f}")
            window, t_window = 0, time.perf_counter()
        if has_val and (state.step % cfg.train.val_every == 0 or last_step):
            val = validate(stepper, dataset, manifest, cfg)
            log.write("val", step=state.step, **val)
            bar.write(f"step {state.step}: val PER {val['per']:.4f}, loss {val['loss']:.3f}")
            if val["per"] < state.best_per:
                state.best_per, state.best_step = val["per"], state.step
                save_checkpoint(run_dir / BEST, model, None, state)
        if layout.is_main and (state.step % cfg.train.checkpoint_every == 0 or last_step):
            save_checkpoint(run_dir / LAST, model, optimizer, state)
    bar.close()

    final = backend.stats()
    summary = {"steps": state.step, "best_per": state.best_per, "best_step": state.best_step,
               "warm_up": warm.to_dict(), "final": final.to_dict(), "buckets": len(manifest.buckets),
               "devices": layout.devices, "rank": layout.rank, "weights_sha256": weights_digest(model)}
    log.write("summary", **summary)
    log.close()
    if opts.max_compiles is not None and final.compilations > opts.max_compiles:
        raise TrainingError(f"{final.compilations} XLA compilations exceed --max-compiles {opts.max_compiles} "
                            f"for {len(manifest.buckets)} buckets: see {run_dir / METRICS} for when they happened")
    return summary
