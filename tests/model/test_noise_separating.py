"""The noise-separating family: its parts and sizes, the 687M config, the gradient reversal
between the NoiseModel and the NoisySpeechModel, the warm-up ramps, and its start as a GRU decoder."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from b2t.config import CONFIG_DIR, ConfigError, GRUConfig, ModelConfig, NoiseSeparatingConfig, load_config
from b2t.contract import FEATURE_DIM
from b2t.model.decoder import CTC_HEAD, GRUDecoder
from b2t.model.layers import patches
from b2t.model.noise_separating import NoiseSeparatingDecoder
from b2t.model.noise_separating.decoder import CLEAN_HEAD, NOISY_HEAD, REVERSAL, ramp
from b2t.model.registry import count_parameters
from b2t.phonemes import N_CLASSES

PARTS = NoiseSeparatingConfig(noise=GRUConfig(n_units=8, n_layers=1), clean=GRUConfig(n_units=16, n_layers=2),
                              noisy=GRUConfig(n_units=12, n_layers=1))
SMALL = ModelConfig(family="noise_separating", patch_size=4, patch_stride=2, input_dropout=0.0, noise_separating=PARTS)
N_DAYS = 3


def gru_params(d_in: int, h: int, layers: int) -> int:
    """torch's GRU parameters plus h0."""
    return 3 * h * (d_in + h) + 6 * h + (layers - 1) * (3 * h * 2 * h + 6 * h) + h


