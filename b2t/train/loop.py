"""The training loop: compile every bucket before the loop, then train with no new graphs.

    manifest -> model + AdamW -> (resume) -> warm up each bucket shape -> loop:
        batches -> Stepper.train_step -> every log_every: read losses (one host sync)
        every val_every: greedy PER on val (best.safetensors) ; every checkpoint_every: last
    -> compile accounting (fails the run past --max-compiles)

`train` opens the dataset and sets the run up (`Run`), which it then drives: `Run.warm_up`,
`Run.step`, after each step what is due (`Run.log_losses`, `Run.validate`, `Run.checkpoint`),
and `Run.finish` (the summary and the compile budget) or `Run.stop` on a signal.

Data-parallel runs (`b2t.engine.parallel`): on an SPMD mesh one process steps every device
and nothing else changes; under torchrun every rank runs this loop on its share of the
shards, and only rank 0 validates, writes checkpoints and `metrics.jsonl` (the other ranks
log to `metrics.rank<r>.jsonl`).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from b2t import signals
from b2t.atomic import remove_stale_temps
from b2t.config import Config
from b2t.contract import Batch
from b2t.data.dataset import Dataset
from b2t.data.loader import StreamConfig
from b2t.decoding import decode_batches, summarize
from b2t.engine.backend import Backend, CompileStats, describe, make_backend
from b2t.engine.checkpoint import TrainState, read_state, save_checkpoint
from b2t.engine.concurrent_compiles import default_jobs
from b2t.engine.mesh import check_divisible, host_copy
from b2t.engine.optim import make_optimizer
from b2t.engine.parallel import Layout, close_ddp, make_layout, wrap_ddp
from b2t.engine.step import TOTAL, Stepper, seeded_model
from b2t.progress import progress_bar
from b2t.run_dir import RunDir
from b2t.run_lock import exclusive, reading_dataset, run_lock_name
from b2t.train import interruptions, warmup
from b2t.train.init_from import InitReport, init_from_checkpoint
from b2t.train.interruptions import TrainingError
from b2t.train.metrics_log import MetricsLog
from b2t.train.rates import TRAINING, StepClock
from b2t.train.resume import RunDirError, check_resumable, resume_or_start, resumed, this_rank
from b2t.train.summary import finished_summary, run_times
from b2t.train.warmup_progress import PIECE_RECORD, CompileEstimates, Piece, WarmUpReport


@dataclass
class RunOptions:
    resume: bool = False
    max_compiles: int | None = None  # fail the run as soon as XLA has compiled more graphs than this
    progress: bool = True
    device: str | None = None
    init_from: Path | None = None  # a fresh run starts from this checkpoint's weights (b2t.train.init_from)
    verify_data: bool = False  # sha256 of every shard against the manifest before training
    compile_jobs: int = field(default_factory=default_jobs)  # openxla's warm-up: graphs compiled at once (0: in turn)


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of the weights in state-dict order: equal on every replica of a data-parallel run."""
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        h.update(k.encode())
        h.update(host_copy(v).numpy().tobytes())
    return h.hexdigest()


