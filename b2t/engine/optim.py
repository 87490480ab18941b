"""AdamW with the reference's parameter groups and warm-up + cosine learning-rate schedules.

Groups (as the public baseline): the day layers (the parameters of every
`b2t.model.layers.DayLayer`, in any model family) have their own learning rate and weight
decay; biases (GRU and output) get no weight decay; every other parameter, `h0` included
(the reference decays it too), gets `weight_decay`.

Learning rates are tensors on the parameters' device, a new upload each step, with
`capturable=True` on XLA and CUDA so Adam's bias corrections also stay on the device.
Why: under lazy XLA tracing a Python float becomes device data, except values that round
to 0 or +-1 in float32, which torch_xla bakes into the graph as constants. A float lr
therefore recompiles the step when the warm-up starts at lr 0, while `1 - lr * wd` rounds
to 1 early in the warm-up, and when Adam's host-side bias correction `sqrt(1 - beta2**t)`
rounds to 1 (t about 16,600 for beta2 0.999). A tensor copied in from the host is always
device data, whatever its value, so the step compiles once. A new tensor, not one written in
place: under SPMD torch_xla then took a written-in-place lr for a buffer the step could reuse in
some steps and not in others, and the donated buffers are part of the graph's hash
(`b2t.engine.backend.Backend.donate`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from b2t.config import OptimConfig
from b2t.model.layers import day_parameters

_CAPTURABLE_DEVICES = ("xla", "cuda")
"""Devices where torch's AdamW keeps its step count on the device (`capturable=True`)."""


def _is_bias(name: str) -> bool:
    leaf = name.rsplit(".", 1)[-1]
    return leaf.startswith("bias") or leaf.endswith("bias")  # `bias`, GRU's `bias_ih_l0`, `bias_hh_l0`


def param_groups(model: nn.Module, cfg: OptimConfig) -> list[dict[str, Any]]:
    """The model's trainable parameters split into named groups (empty groups left out).

    `decay`: weights, with `cfg.weight_decay`; `no_decay`: biases, weight decay 0; `day`:
    the day layers, with `cfg.weight_decay_day` (and `cfg.lr_day` via `set_lrs`).
    """
    members: dict[str, list[nn.Parameter]] = {"decay": [], "no_decay": [], "day": []}
    day_params = {id(p) for p in day_parameters(model).values()}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) in day_params:
            members["day"].append(p)
        elif _is_bias(name):
            members["no_decay"].append(p)
        else:
            members["decay"].append(p)
    decay = {"decay": cfg.weight_decay, "no_decay": 0.0, "day": cfg.weight_decay_day}
    groups = [{"name": k, "params": ps, "weight_decay": decay[k]} for k, ps in members.items() if ps]
    n_grouped = sum(len(g["params"]) for g in groups)
    n_trainable = sum(1 for p in model.parameters() if p.requires_grad)
    assert n_grouped == n_trainable, f"{n_grouped} parameters grouped, {n_trainable} trainable"
    return groups


def make_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW over `param_groups`; build it after the model is on its device.

    Each group's lr is a (1,) float32 tensor on that device (0 until `set_lrs` runs).
    """
    devices = {p.device for p in model.parameters()}
    if len(devices) != 1:
        raise ValueError(f"the model's parameters span devices {sorted(map(str, devices))}; "
                         "move it to one device first")
    (device,) = devices
    groups = param_groups(model, cfg)
    for g in groups:
        g["lr"] = torch.zeros((1,), dtype=torch.float32, device="cpu").to(device)  # device data, not a constant
    # every group has its own lr tensor; a float default keeps AdamW's `0 <= lr` check on the host
    return torch.optim.AdamW(groups, lr=0.0,
                             betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                             capturable=device.type in _CAPTURABLE_DEVICES)


def step_count(value: float | torch.Tensor, capturable: bool) -> torch.Tensor:
    """AdamW's step count as b2t keeps it, a host f32 tensor the optimizer then moves: shape
    (1,) where AdamW is capturable (the count lives on the device), else 0-dim (torch's own).

    Why (1,) on the device: torch_xla uploads a 0-dim tensor through a cache keyed by its
    value, so every equal count became one shared graph input (fresh zeros, or the equal
    counts a checkpoint restores) while counts a step computed are one input each: the step's
    graph then depended on the counts' values, and a resumed run compiled graphs a fresh one
    had not (docs/xla-facts.md, item 14).
    A (1,) upload is device data of its own, whatever its value.
    """
    return torch.as_tensor(value, dtype=torch.float32, device="cpu").reshape((1,) if capturable else ())


_LR_EPSILON = 1e-30
"""Smallest lr written to a group: an update this small is zero in f32, yet finite."""


def lr_at(step: int, peak: float, floor: float, warmup: int, decay_end: int) -> float:
    """Learning rate at optimizer step `step` (0-based).

    Linear from 0 at step 0 to `peak` at step `warmup`; cosine from `peak` down to `floor`
    between steps `warmup` and `decay_end`; `floor` from then on.
    """
    if step < warmup:
        return peak * step / warmup
    if step >= decay_end:
        return floor
    progress = (step - warmup) / (decay_end - warmup)
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_lrs(optimizer: torch.optim.Optimizer, step: int, cfg: OptimConfig) -> dict[str, float]:
    """Write step `step`'s learning rates into every group; returns them by group name.

    Each group's lr becomes a (1,) tensor copied from the host to its parameters' device
    (device data on XLA, whatever the value: no recompilation; see the module docstring).
    """
    main = lr_at(step, cfg.lr, cfg.lr_min, cfg.warmup_steps, cfg.decay_steps)
    day = lr_at(step, cfg.lr_day, cfg.lr_day_min, cfg.warmup_steps, cfg.decay_steps)
    applied = {}
    for g in optimizer.param_groups:
        name = g.get("name", "decay")
        value = day if name == "day" else main
        # Capturable AdamW divides by lr: at exactly 0 (the warm-up's first step) a weight
        # whose gradient and moments are 0 (a day absent so far) becomes 0/0 = NaN.
        host = torch.tensor([max(value, _LR_EPSILON)], dtype=torch.float32, device="cpu")
        g["lr"] = host.to(g["params"][0].device)
        applied[name] = value
    return applied
