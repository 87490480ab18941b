"""When a run may start or continue in a run directory (`b2t.run_dir`), and with what settings.

Besides the run's files, RUN_DIR holds each process's lock (`b2t.run_lock`: one b2t-train per
rank at a time). The rules, checked before anything is loaded or written:
- A new run (no `--resume`) starts only where no earlier run left results: with a
  `last.safetensors` it asks for `--resume`; with `best.safetensors` or trained steps in
  the metrics log but no `last` (deleted, or moved) it is refused. Starting there would
  truncate the log and let the first validation overwrite `best` with a worse model.
- A run that starts from scratch starts only in a new or empty directory, or one that
  holds nothing but b2t-train's own files (`RunDir.foreign`): a RUN_DIR mistyped as the
  HDF5 folder or `.` is refused before a file there is replaced.
- `--resume` without `last.safetensors` starts from scratch only when the earlier run
  ended before its first checkpoint was due (kill -9 early on: nothing lost but those
  steps, which a fresh start repeats exactly); past that, `last` is missing and is refused.
- `--resume` continues the data order exactly (`same_data_order`): a setting that would
  change it is refused, or, for the loader's worker count, the checkpoint's is kept.
- `--resume` continues only the run the checkpoint holds (`resume_state`): the same dataset,
  sessions and config, and as many data readers as before (`check_same_readers`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from b2t.config import Config
from b2t.data.dataset import Dataset
from b2t.engine.checkpoint import TrainState, load_checkpoint, read_state
from b2t.engine.parallel import Layout, torchrun_rank_world
from b2t.paths import METRICS_NAME
from b2t.run_dir import BEST, LAST, RunDir, scan_records
from b2t.train.interruptions import TrainingError

RESULT_KINDS = ("train", "val", "summary")
"""Metrics records that say steps were trained (the others: layout, compile, init)."""


class RunDirError(TrainingError):
    """RUN_DIR cannot take this run as asked; the message says why and what to do."""


def this_rank() -> int:
    """This process's rank among torchrun's (0 outside torchrun): whose lock and metrics log it holds."""
    return (torchrun_rank_world() or (0,))[0]


def _results(run_dir: Path, rank: int) -> tuple[list[str], int, bool]:
    """(what holds results, the last step they reach, whether a summary says the run finished)."""
    held, last_step, finished = [], 0, False
    log = RunDir(run_dir).metrics_of(rank)
    if log.is_file():
        records = [r for r in scan_records(log)[0] if r.get("kind") in RESULT_KINDS]
        if records:
            steps = [r["step"] for r in records if isinstance(r.get("step"), int)]
            last_step, finished = max(steps, default=0), any(r["kind"] == "summary" for r in records)
            held.append(f"{log.name} (steps up to {last_step})")
    if rank == 0 and (run_dir / BEST).exists():
        held.append(BEST)
    return held, last_step, finished


def resume_or_start(run_dir: Path, cfg: Config, resume: bool, rank: int = 0) -> bool:
    """Whether this run resumes `run_dir/last.safetensors` (False: it starts from scratch), by
    the module's rules; RunDirError where the directory holds results a start would lose."""
    last = run_dir / LAST
    if last.exists():
        if not resume:
            raise RunDirError(f"{last} exists: pass --resume to continue it, or choose a new run directory")
        return True
    held, last_step, finished = _results(run_dir, rank)
    lost = f"{run_dir} holds an earlier run's {' and '.join(held)} but no {LAST}"
    if held and not resume:
        raise RunDirError(f"{lost}: a new run here would overwrite them; choose a new run directory, or move "
                          "those files away (restore last.safetensors and pass --resume to continue that run)")
    if not resume:
        _check_empty(run_dir)
        return False
    if finished or last_step >= cfg.train.checkpoint_every:
        raise RunDirError(f"{lost}, although a checkpoint was due by step {cfg.train.checkpoint_every}: it was "
                          f"deleted or moved; restore {last} to continue, or choose a new run directory")
    _check_empty(run_dir)
    tqdm.write(f"note: no {last} yet (stopped before its first checkpoint): starting from scratch")
    return False


def _check_empty(run_dir: Path) -> None:
    """RunDirError where a run starting from scratch would write among files that are not b2t-train's."""
    foreign = RunDir(run_dir).foreign()
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise RunDirError(f"{run_dir} is not empty and holds no b2t-train run ({shown}): a new run writes "
                          f"{LAST}, {METRICS_NAME} and more there; choose a new or empty directory for RUN_DIR")