class Run:
    """One training run: its initializer builds the model, optimizer and stepper, resumes the
    checkpoint's state or starts a fresh one, and opens the metrics log (nothing compiled yet);
    the loop then drives it one step at a time."""

    def __init__(self, data: Dataset, run_dir: RunDir, cfg: Config, opts: RunOptions, layout: Layout,
                 backend: Backend) -> None:
        if layout.kind == "spmd":
            check_divisible(data.buckets, layout.devices)
        model = seeded_model(cfg, len(data.sessions), backend)
        forward = wrap_ddp(model, backend.device) if layout.kind == "ddp" else None
        optimizer = make_optimizer(model, cfg.optim)
        if opts.resume:
            state, cfg = resumed(run_dir, layout, model, optimizer, data, cfg)
        else:
            state = TrainState(sessions=data.sessions, config=cfg.to_dict())
        state.dataset = data.identity()
        init = init_from_checkpoint(opts.init_from, model, data.sessions, cfg) if opts.init_from else None
        if state.mesh and state.mesh != layout.mesh:
            tqdm.write(f"note: {run_dir.last} was trained on mesh {state.mesh}, this run uses {layout.mesh}: "
                       "training goes on, but not bit-identical to an unbroken run on one mesh")
        state.mesh = layout.mesh
        self.data = data
        self.run_dir = run_dir
        self.cfg = cfg
        self.layout = layout
        self.backend = backend
        self.model = model
        self.optimizer = optimizer
        self.state = state
        self.opts = opts
        self.stepper = Stepper(model, optimizer, backend, cfg, forward)
        self.log = MetricsLog(run_dir.metrics_of(layout.rank), tensorboard=layout.is_main,
                              resume_step=state.step if opts.resume else None)
        self.stream_cfg = StreamConfig(seed=cfg.train.seed, shuffle_buffer=cfg.train.shuffle_buffer,
                                       num_workers=cfg.train.num_workers, rank=layout.rank, world=layout.world)
        self.clock = StepClock()  # steps/s from stepping time only (b2t.train.rates)
        self.bar: tqdm | None = None  # the training bar, made after the warm-up so its rate and ETA hold steps only
        self.phase = "the warm-up"  # what runs now, for an out-of-memory message
        self._start_log(init)

    def _start_log(self, init: InitReport | None) -> None:
        """The run's first records (and lines): its device, where it starts from, its layout."""
        if self.layout.is_main:
            tqdm.write(describe(self.backend, self.cfg.train.compute_dtype, self.stepper.compute))
        if init is not None:  # loaded before the log exists: a checkpoint that does not fit leaves RUN_DIR empty
            self.log.write("init", source=str(init.source), kept=init.kept, new=init.new)
            tqdm.write(init.summary())
        if self.opts.resume:
            self.log.write("resume", step=self.state.step, checkpoint=str(self.run_dir.last))
        self.log.write("layout", parallel=self.layout.kind, rank=self.layout.rank, world=self.layout.world,
                       devices=self.layout.devices, mesh=self.layout.mesh,
                       compute=str(self.stepper.compute).removeprefix("torch."),
                       first_pass_shards=[s.name for s in self.data.first_pass(self.stream_cfg)])

    @property
    def has_val(self) -> bool:
        return self.data.has("val") and self.layout.is_main

    def due(self, every: int) -> bool:
        return self.state.step % every == 0 or self.state.step == self.cfg.train.steps

    def step(self, stream: Iterator[Batch]) -> torch.Tensor:
        """One optimizer step over `grad_accum` micro-batches; returns the gradient norm (device)."""
        micro = [next(stream) for _ in range(self.cfg.train.grad_accum)]  # the stepper places them
        _, norm = self.stepper.train_step(micro, self.state.step)
        self.state.step += 1
        self.state.batches += len(micro)
        self.clock.stepped()
        self.bar.update(1)
        return norm

    def log_losses(self, norm: torch.Tensor) -> None:
        """Read back the window's mean losses (the loop's host sync) and log them with the rates."""
        losses = self.stepper.take_losses()
        window, seconds = self.clock.window()
        losses = {k: v / window for k, v in losses.items()}
        mean_loss = losses.pop(TOTAL)
        if not math.isfinite(mean_loss):
            last = self.run_dir.last
            raise TrainingError(f"non-finite loss ({mean_loss}) in steps {self.state.step - window + 1}.."
                                f"{self.state.step}: lower optim.lr or check the input features; last good "
                                f"checkpoint: {last if last.exists() else 'none'}")
        rate, lrs = window / seconds, self.stepper.lrs  # the learning rates the last update set
        self.log.write("train", step=self.state.step, loss=mean_loss, losses=losses, grad_norm=float(norm.cpu()),
                       steps_per_s=rate, seconds=round(seconds, 3), lr=lrs.get("decay"), lr_day=lrs.get("day"),
                       **self.backend.stats().to_dict())
        self.bar.set_postfix(loss=f"{mean_loss:.3f}", steps_s=f"{rate:.2f}")

    def validate(self) -> None:
        """Greedy PER on every val trial; a new best PER writes `best.safetensors`."""
        batches = self.data.eval_batches("val", StreamConfig(seed=self.cfg.train.seed,
                                                             num_workers=self.cfg.train.num_workers))
        t0 = time.perf_counter()
        with self.clock.apart("validation"):
            val = summarize(decode_batches(self.stepper.eval_step, batches)).to_dict()
        self.log.write("val", step=self.state.step, **val, seconds=round(time.perf_counter() - t0, 3))
        self.bar.write(f"step {self.state.step}: val PER {val['per']:.4f}, loss {val['loss']:.3f}")
        if val["per"] < self.state.best_per:
            self.state.best_per, self.state.best_step = val["per"], self.state.step
            with self.clock.apart("checkpoint"):
                save_checkpoint(self.run_dir.best, self.model, None, self.state)

    def checkpoint(self) -> None:
        with self.clock.apart("checkpoint"):
            save_checkpoint(self.run_dir.last, self.model, self.optimizer, self.state)

    def start_bar(self) -> None:
        """The training bar, from here: its rate and ETA count the steps after the warm-up only."""
        self.bar = progress_bar(total=self.cfg.train.steps, initial=self.state.step, unit="step", desc="training",
                                disable=not (self.opts.progress and self.layout.is_main))

    def warm_up(self) -> CompileStats:
        """Compile every bucket's train and eval graphs on all-padding batches, before the loop; each
        piece's time is recorded, and an earlier attempt's records give the expected times."""

        def record(piece: Piece, graphs: int | None, seconds: float) -> None:
            self.log.write(PIECE_RECORD, piece=str(piece), index=piece.index, of=piece.total, graphs=graphs,
                           seconds=round(seconds, 3))

        def starting(piece: Piece | None) -> None:
            self.check_compiles(f"in the warm-up, before the {piece or 'loop'}")
            self.phase = f"the warm-up's {piece}" if piece else "the warm-up"

        estimates = CompileEstimates.from_records(self.run_dir.records(self.layout.rank))
        progress = WarmUpReport.for_backend(self.backend, estimates=estimates, record=record, enabled=self.layout.is_main,
                                            bar=self.opts.progress, on_piece=starting)
        self.clock.start("warm-up")
        memory = warmup.warm_up(self.stepper, self.data.buckets, progress, jobs=self.opts.compile_jobs)
        seconds, _ = progress.close(len(self.data.buckets))
        self.clock.start(TRAINING)
        warm = self.backend.stats()
        side_by_side = {} if memory is None else {"compiles_at_once": memory.most_at_once,
                                                  "host_bytes_per_compile": round(memory.per_compile)}
        self.log.write("compile", phase="warm-up", buckets=len(self.data.buckets), seconds=round(seconds, 3),
                       **warm.to_dict(), donated=warm.donated, training_state=len(self.stepper.training_state()),
                       **side_by_side)
        return warm

    def check_compiles(self, when: str) -> None:
        """Fail the run once XLA has compiled more graphs than `--max-compiles`: checked before each
        warm-up graph and at every log, so an over-budget run stops then, not at its end."""
        n = self.backend.stats().compilations
        if self.opts.max_compiles is not None and n > self.opts.max_compiles:
            raise TrainingError(f"{n} XLA compilations exceed --max-compiles {self.opts.max_compiles} "
                                f"for {len(self.data.buckets)} buckets {when}: see {self.run_dir.metrics} "
                                "for when they happened")

    def finish(self, warm: CompileStats) -> dict[str, Any]:
        """The run's summary (logged; `b2t.train.summary` formats it), after checking the compile budget."""
        if self.bar is not None:
            self.bar.close()
        final = self.backend.stats()
        summary = {"steps": self.state.step, "best_per": self.state.best_per, "best_step": self.state.best_step,
                   "warm_up": warm.to_dict(), "final": final.to_dict(), "buckets": len(self.data.buckets),
                   "devices": self.layout.devices, "rank": self.layout.rank, "weights_sha256": weights_digest(self.model),
                   "xla": self.backend.xla, "run_dir": str(self.run_dir.path), "dataset": str(self.data.root),
                   "times": run_times(self.run_dir.records(self.layout.rank), self.log.elapsed())}
        self.log.write("summary", **summary)
        self.log.close()
        self.check_compiles("by the end of the run")
        return summary

    def stop(self, signum: int) -> signals.Stopped:
        """Keep the run at its current step (`last.safetensors`, unless just written) for a stop
        by `signum`, and the exception that ends b2t-train saying so."""
        if self.layout.is_main and not self.due(self.cfg.train.checkpoint_every):
            self.checkpoint()
        self.log.write("stopped", step=self.state.step, signal=signal.Signals(signum).name)
        self.log.close()
        self.bar.close()
        return interruptions.stopped(signum, self.state.step, self.run_dir.last)


