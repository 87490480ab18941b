"""The training state on the device: gradients and AdamW state made before the first step, and
the snapshot the warm-up restores them from. Both exist so that the graphs traced first are
the ones every later step reuses."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from b2t.engine.backend import Backend
from b2t.engine.mesh import host_copy
from b2t.engine.optim import step_count


def start_training_state(model: nn.Module, optimizer: torch.optim.Optimizer, backend: Backend) -> None:
    """AdamW's state (zero moments, step 0: what its first step would make), as uploads
    (`Backend.zeros`): device data like every later state.

    Without the state up front the first step would trace a state-creating graph no later step
    reuses, and restoring a pre-warm-up snapshot would bring that extra graph back. Gradients
    need nothing: every step's backward creates them and its update drops them
    (`Stepper.update`), the first step's as every later one's.
    """
    for group in optimizer.param_groups:
        capturable = bool(group.get("capturable"))
        for p in group["params"]:
            if not optimizer.state[p]:
                optimizer.state[p] = {
                    "step": step_count(0.0, capturable).to(p.device if capturable else torch.device("cpu")),
                    "exp_avg": backend.zeros(p),
                    "exp_avg_sq": backend.zeros(p),
                }
    backend.sync()  # device buffers now: the first step donates them as every later step does (Backend.donate)


@contextlib.contextmanager
def preserved_state(model: nn.Module, optimizer: torch.optim.Optimizer | None,
                    backend: Backend) -> Iterator[Callable[[], None]]:
    """Yield `restore`, which puts weights and optimizer state back as they were on entry (between
    steps there are no gradients); it also runs on exit. Nothing to keep without an optimizer (evaluation changes no
    weight).

    Kept as host copies, taken once (`mesh.host_copy`: a sharded tensor is read shard by
    shard), and uploaded back: an upload is device data and compiles nothing, where
    device-side clones and copies would be two more graphs. The uploads are whole tensors,
    so an fsdp mesh annotates them again (`Backend.shard`).
    """
    if optimizer is None:
        yield lambda: None
        return
    live = list(model.state_dict().values()) + [t for s in optimizer.state.values() for t in s.values()]
    saved = [host_copy(t) for t in live]

    def restore() -> None:
        with torch.no_grad():
            for t, s in zip(live, saved):
                t.copy_(s)
        backend.shard(model, optimizer)
        backend.sync()

    try:
        yield restore
    finally:
        restore()
