"""What a checkpoint must hold before anything is loaded from it: the checked reader's schema.

A checkpoint is user input: copied between machines, written by another b2t version, cut
short, edited. Loading trusted it: an extra state field (what a newer b2t writes) ended in a
TypeError, metadata of the wrong JSON type in an AttributeError, an AdamW moment of the wrong
shape in a traceback from inside torch's adam.py at the first step, NaN weights evaluated to
PER 1.0 (exit 0) and resumed into a run whose "last good checkpoint" was that same file,
integer weights were cast silently and a missing step restarted the count at 0. Each check
here names the file and what is wrong, as a `CheckpointError` (a ValueError).

Shape legend: P a parameter's own shape.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import torch

from b2t.errors import B2tError

STATE_FIELDS: dict[str, tuple[type, ...]] = {
    "step": (int,), "batches": (int,), "best_per": (int, float), "best_step": (int,),
    "sessions": (list,), "config": (dict,), "mesh": (dict,), "dataset": (dict,),
}
"""TrainState's fields as JSON types; every field but `OPTIONAL_FIELDS` is required."""
OPTIONAL_FIELDS = ("mesh", "dataset")
"""Fields added within this format: a file without them predates them (empty = unknown)."""
ADAM_KEYS = ("step", "exp_avg", "exp_avg_sq")
_OPTIM_NAME = re.compile(r"optim\.(\d+)\.(\w+)")


class CheckpointError(B2tError, ValueError):
    """A checkpoint that cannot be used as it is; the message names the file and the problem."""


def _json_type(value: Any) -> str:
    names = {str: "string", list: "list", dict: "object", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def check_state(path: object, state: Any) -> dict[str, Any]:
    """The saved TrainState fields, checked: every required one there, of its type, none unknown."""
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{path}: its saved state is a JSON {_json_type(state)}, expected an object")
    unknown = sorted(set(state) - set(STATE_FIELDS))
    if unknown:
        raise CheckpointError(f"{path} holds state fields this b2t does not know ({', '.join(unknown)}): it was "
                              "written by a newer b2t; use that version (or a newer one) to read it")
    missing = [k for k in STATE_FIELDS if k not in state and k not in OPTIONAL_FIELDS]
    if missing:
        raise CheckpointError(f"{path}: its saved state lacks {', '.join(missing)}: not a checkpoint b2t wrote "
                              "(a run cannot continue from an unknown step)")
    for key, value in state.items():
        types = STATE_FIELDS[key]
        if not isinstance(value, types) or isinstance(value, bool):
            raise CheckpointError(f"{path}: state field {key} is {value!r}, expected "
                                  f"{' or '.join(t.__name__ for t in types)}")
    problems = [f"{k} is {state[k]} (< 0)" for k in ("step", "batches") if state[k] < 0]
    problems += ["best_per is NaN"] if isinstance(state["best_per"], float) and math.isnan(state["best_per"]) else []
    problems += [] if all(isinstance(s, str) for s in state["sessions"]) else ["sessions holds non-strings"]
    if problems:
        raise CheckpointError(f"{path}: its saved state is invalid: {'; '.join(problems)}")
    return dict(state)


def check_meta(path: object, meta: Any) -> dict[str, Any]:
    """The `b2t` metadata, checked: an object whose `state` passes `check_state` and whose
    `param_groups`, if any, are objects listing parameter indices."""
    if not isinstance(meta, Mapping):
        raise CheckpointError(f"{path}: its b2t metadata is a JSON {_json_type(meta)}, expected an object")
    meta = {**meta, "state": check_state(path, meta.get("state"))}
    groups = meta.get("param_groups")
    if groups is not None and not (isinstance(groups, list) and all(
            isinstance(g, dict) and isinstance(g.get("params"), list) and all(isinstance(i, int) for i in g["params"])
            for g in groups)):
        raise CheckpointError(f"{path}: its optimizer param_groups are not a list of groups of parameter indices")
    return meta


def check_tensors(path: object, tensors: Mapping[str, torch.Tensor]) -> None:
    """Every tensor named `model.<name>` or `optim.<index>.<key>`, and every float one finite."""
    for name, t in tensors.items():
        if not name.startswith("model.") and not _OPTIM_NAME.fullmatch(name):
            raise CheckpointError(f"{path}: unexpected tensor {name!r} (a checkpoint holds model.* and optim.<i>.<key>)")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{path}: {name} holds NaN/Inf: the weights had diverged (b2t never writes such "
                                  "a file; it was made elsewhere or damaged): use an earlier checkpoint")


def check_weights(path: object, weights: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor],
                  per_day: tuple[str, ...] = ()) -> list[str]:
    """What keeps `weights` (the file's model.* tensors) from loading into a model whose state
    dict is `own`: missing or extra names, other shapes (for the `per_day` tensors only the
    shape after the day axis) and other dtypes, one line each ([] when they fit)."""
    problems = [f"{k} is missing" for k in own if k not in weights]
    problems += [f"{k} is not in this model" for k in weights if k not in own]
    for k, v in own.items():
        if k not in weights:
            continue
        theirs, ours, each = tuple(weights[k].shape), tuple(v.shape), ""
        if k in per_day:
            theirs, ours, each = theirs[1:], ours[1:], " per day"
        if theirs != ours:
            problems.append(f"{k} is {theirs}{each} in the checkpoint, {ours} here")
        elif weights[k].dtype != v.dtype:
            problems.append(f"{k} is {str(weights[k].dtype).removeprefix('torch.')} in the checkpoint, "
                            f"{str(v.dtype).removeprefix('torch.')} here")
    return problems