FREE_ON_RESUME = ("steps", "val_every", "log_every", "checkpoint_every")
"""`train` settings a resumed run may change: none of them changes what a step computes."""
KEPT_ON_RESUME = ("num_workers",)
"""Settings the data order depends on that are machine-dependent: the checkpoint's value is kept."""
NOT_EXACT_ON_RESUME = ("backend", "compute_dtype")
"""Settings that change the step's arithmetic, not the data: the run goes on, not bit-identical."""


def same_data_order(path: Path, saved: dict, cfg: Config) -> Config:
    """`cfg` for resuming the checkpoint at `path`, trained with the config `saved`: its data
    order (loader workers kept as saved, with a note) and draws exactly the saved run's.
    RunDirError names a setting that cannot be kept exact (train.seed, which seeds the shard
    order, the shuffle and every step's draws; shuffle_buffer; grad_accum, the batches per step);
    a note names one that changes the arithmetic (backend, compute dtype)."""
    then = saved.get("train") if isinstance(saved.get("train"), dict) else {}
    now = cfg.to_dict()["train"]
    changed = [k for k in now if k in then and then[k] != now[k] and k not in FREE_ON_RESUME]
    refused = [k for k in changed if k not in KEPT_ON_RESUME + NOT_EXACT_ON_RESUME]
    if refused:
        listed = ", ".join(f"train.{k}={now[k]!r} (trained with {then[k]!r})" for k in refused)
        raise RunDirError(f"{path} cannot continue exactly with {listed}: it changes the data order or the "
                          "batches each step sees; resume with the values it was trained with, or start a new run")
    kept = {k: then[k] for k in changed if k in KEPT_ON_RESUME}
    for k, v in kept.items():
        tqdm.write(f"note: train.{k}={now[k]!r} ignored: {path} was trained with {k}={v!r}, which the data order "
                   "depends on; the run goes on with it, so it continues exactly")
    for k in (k for k in changed if k in NOT_EXACT_ON_RESUME):
        tqdm.write(f"note: {path} was trained with train.{k}={then[k]!r}, this run uses {now[k]!r}: training goes "
                   "on, but not bit-identical to an unbroken run")
    return replace(cfg, train=replace(cfg.train, **kept)) if kept else cfg


def check_same_readers(run_dir: RunDir, layout: Layout) -> None:
    """A resumed run skips `batches` batches of each reader's stream, which is only the same
    position in the data when the shards are split over as many readers as before."""
    before = [r["world"] for r in run_dir.records() if r.get("kind") == "layout"]
    if before and before[-1] != layout.world:
        raise TrainingError(f"{run_dir.path} was trained with {before[-1]} data readers (hosts or torchrun processes), "
                            f"this run has {layout.world}: resume with {before[-1]}")


def resume_state(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: Dataset,
                 cfg: Config) -> TrainState:
    """The checkpoint's state loaded into `model` and `optimizer`, if it is this run's.

    `train` (steps, logging) may change on resume; `mesh` too (the run goes on, recorded
    in the metrics, though not bit-identical to an unbroken run); every other section
    must be the one the checkpoint was trained with.
    """
    state = read_state(path)
    check_resumable(path, state, data, cfg)
    return load_checkpoint(path, model, optimizer)


def check_resumable(path: Path, state: TrainState, data: Dataset, cfg: Config) -> None:
    """`path`'s state was trained on this dataset's data and sessions with this config (see `resume_state`)."""
    trained_on, identity = state.dataset.get("identity"), data.identity()["identity"]
    if trained_on is not None and trained_on != identity:
        raise TrainingError(f"{path} was trained on the dataset at {state.dataset.get('path')} (identity "
                            f"{trained_on[:12]}), {data.root} holds other data (identity {identity[:12]}: "
                            "other shards, batches or sessions): resume on the dataset it was trained on, "
                            "or start a new run directory")
    if state.sessions != data.sessions:
        raise TrainingError(f"{path} was trained on sessions {state.sessions[:3]}..., the shards hold "
                            f"{data.sessions[:3]}...: day indices would not match")
    free = ("train", "mesh")
    saved = {k: v for k, v in state.config.items() if k not in free}
    now = {k: v for k, v in cfg.to_dict().items() if k not in free}
    if saved != now:
        changed = sorted(k for k in now if saved.get(k) != now[k])
        raise TrainingError(f"{path} was trained with different {changed} settings: resume with the same config")


def resumed(run_dir: RunDir, layout: Layout, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
            data: Dataset, cfg: Config) -> tuple[TrainState, Config]:
    """`run_dir`'s last checkpoint loaded into `model` and `optimizer` once every check above
    passes, and the config the run goes on with (`same_data_order`)."""
    check_same_readers(run_dir, layout)
    state = resume_state(run_dir.last, model, optimizer, data, cfg)
    return state, same_data_order(run_dir.last, state.config, cfg)
