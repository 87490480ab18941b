"""Checkpoints: one safetensors file per checkpoint, written atomically, never pickled.

A file holds the model weights (`model.<name>`), the AdamW state (`optim.<param>.<key>`)
and, as JSON in the safetensors metadata, everything needed to continue exactly: step,
batches consumed, best validation PER, the config, the session list (day index order)
and the optimizer's param-group settings.

Tensors are saved whole even when a mesh shards them (`b2t.engine.mesh.host_copy`), so a
file loads on one device or any mesh; `load_checkpoint` copies into the model's tensors in
place, and the stepper shards them afterwards.

A checkpoint never holds NaN or Inf: `save_checkpoint` refuses to write one, so the file
already at that path is the last finite state, and the error says so. Reading trusts
nothing either: `read_checkpoint`, `read_state` and `load_checkpoint` check the file against
the schema of `b2t.engine.checkpoint_checks` (fields, types, tensor names, finiteness, and
against the model and optimizer: shapes, dtypes, AdamW's state) and name what does not fit.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save as st_save

from b2t.atomic import atomic_write_bytes
from b2t.config import Config, ConfigError, config_from_dict
from b2t.engine.checkpoint_checks import CheckpointError, check_meta, check_optimizer, check_tensors, check_weights
from b2t.engine.mesh import host_copy
from b2t.engine.optim import step_count
from b2t.errors import B2tError, MissingInput
from b2t.paths import not_regular

FORMAT = "b2t-checkpoint-1"


@dataclass
class TrainState:
    step: int = 0  # optimizer steps done
    batches: int = 0  # train batches consumed from the stream
    best_per: float = float("inf")
    best_step: int = -1
    sessions: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    mesh: dict[str, int] = field(default_factory=dict)  # devices per mesh axis of the run that wrote it
    dataset: dict[str, str] = field(default_factory=dict)  # path and identity (Manifest.identity) of its shards


class NonFiniteCheckpoint(B2tError, ValueError):
    """The weights (or loss) to save are NaN/Inf; nothing was written."""


def _refuse_non_finite(path: Path, tensors: dict[str, torch.Tensor], state: TrainState, loss: float | None) -> None:
    bad = next((k for k, v in tensors.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())), None)
    if bad is None and (loss is None or math.isfinite(loss)):
        return
    what = f"{bad} holds NaN/Inf" if bad is not None else f"the loss is {loss}"
    try:
        last = f"the last finite checkpoint is {path} (step {read_state(path).step})"
    except (FileNotFoundError, ValueError):
        last = f"there is no earlier finite checkpoint at {path}"
    raise NonFiniteCheckpoint(f"training diverged by step {state.step}: {what}, so {path} was not written; {last}. "
                              "Lower optim.lr (or check the input features) and resume from it or start again")


def save_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, state: TrainState,
                    *, loss: float | None = None) -> Path:
    """Write weights (and optimizer state) atomically; NonFiniteCheckpoint, and nothing written, if
    any weight, optimizer value or the given `loss` is NaN/Inf."""
    tensors = {f"model.{k}": host_copy(v) for k, v in model.state_dict().items()}  # whole, whatever the mesh
    meta: dict[str, Any] = {"format": FORMAT, "state": state.__dict__}
    if optimizer is not None:
        sd = optimizer.state_dict()
        for i, s in sd["state"].items():
            for k, v in s.items():
                tensors[f"optim.{i}.{k}"] = host_copy(torch.as_tensor(v))
        # b2t's learning rates are device tensors (b2t.engine.optim); JSON takes their value
        meta["param_groups"] = [{k: v.cpu().item() if isinstance(v, torch.Tensor) else v for k, v in g.items()}
                                for g in sd["param_groups"]]
    _refuse_non_finite(path, tensors, state, loss)
    return atomic_write_bytes(path, st_save(tensors, metadata={"b2t": json.dumps(meta)}))


def _read(path: Path, with_tensors: bool) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    if not path.exists():
        raise MissingInput(f"checkpoint {path} not found")
    if (why := not_regular(path)) is not None:
        raise CheckpointError(f"{why}: expected a b2t checkpoint")
    with open(path, "rb"):  # the OS's own error (EACCES names the path); safetensors reports it as "No such file"
        pass
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("b2t", "{}"))
            tensors = {k: f.get_tensor(k) for k in f.keys()} if with_tensors else {}
    except Exception as e:  # safetensors raises several types for a damaged header
        raise CheckpointError(f"{path} is not a readable b2t checkpoint: {e}") from None
    if isinstance(meta, dict) and meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a {FORMAT} file (format {meta.get('format')!r})")
    meta = check_meta(path, meta)
    check_tensors(path, tensors)
    return tensors, meta


def read_state(path: Path) -> TrainState:
    """The TrainState of a checkpoint, from its header alone (no tensor is read)."""
    return TrainState(**_read(path, with_tensors=False)[1]["state"])


def trained_config(path: Path) -> tuple[TrainState, Config]:
    """A checkpoint's state and the config it was trained with (from its header), for rebuilding
    its model on its own; CheckpointError naming `path` when it cannot be."""
    state = read_state(path)
    if not state.config or not state.sessions:
        raise CheckpointError(f"{path} stores no config or session list: it cannot be rebuilt on its own")
    try:
        return state, config_from_dict(state.config)
    except ConfigError as e:
        raise CheckpointError(f"{path}: its saved config does not fit this b2t: {e}") from None


def read_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """All tensors and the metadata of a checkpoint file; clear errors for anything else."""
    return _read(path, with_tensors=True)


def _optimizer_state(tensors: dict[str, torch.Tensor], groups: list[dict[str, Any]]) -> dict[int, dict[str, torch.Tensor]]:
    """The `optim.<i>.<key>` tensors as AdamW's state, in the order a fresh run creates it:
    parameters in index order, each one's step count first (shaped by `optim.step_count`).

    The order matters on XLA: a lazy graph's inputs and outputs follow the order the
    tensors were made in, so state loaded in another order (the file's sorted keys: 0, 1,
    10, ..., exp_avg before step) traced graphs of their own in a process that had compiled
    the fresh run's (measured: a resumed warm-up compiled a new train-step graph).
    """
    capturable = [bool(g.get("capturable")) for g in groups for _ in g["params"]]
    state: dict[int, dict[str, torch.Tensor]] = {}
    for k in sorted((k for k in tensors if k.startswith("optim.")), key=lambda k: int(k.split(".")[1])):
        _, i, key = k.split(".", 2)
        state.setdefault(int(i), {})[key] = tensors[k]
    for i, s in state.items():
        if "step" in s and i < len(capturable):  # else load_state_dict says what does not fit
            state[i] = {"step": step_count(s["step"], capturable[i]), **{k: s[k] for k in sorted(s) if k != "step"}}
    return state


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> TrainState:
    """Load weights (and optimizer state when given) in place; returns the saved TrainState.
    Nothing is loaded unless the whole file fits (`checkpoint_checks`)."""
    tensors, meta = read_checkpoint(path)
    weights = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
    problems = check_weights(path, weights, model.state_dict())
    if problems:
        raise CheckpointError(f"{path}: weights do not fit the model: {'; '.join(problems[:6])}")
    state = TrainState(**meta["state"])
    if optimizer is not None:
        if "param_groups" not in meta:
            raise CheckpointError(f"{path} holds no optimizer state: cannot resume training from it")
        check_optimizer(path, tensors, meta["param_groups"], optimizer, state.step)
    model.load_state_dict(weights)
    if optimizer is not None:
        optimizer.load_state_dict({"state": _optimizer_state(tensors, meta["param_groups"]),
                                   "param_groups": meta["param_groups"]})
    return state