def check_optimizer(path: object, tensors: Mapping[str, torch.Tensor], groups: list[dict[str, Any]],
                    optimizer: torch.optim.Optimizer, step: int) -> None:
    """The file's AdamW state fits `optimizer`: its groups hold as many parameters, and every
    parameter has a step count equal to the checkpoint's `step` and moments of its shape P
    (or none has any state: an optimizer saved before its first step)."""
    ours = [len(g["params"]) for g in optimizer.param_groups]
    theirs = [len(g["params"]) for g in groups]
    if ours != theirs:
        raise CheckpointError(f"{path}: its optimizer has parameter groups of {theirs} parameters, this model's "
                              f"{ours}: not this model's optimizer state")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    found: dict[int, set[str]] = {}
    for name, t in tensors.items():
        m = _OPTIM_NAME.fullmatch(name)
        if m is None:
            continue
        i, key = int(m.group(1)), m.group(2)
        if i >= len(params) or key not in ADAM_KEYS:
            raise CheckpointError(f"{path}: unexpected optimizer tensor {name} (this model has {len(params)} "
                                  f"parameters, AdamW keeps {', '.join(ADAM_KEYS)})")
        found.setdefault(i, set()).add(key)
        if key == "step":
            if t.numel() != 1 or float(t.reshape(())) != step:
                raise CheckpointError(f"{path}: {name} is {t.tolist()}, the checkpoint's step is {step}: its "
                                      "optimizer state and its step disagree (assembled from two checkpoints?)")
        elif tuple(t.shape) != tuple(params[i].shape) or t.dtype != params[i].dtype:
            raise CheckpointError(f"{path}: {name} is {str(t.dtype).removeprefix('torch.')} {tuple(t.shape)}, its "
                                  f"parameter is {str(params[i].dtype).removeprefix('torch.')} {tuple(params[i].shape)}")
    incomplete = [i for i in range(len(params)) if found.get(i) != set(ADAM_KEYS)]
    if incomplete and found:  # (no state at all: an optimizer saved before its first step)
        i = incomplete[0]
        raise CheckpointError(f"{path}: AdamW's state of parameter {i} lacks "
                              f"{', '.join(sorted(set(ADAM_KEYS) - found.get(i, set())))}"
                              + (f" ({len(incomplete)} parameters incomplete)" if len(incomplete) > 1 else ""))
