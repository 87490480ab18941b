"""`b2t-train --init-from CKPT`: start a run from another checkpoint's weights.

Fine-tuning, or continuing a baseline imported with `b2t-import-baseline`, on a dataset
that need not hold the same sessions: only the weights are taken (the optimizer and the
learning-rate schedule start afresh), and the day layers are matched by session name, not
by index. A session the checkpoint knows gets its trained day layer; a new one keeps the
model's own initialisation (identity weights, zero bias). Every other tensor must have the
same shape in both: a checkpoint of another model size is refused, naming the tensors and
the config keys that differ.

Shape legend: D days (sessions), F = 512 features.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from b2t.config import Config
from b2t.engine.checkpoint import read_checkpoint
from b2t.engine.checkpoint_checks import check_weights
from b2t.errors import B2tError
from b2t.model.layers import day_parameters


class InitError(B2tError, ValueError):
    """The checkpoint cannot initialise this model; the message names what differs."""


@dataclass(frozen=True)
class InitReport:
    source: Path
    kept: list[str]  # sessions whose day layers come from the checkpoint
    new: list[str]  # sessions the checkpoint does not know: identity day layers

    def summary(self) -> str:
        new = f" ({', '.join(self.new[:5])}{', ...' if len(self.new) > 5 else ''})" if self.new else ""
        return (f"initialised from {self.source}: day layers of {len(self.kept)} known sessions kept, "
                f"{len(self.new)} new sessions start from identity{new}; fresh optimizer and schedule")


def _flat(d: dict, prefix: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _size_differences(saved: dict, cfg: Config) -> list[str]:
    """The model.* settings (dropouts aside) that differ between the checkpoint and `cfg`."""
    theirs, ours = _flat(saved, "model."), _flat(cfg.to_dict()["model"], "model.")
    return [f"{k}={theirs.get(k)!r} in the checkpoint, {v!r} here" for k, v in ours.items()
            if theirs.get(k) != v and "dropout" not in k]


def init_from_checkpoint(path: str | Path, model: torch.nn.Module, sessions: Sequence[str], cfg: Config) -> InitReport:
    """Load `path`'s weights into `model` (built for `sessions`, in day order) in place."""
    path = Path(path)
    tensors, meta = read_checkpoint(path)
    state = meta.get("state", {})
    source_sessions = list(state.get("sessions") or [])
    if not source_sessions:
        raise InitError(f"{path} stores no session list: its day layers cannot be matched to this dataset's sessions")
    weights = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
    own = model.state_dict()
    days = list(day_parameters(model))
    problems = check_weights(path, weights, own, per_day=tuple(days))
    if problems:
        sizes = _size_differences(state.get("config", {}).get("model", {}), cfg)
        raise InitError(f"{path} does not fit this model: {'; '.join(problems[:6])}"
                        + (f" ({'; '.join(sizes)})" if sizes else "")
                        + ": use the model sizes the checkpoint was trained with")
    index = {s: i for i, s in enumerate(source_sessions)}
    kept = [s for s in sessions if s in index]
    rows = torch.tensor([d for d, s in enumerate(sessions) if s in index], dtype=torch.int64, device="cpu")
    picks = torch.tensor([index[s] for s in kept], dtype=torch.int64, device="cpu")
    merged = dict(weights)
    for k in days:
        day = own[k].detach().cpu().clone()  # (D, ...) this model's initialisation
        day[rows] = weights[k][picks]
        merged[k] = day
    model.load_state_dict(merged)
    return InitReport(path, kept, [s for s in sessions if s not in index])
