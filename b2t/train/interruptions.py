"""How a training run ends before its last step: stopped by SIGTERM or SIGINT (b2t-train's
side of `b2t.signals`: what a stop keeps and the line that says so), or out of memory (one
line naming where).

Before the first step nothing is worth keeping (a resumed run's checkpoint is on disk
already), so a signal stops the run at once. From the first step on it is deferred: the
step in flight finishes, `last.safetensors` is written at that step, and `--resume`
continues from it exactly as from any checkpoint. Under torchrun every rank must stop
after the same step, or the others would wait in the next all-reduce for ever: the ranks
agree on it with one all-reduce per step (`agreed_signal`).
"""

from __future__ import annotations

import signal
from pathlib import Path

import torch

from b2t import signals
from b2t.engine.checkpoint import read_state
from b2t.errors import B2tError


class TrainingError(B2tError):
    """The run cannot go on (diverged, out of memory, over its compile budget, a run directory
    it may not use); the message says why and what to do."""


def _name(signum: int) -> str:
    return signal.Signals(signum).name


def warm_up_line(name: str, resumed_from: int) -> str:
    """The line of a stop before the first step (`name`: the signal's)."""
    if resumed_from == 0:
        return f"stopped by {name} during the warm-up, before step 1; nothing to keep"
    return (f"stopped by {name} during the warm-up, before step {resumed_from + 1}; nothing new to keep: "
            f"`--resume` continues from {resumed_from}")


def last_checkpoint(last: Path) -> str:
    """`from N (PATH)` for the checkpoint a resume would continue, or that there is none."""
    try:
        return f"from {read_state(last).step} ({last})"
    except (FileNotFoundError, ValueError):
        return "from scratch (no checkpoint yet)"


def interrupted_line(name: str, step: int, last: Path) -> str:
    """The line of a stop that could not finish the step after `step` (a second signal)."""
    return f"stopped by {name} during step {step + 1}, which is not kept: `--resume` continues {last_checkpoint(last)}"


def stopped(signum: int, step: int, last: Path) -> signals.Stopped:
    """What `b2t-train` ends with after keeping step `step` in `last`."""
    return signals.Stopped(signum, f"stopped by {_name(signum)} at step {step}; `--resume` continues from {step} "
                                   f"({last})")


def agreed_signal(ddp: bool) -> int | None:
    """The stop signal pending in this process, or under DDP in any rank (all ranks then stop
    after the same step), else None."""
    signum = signals.pending()
    if not ddp:
        return signum
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    flag = torch.tensor([signum or 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item()) or None


_OOM_WORDS = ("out of memory", "not enough memory", "can't allocate memory", "resource_exhausted", "failed to allocate")


def is_out_of_memory(e: BaseException) -> bool:
    """Whether `e` is a device or host allocation failure (torch's, XLA's, or Python's own)."""
    if isinstance(e, (MemoryError, torch.OutOfMemoryError)):
        return True
    return isinstance(e, RuntimeError) and any(w in str(e).lower() for w in _OOM_WORDS)


def out_of_memory_line(where: str, e: BaseException) -> str:
    """One line for an allocation failure `e` in `where` (e.g. 'step 12')."""
    first = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
    return (f"out of memory in {where} ({first[:160]}): lower data.batch_size or data.token_budget (then re-run "
            "b2t-preprocess) or the model's sizes; `b2t-plan --device-memory SIZE` estimates what fits")
