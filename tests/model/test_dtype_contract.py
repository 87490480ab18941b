"""The dtype contract of every model family, over random small configs: f32 master weights
(each part's day weights, biases and h0 included), bf16 activations under the run's
autocast, f32 log-probabilities and losses for the CTC, int32 output lengths; and on XLA a
bucket's training step compiles once."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import pytest
import torch
import torch_xla.debug.metrics as met
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from b2t.config import Config, ConfigError, GRUConfig, ModelConfig, NoiseSeparatingConfig, TrainConfig
from b2t.contract import COMPUTE_DTYPE, LOSS_DTYPE, PARAM_DTYPE, Batch, BucketShape, empty_batch
from b2t.engine.backend import make_backend
from b2t.engine.optim import make_optimizer
from b2t.engine.step import TOTAL, Stepper
from b2t.model.layers import DayLayer, GRUStack, day_parameters
from b2t.model.registry import build_model
from tests.strategies import family_configs

N_DAYS = 3


def filled_batch(shape: BucketShape, cfg: ModelConfig, seed: int) -> Batch:
    """A batch of `shape` with random features, labels that fit, lengths 0..T and one padding row."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    t = empty_batch(shape)

    def ints(lo: int, hi: int, size: tuple[int, ...], like: str) -> torch.Tensor:
        return torch.randint(lo, hi, size, generator=gen, device="cpu").to(t[like].dtype)

    t["features"] = torch.randn(t["features"].shape, generator=gen, device="cpu").to(t["features"].dtype)
    t["n_time_steps"] = ints(0, shape.T + 1, (shape.B,), "n_time_steps")
    t["phone_seq_lens"] = ints(1, shape.L + 1, (shape.B,), "phone_seq_lens")
    t["seq_class_ids"] = ints(1, 41, t["seq_class_ids"].shape, "seq_class_ids")
    t["day_indices"] = ints(0, N_DAYS, (shape.B,), "day_indices")
    t["n_time_steps"][-1] = t["phone_seq_lens"][-1] = 0  # a padding row
    t["valid"] = (t["n_time_steps"] > 0).to(t["valid"].dtype)
    return Batch(0, t, {})


@settings(max_examples=15, deadline=None)
@given(cfg=family_configs())
def test_every_parameter_is_an_f32_master_weight(cfg):
    model = build_model(cfg, N_DAYS)
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    assert dtypes == dict.fromkeys(dtypes, PARAM_DTYPE)
    days = day_parameters(model)
    n_day_layers = sum(isinstance(m, DayLayer) for m in model.modules())
    assert len(days) == 2 * n_day_layers and n_day_layers == {"gru": 1, "noise_separating": 2}[cfg.family]
    h0 = [m.h0 for m in model.modules() if isinstance(m, GRUStack)]
    assert len(h0) == {"gru": 1, "noise_separating": 3}[cfg.family]
    assert all(p.dtype == PARAM_DTYPE and p.requires_grad for p in [*days.values(), *h0])


@contextlib.contextmanager
def layer_dtypes(model: nn.Module) -> Iterator[list[torch.dtype]]:
    """The output dtype of every day and linear layer call while the context lasts."""
    activations: list[torch.dtype] = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: activations.append(out.dtype))
             for m in model.modules() if isinstance(m, (nn.Linear, DayLayer))]
    try:
        yield activations
    finally:
        for h in hooks:
            h.remove()


@settings(max_examples=15, deadline=None)
@given(cfg=family_configs(), rows=st.integers(2, 4), extra=st.integers(0, 12), seed=st.integers(0, 2**16))
def test_forward_under_the_run_autocast_is_bf16_and_the_ctc_is_f32(cfg, rows, extra, seed):
    backend = make_backend("eager", "cpu")
    model = build_model(cfg, N_DAYS)
    stepper = Stepper(model, None, backend, Config(model=cfg, train=TrainConfig(compute_dtype="bf16")))
    batch = filled_batch(BucketShape(T=cfg.patch_size + extra, B=rows, L=3), cfg, seed)
    with layer_dtypes(model) as activations:
        with backend.autocast():
            heads = model(batch.tensors["features"], batch.tensors["day_indices"])
        nll, frame_ids, out_lens, log_probs = stepper.log_probs_step(batch)
    assert set(heads) == set(model.heads) and {v.dtype for v in heads.values()} == {COMPUTE_DTYPE}
    assert activations and set(activations) == {COMPUTE_DTYPE}, "day layers and linear layers compute in bf16"
    assert log_probs.dtype == LOSS_DTYPE and nll.dtype == LOSS_DTYPE
    assert out_lens.dtype == torch.int32 and frame_ids.dtype == torch.int32
    assert torch.isfinite(log_probs).all() and torch.isfinite(nll).all()
    assert float(nll[-1]) == 0.0, "a padding row costs nothing"


@pytest.mark.parametrize("name", ["bf16", "f32", "auto"])
def test_the_steps_forward_computes_in_train_compute_dtype(name):
    """`train.compute_dtype` reaches every day and linear layer of the step's forward (f32:
    no autocast; auto: f32 only on a CPU without bf16 matmuls); the CTC stays f32 either way."""
    cfg = ModelConfig(gru=GRUConfig(n_units=8, n_layers=2))
    model = build_model(cfg, N_DAYS)
    backend = make_backend("eager", "cpu")
    want = {"bf16": COMPUTE_DTYPE, "f32": PARAM_DTYPE}.get(name, backend.compute_dtype("auto"))
    stepper = Stepper(model, None, backend, Config(model=cfg, train=TrainConfig(compute_dtype=name)))
    with layer_dtypes(model) as activations:
        nll, _, _, log_probs = stepper.log_probs_step(filled_batch(BucketShape(T=cfg.patch_size + 8, B=2, L=3), cfg, 0))
    assert activations and set(activations) == {want}
    assert nll.dtype == log_probs.dtype == LOSS_DTYPE


def test_an_unknown_compute_dtype_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"train.compute_dtype='fp16': choose one of auto, bf16, f32"):
        TrainConfig(compute_dtype="fp16")


def _compile_count() -> int:
    data = met.metric_data("CompileTime")
    return 0 if data is None else data[0]


SMALL_NOISE_SEPARATING = ModelConfig(family="noise_separating", noise_separating=NoiseSeparatingConfig(
    noise=GRUConfig(n_units=8, n_layers=1), clean=GRUConfig(n_units=16, n_layers=2),
    noisy=GRUConfig(n_units=8, n_layers=1), noisy_loss_warmup_steps=10, reversal_warmup_steps=10))


def test_a_bucket_compiles_once_on_xla_while_the_schedules_ramp():
    """Noise-separating family (the GRU family's twin is in tests/model/test_decoder.py): two
    warm-up steps compile the bucket; four more steps, whose loss weight and reversal scale
    keep ramping (steps 3..6 of 10), compile nothing and run nothing on the host."""
    cfg = Config(model=SMALL_NOISE_SEPARATING)
    backend = make_backend("xla")
    model = build_model(cfg.model, N_DAYS).to(backend.device)
    stepper = Stepper(model, make_optimizer(model, cfg.optim), backend, cfg)
    batch = filled_batch(BucketShape(T=62, B=4, L=5), cfg.model, seed=1)
    for step in (1, 2):
        stepper.train_step([batch], step)
    warm = _compile_count()
    for step in (3, 4, 5, 6):
        stepper.train_step([batch], step)
    assert _compile_count() == warm
    assert not [name for name in met.counter_names() if name.startswith("aten::")]
    losses = stepper.take_losses()
    assert set(losses) == {TOTAL, *model.heads} and all(map(math.isfinite, losses.values()))
