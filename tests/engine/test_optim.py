"""Optimizer: reference groups, exact schedules, tensor learning rates that never recompile on XLA."""

import math

import pytest
import torch
import torch_xla
import torch_xla.debug.metrics as met
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from b2t.config import OptimConfig
from b2t.engine.optim import lr_at, make_optimizer, param_groups, set_lrs
from b2t.model.layers import DayLayer

XLA = torch_xla.device()
"""Made at import: autograd only serves devices that exist when it first runs a backward."""

CFG = OptimConfig(lr=0.01, lr_min=0.001, lr_day=0.02, lr_day_min=0.002, warmup_steps=4, decay_steps=12,
                  weight_decay=0.05, weight_decay_day=0.01)


class _Gru(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight_ih_l0 = nn.Parameter(torch.randn((6, 4), dtype=torch.float32, device="cpu"))
        self.bias_ih_l0 = nn.Parameter(torch.randn((6,), dtype=torch.float32, device="cpu"))


class Toy(nn.Module):
    """The reference decoder's parameter names, in miniature."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.day = DayLayer(3, 4)
        with torch.no_grad():
            self.day.weight.copy_(torch.randn((3, 4, 4), dtype=torch.float32, device="cpu"))
            self.day.bias.copy_(torch.randn((3, 1, 4), dtype=torch.float32, device="cpu"))
        self.gru = _Gru()
        self.h0 = nn.Parameter(torch.randn((1, 1, 6), dtype=torch.float32, device="cpu"))
        self.out = nn.Linear(6, 2, dtype=torch.float32, device="cpu")

    def forward(self, x: torch.Tensor, day: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(torch.einsum("bi,bij->bj", x, self.day.weight[day]) + self.day.bias[day][:, 0])
        h = torch.tanh(x @ self.gru.weight_ih_l0.T + self.gru.bias_ih_l0 + self.h0[0])
        return self.out(h)


def _loss(model: nn.Module, device: torch.device) -> torch.Tensor:
    x = torch.linspace(-1, 1, 20, dtype=torch.float32, device="cpu").view(5, 4).to(device)
    day = torch.tensor([0, 1, 2, 0, 1], dtype=torch.int64, device="cpu").to(device)
    return model(x, day).square().mean()


def test_schedule_exact_values():
    peak, floor, warmup, end = 0.005, 0.0001, 1000, 120_000
    assert lr_at(0, peak, floor, warmup, end) == 0.0
    assert lr_at(500, peak, floor, warmup, end) == pytest.approx(peak / 2, rel=1e-12)
    assert lr_at(warmup, peak, floor, warmup, end) == pytest.approx(peak, rel=1e-12)
    mid = warmup + (end - warmup) // 2
    assert lr_at(mid, peak, floor, warmup, end) == pytest.approx((peak + floor) / 2, rel=1e-12)
    quarter = warmup + (end - warmup) // 4
    assert lr_at(quarter, peak, floor, warmup, end) == pytest.approx(
        floor + (peak - floor) * (1 + math.sqrt(0.5)) / 2, rel=1e-12)
    assert lr_at(end, peak, floor, warmup, end) == floor
    assert lr_at(end + 12345, peak, floor, warmup, end) == floor
    assert lr_at(0, peak, floor, 0, end) == peak  # no warm-up: the cosine starts at its peak


@given(warmup=st.integers(0, 50), extra=st.integers(1, 100), peak=st.floats(1e-5, 1.0), ratio=st.floats(0.0, 1.0))
def test_schedule_rises_then_falls_within_bounds(warmup, extra, peak, ratio):
    floor, end = peak * ratio, warmup + extra
    lrs = [lr_at(s, peak, floor, warmup, end) for s in range(end + 5)]
    rise, fall = lrs[: warmup + 1], lrs[warmup:]
    assert all(a <= b for a, b in zip(rise, rise[1:]))
    assert all(a >= b - 1e-15 for a, b in zip(fall, fall[1:]))
    assert all(0.0 <= v <= peak + 1e-15 for v in lrs)
    assert lrs[-1] == floor


def test_groups_cover_every_parameter_once_with_the_reference_decay():
    model = Toy()
    model.out.bias.requires_grad_(False)  # frozen parameters are not optimized
    groups = param_groups(model, CFG)
    names = {id(p): n for n, p in model.named_parameters()}
    by_group = {g["name"]: sorted(names[id(p)] for p in g["params"]) for g in groups}
    assert by_group == {
        "decay": ["gru.weight_ih_l0", "h0", "out.weight"],
        "no_decay": ["gru.bias_ih_l0"],
        "day": ["day.bias", "day.weight"],
    }
    assert {g["name"]: g["weight_decay"] for g in groups} == {"decay": 0.05, "no_decay": 0.0, "day": 0.01}


def test_set_lrs_writes_each_groups_schedule():
    opt = make_optimizer(Toy(), CFG)
    assert not opt.defaults["capturable"]  # CPU: Adam's step count stays a host value
    for step in (0, 2, 4, 9, 30):
        applied = set_lrs(opt, step, CFG)
        main = lr_at(step, CFG.lr, CFG.lr_min, CFG.warmup_steps, CFG.decay_steps)
        day = lr_at(step, CFG.lr_day, CFG.lr_day_min, CFG.warmup_steps, CFG.decay_steps)
        assert applied == {"decay": main, "no_decay": main, "day": day}
        for g in opt.param_groups:
            assert g["lr"].shape == (1,) and g["lr"].dtype == torch.float32
            assert float(g["lr"]) == pytest.approx(day if g["name"] == "day" else main, rel=1e-6)


def test_tensor_lrs_step_like_float_lrs():
    """Our optimizer takes the same steps as a plain AdamW given the schedule as floats."""
    ours_model, plain_model = Toy(seed=3), Toy(seed=3)
    ours = make_optimizer(ours_model, CFG)
    plain = torch.optim.AdamW(param_groups(plain_model, CFG), lr=0.0, betas=(CFG.beta1, CFG.beta2), eps=CFG.eps)
    for step in range(8):
        for model, opt in ((ours_model, ours), (plain_model, plain)):
            opt.zero_grad()
            _loss(model, torch.device("cpu")).backward()
        lrs = set_lrs(ours, step, CFG)
        for g in plain.param_groups:
            g["lr"] = lrs[g["name"]]
        ours.step()
        plain.step()
    for (name, a), b in zip(ours_model.named_parameters(), plain_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("stored_lr", [0.5, None])
def test_set_lrs_restores_tensor_lrs_after_loading_json_groups(stored_lr):
    """A checkpoint may keep the groups as JSON: lr as a float, or left out (the schedule rebuilds it)."""
    model = Toy()
    opt = make_optimizer(model, CFG)
    saved = opt.state_dict()
    groups = [{k: v for k, v in g.items() if k != "lr"} for g in saved["param_groups"]]
    saved["param_groups"] = groups if stored_lr is None else [{**g, "lr": stored_lr} for g in groups]
    opt.load_state_dict(saved)
    set_lrs(opt, 2, CFG)
    for g in opt.param_groups:
        assert isinstance(g["lr"], torch.Tensor) and g["lr"].shape == (1,)
    _loss(model, torch.device("cpu")).backward()
    opt.step()


def test_model_on_several_devices_is_refused():
    model = Toy()
    model.out.to(XLA)
    with pytest.raises(ValueError, match="span devices"):
        make_optimizer(model, CFG)


def test_on_xla_changing_lrs_never_recompile():
    """lr 0, warm-up values so small that `1 - lr * wd` rounds to 1 in float32, peak and floor:
    a float lr would make graph constants of the first two; the tensor lr gives one graph.

    Step 1 compiles a second graph because AdamW creates its moments on the first step.
    """
    cfg = OptimConfig(lr=0.01, lr_min=0.001, lr_day=0.02, lr_day_min=0.002, warmup_steps=10**9,
                      decay_steps=2 * 10**9, weight_decay=0.05, weight_decay_day=0.01)
    steps = [0, 1, 0, 2, 10**9, 0, 3, 2 * 10**9]
    cpu_model, model = Toy(seed=5), Toy(seed=5).to(XLA)
    opt, cpu_opt = make_optimizer(model, cfg), make_optimizer(cpu_model, cfg)
    assert opt.defaults["capturable"]
    torch_xla.sync()
    met.clear_all()
    compiles = []
    for step in steps:
        for m, o, d in ((model, opt, XLA), (cpu_model, cpu_opt, torch.device("cpu"))):
            o.zero_grad()
            _loss(m, d).backward()
            set_lrs(o, step, cfg)
            o.step()
        torch_xla.sync()
        compiles.append((met.metric_data("CompileTime") or [0])[0])
    assert compiles[1:] == [compiles[1]] * (len(steps) - 1), f"compilations after each step: {compiles}"
    assert [c for c in met.counter_names() if c.startswith("aten::")] == []
    for (name, a), b in zip(model.named_parameters(), cpu_model.parameters()):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-5, msg=name)


def test_first_warm_up_step_keeps_untouched_weights_finite_on_xla():
    """Step 0 has lr 0; capturable AdamW divides by lr, so a zero-gradient weight must not become 0/0."""
    model = Toy().to(XLA)
    opt = make_optimizer(model, OptimConfig(warmup_steps=10, decay_steps=100))
    model.out.weight.sum().backward()  # only out.weight gets a gradient; day_weights stays at zero
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    set_lrs(opt, 0, OptimConfig(warmup_steps=10, decay_steps=100))
    opt.step()
    torch_xla.sync()
    assert all(bool(torch.isfinite(p.cpu()).all()) for p in model.parameters())