def train(dataset: str | Path, run_dir: str | Path, cfg: Config, opts: RunOptions = RunOptions()) -> dict[str, Any]:
    """Train on the shards in `dataset`, writing checkpoints and metrics to `run_dir`."""
    dataset, run_dir = Path(dataset), Path(run_dir)
    if opts.resume and opts.init_from is not None:
        raise TrainingError(f"--resume continues {RunDir(run_dir).last} (weights, optimizer and schedule) and --init-from "
                            f"starts a new run from {opts.init_from}'s weights: pass one of them")
    signals.describe_stop(lambda name: interruptions.warm_up_line(name, 0))
    with reading_dataset(dataset):
        data = Dataset.open(dataset, cfg, splits=("train", "val"), verify=opts.verify_data)
        for note in data.notes:
            tqdm.write(f"note: {note}")
        created = not run_dir.exists()
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = run_lock_name(this_rank())
        try:
            with exclusive(run_dir, lock, "b2t-train", refused=RunDirError):
                return _train(data, RunDir(run_dir), cfg, opts)
        except BaseException:
            if created and run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= {lock}:
                shutil.rmtree(run_dir)  # a run refused before it wrote anything leaves no trace
            raise


def _train(data: Dataset, run_dir: RunDir, cfg: Config, opts: RunOptions) -> dict[str, Any]:
    remove_stale_temps(run_dir.path)  # a checkpoint write cut short by a kill
    opts = replace(opts, resume=resume_or_start(run_dir.path, cfg, opts.resume, this_rank()))
    if opts.resume:
        state = read_state(run_dir.last)
        if state.step >= cfg.train.steps:  # finished: nothing to compile or train, the end summary again
            check_resumable(run_dir.last, state, data, cfg)
            done = finished_summary(run_dir.records(), state.step)
            if done is not None:
                return done
    layout, mesh, rank_device = make_layout(cfg.train.backend, cfg.mesh)
    run: Run | None = None
    try:
        backend = make_backend(cfg.train.backend, opts.device or rank_device, mesh)
        run = Run(data, run_dir, cfg, opts, layout, backend)
        signals.describe_stop(lambda name: interruptions.warm_up_line(name, run.state.step))
        warm = run.warm_up() if run.state.step < cfg.train.steps else run.backend.stats()
        stream = data.train_batches(run.stream_cfg, start=run.state.batches)
        if run.state.step < cfg.train.steps:
            with run.clock.apart("data start-up"):  # opening shards, filling the shuffle buffer: not a step's time
                first = [next(stream) for _ in range(cfg.train.grad_accum)]
            stream = itertools.chain(first, stream)
        run.start_bar()
        signals.describe_stop(lambda name: interruptions.interrupted_line(name, run.state.step, run_dir.last))
        signals.defer()  # from now on a signal stops the run after the step in flight, kept in last.safetensors
        while run.state.step < cfg.train.steps:
            run.phase = f"step {run.state.step + 1}"
            norm = run.step(stream)
            if run.due(cfg.train.log_every):
                run.log_losses(norm)
                run.check_compiles(f"by step {run.state.step}")
            if run.has_val and run.due(cfg.train.val_every):
                run.validate()
            if layout.is_main and run.due(cfg.train.checkpoint_every):
                run.checkpoint()
            if (signum := interruptions.agreed_signal(layout.kind == "ddp")) is not None:
                raise run.stop(signum)
        return run.finish(warm)
    except Exception as e:
        if interruptions.is_out_of_memory(e):
            where = run.phase if run is not None else "building the model and its optimizer"
            raise TrainingError(interruptions.out_of_memory_line(where, e)) from None
        raise
    finally:
        if layout.kind == "ddp":
            close_ddp()