def inputs(seed: int = 0, rows: int = 3, n_time: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(rows, n_time, FEATURE_DIM, generator=gen, device="cpu")
    return x, torch.randint(0, N_DAYS, (rows,), generator=gen, device="cpu").to(torch.int32)


def test_parts_and_their_sizes():
    D, day = SMALL.patch_size * FEATURE_DIM, N_DAYS * (FEATURE_DIM**2 + FEATURE_DIM)
    parts = {
        "noise": day + gru_params(D, 8, 1) + 8 * D + D,  # linear back to the patch width
        "clean": day + gru_params(D, 16, 2) + 16 * N_CLASSES + N_CLASSES,
        "noisy": gru_params(D, 12, 1) + 12 * N_CLASSES + N_CLASSES,  # no day layer
    }
    assert count_parameters(SMALL, N_DAYS) == {**parts, "total": sum(parts.values())}
    keys = NoiseSeparatingDecoder(N_DAYS, SMALL).state_dict()
    assert {k for k in keys if k.endswith("h0")} == {"noise.gru.h0", "clean.gru.h0", "noisy.gru.h0"}
    assert {k for k in keys if ".day." in k} == {"noise.day.weight", "noise.day.bias", "clean.day.weight", "clean.day.bias"}


def test_the_687m_config_has_687m_parameters_with_45_days():
    counts = count_parameters(load_config(CONFIG_DIR / "noise687m.yaml").model, 45)
    assert counts["total"] == pytest.approx(687e6, rel=0.02)
    assert set(counts) == {"noise", "clean", "noisy", "total"}


def test_at_init_the_clean_head_is_a_gru_decoder_on_the_plain_patches():
    """The NoiseModel's output layer starts at zero: the clean path reads unchanged patches."""
    torch.manual_seed(0)
    model = NoiseSeparatingDecoder(N_DAYS, SMALL).eval()
    gru = GRUDecoder(N_DAYS, ModelConfig(patch_size=4, patch_stride=2, input_dropout=0.0, gru=PARTS.clean))
    gru.load_state_dict({k.removeprefix("clean."): v for k, v in model.state_dict().items() if k.startswith("clean.")})
    x, days = inputs()
    torch.testing.assert_close(model(x, days)[CLEAN_HEAD], gru.eval()(x, days)[CTC_HEAD])


@pytest.mark.parametrize("scale", [0.5, 2.0])
def test_the_noisy_loss_reaches_the_noise_model_reversed_and_scaled(scale):
    torch.manual_seed(1)
    model = NoiseSeparatingDecoder(N_DAYS, SMALL).train()
    with torch.no_grad():
        model.noise.out.weight.normal_()  # a nonzero estimate, so gradients reach the noise GRU
    x, days = inputs(seed=2)
    model(x, days, schedule={REVERSAL: torch.tensor([scale])})[NOISY_HEAD].square().mean().backward()
    reversed_grads = {n: p.grad.clone() for n, p in model.noise.named_parameters()}
    noisy_grads = {n: p.grad.clone() for n, p in model.noisy.named_parameters()}
    model.zero_grad()
    # the same loss straight through: the noisy GRU fed the estimate directly
    noise = model.noise.estimate(patches(model.noise.day(x, days), 4, 2))
    model.noisy.out(model.noisy.gru(noise)).square().mean().backward()
    for n, p in model.noise.named_parameters():
        torch.testing.assert_close(reversed_grads[n], -scale * p.grad, msg=n)
    for n, p in model.noisy.named_parameters():
        torch.testing.assert_close(noisy_grads[n], p.grad, msg=f"{n}: the noisy reader itself learns normally")
    assert model.clean.day.weight.grad is None or not model.clean.day.weight.grad.any()


def test_evaluation_runs_only_the_clean_head():
    model = NoiseSeparatingDecoder(N_DAYS, SMALL).eval()
    x, days = inputs()
    assert set(model(x, days, heads=(CLEAN_HEAD,))) == {CLEAN_HEAD}
    assert set(model(x, days)) == {CLEAN_HEAD, NOISY_HEAD} and model.decode_head == CLEAN_HEAD


@given(value=st.floats(0, 10), warmup=st.integers(0, 1000), step=st.integers(0, 3000))
def test_ramps_rise_linearly_from_zero_to_their_value(value, warmup, step):
    r = ramp(step, value, warmup)
    assert 0.0 <= r <= value
    assert r == (value if step >= warmup else pytest.approx(value * step / warmup))
    assert ramp(step + 1, value, warmup) >= r


def test_the_model_schedules_its_loss_weight_and_reversal():
    cfg = NoiseSeparatingConfig(noisy_loss_weight=0.5, noisy_loss_warmup_steps=10, reversal_scale=2.0,
                                reversal_warmup_steps=4)
    model = NoiseSeparatingDecoder(1, ModelConfig(family="noise_separating", noise_separating=cfg),
                                   device=torch.device("meta"))
    assert model.loss_weights(5) == {CLEAN_HEAD: 1.0, NOISY_HEAD: 0.25}
    assert model.schedule(2) == {REVERSAL: 1.0} and model.schedule(400) == {REVERSAL: 2.0}


@pytest.mark.parametrize(("override", "message"), [
    ("model.noise_separating.noisy.n_units=0", "model.noise_separating.noisy: n_units and n_layers must be in 1..65536"),
    ("model.noise_separating.reversal_scale=-1", "noisy_loss_weight and reversal_scale must be >= 0"),
    ("model.noise_separating.clean.rnn_dropout=1.0", "model.noise_separating.clean: rnn_dropout must be in"),
    ("model.noise_separating.noise.units=3", "did you mean 'n_units'"),
])
def test_bad_noise_separating_values_say_where(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(CONFIG_DIR / "noise_tiny.yaml", [override])


def test_the_forward_is_one_graph_with_a_custom_op_per_gru():
    """Three GRU stacks, no cut in dynamo's graph: each is one custom-op node (`b2t::gru_layers`
    on the CPU)."""
    model = NoiseSeparatingDecoder(N_DAYS, SMALL).train()
    x, days = inputs()
    try:
        explained = torch._dynamo.explain(model)(x, days, None, {REVERSAL: torch.tensor([1.0])})
    finally:
        torch._dynamo.reset()
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    assert sum("gru_layers" in str(n.target) for n in explained.graphs[0].graph.nodes) == 3
