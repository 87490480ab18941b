"""The memory planner: exact parameter and weight bytes, monotone estimates, a micro-batch that fits."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from b2t.cli.plan import plan_main
from b2t.config import BASELINE_CONFIG, CONFIG_DIR, TINY_CONFIG, load_config
from b2t.model.decoder import GRUDecoder
from b2t.model.registry import count_parameters
from b2t.plan.memory import (
    COMPETITION_BUCKETS,
    GiB,
    activation_bytes,
    format_plan,
    largest_rows,
    parse_bytes,
    plan_memory,
    step_bytes,
    weight_layout,
)
from tests.strategies import model_configs

BASELINE = load_config(BASELINE_CONFIG)
TINY = load_config(TINY_CONFIG)
REAL_BUCKETS = list(COMPETITION_BUCKETS)


@given(n_days=st.integers(1, 6), cfg=model_configs())
def test_parameter_count_is_the_model_s(n_days, cfg):
    model = GRUDecoder(n_days, cfg)
    counts = count_parameters(cfg, n_days)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    assert counts == {"day": n_days * (512 * 512 + 512), "gru": sum(p.numel() for p in model.gru.parameters()),
                      "out": sum(p.numel() for p in model.out.parameters()), "total": counts["total"]}


def test_baseline_with_45_days_has_the_reference_size_and_4_bytes_per_weight():
    plan = plan_memory(REAL_BUCKETS, 45, BASELINE, 1)
    assert 43e6 < plan.n_params < 45e6  # "about 44M parameters with 45 days"
    assert plan.static["weights (f32)"] == plan.n_params * 4
    assert plan.static["gradients (f32)"] == plan.n_params * 4
    assert plan.static["AdamW moments (f32)"] == plan.n_params * 8


@given(rows=st.integers(1, 64), T=st.integers(14, 3000), L=st.integers(1, 96), more=st.integers(1, 64))
def test_activations_grow_with_rows_time_and_labels(rows, T, L, more):
    cfg = BASELINE.model
    base = sum(activation_bytes(rows, T, L, cfg).values())
    assert sum(activation_bytes(rows + more, T, L, cfg).values()) > base
    assert sum(activation_bytes(rows, T + more, L, cfg).values()) >= base
    assert sum(activation_bytes(rows, T, L + more, cfg).values()) > base
    parts = activation_bytes(rows, T, L, cfg)
    assert activation_bytes(2 * rows, T, L, cfg) == {k: 2 * v for k, v in parts.items()}, "linear in rows"


def test_more_devices_need_less_memory_each_and_the_donated_state_is_not_counted_twice():
    one = plan_memory(REAL_BUCKETS, 45, BASELINE, 1)
    eight = plan_memory(REAL_BUCKETS, 45, BASELINE, 8)
    assert eight.largest.rows_per_device == 8
    assert eight.largest.activation_total * 8 == one.largest.activation_total
    assert eight.static_total == one.static_total, "the step writes its new state into the donated old one"
    assert eight.peak < one.peak


@given(budget_gib=st.floats(0.5, 64.0), devices=st.sampled_from([1, 2, 4, 8]))
def test_largest_micro_batch_fits_and_one_more_row_does_not(budget_gib, devices):
    budget = int(budget_gib * GiB)
    shape = REAL_BUCKETS[-1]
    weights = weight_layout(BASELINE.model, 45)
    rows = largest_rows(shape, budget, weights, BASELINE.model)
    if rows:
        assert step_bytes(rows, shape, weights, BASELINE.model) <= budget
    assert step_bytes(rows + 1, shape, weights, BASELINE.model) > budget


def test_plan_reports_the_fit_against_device_memory():
    plan = plan_memory(REAL_BUCKETS, 45, BASELINE, 8, device_memory=16 * GiB)
    assert plan.fit_rows == largest_rows(REAL_BUCKETS[-1], int(16 * GiB * 0.9), weight_layout(BASELINE.model, 45),
                                         BASELINE.model)
    text = format_plan(plan, BASELINE)
    assert f"largest micro-batch of the T=2498 bucket: {plan.fit_rows} rows/device" in text
    assert "T= 2498 B=  64 L= 88  rows/device    8" in text


GRU_687M = load_config(BASELINE_CONFIG, ["model.gru.n_units=4608"])
"""The reference recipe widened to 687M parameters (684.6M with 45 days): the size whose replicas
did not fit 16 GiB devices at batch 64."""
NOISE_687M = load_config(CONFIG_DIR / "noise687m.yaml")


@pytest.mark.parametrize("cfg", [GRU_687M, NOISE_687M], ids=["gru", "noise_separating"])
def test_fsdp_shards_the_training_state_so_batch_64_of_687m_fits_16_gib_devices(cfg):
    replicated = plan_memory(REAL_BUCKETS, 45, cfg, 8, device_memory=16 * GiB)
    sharded = plan_memory(REAL_BUCKETS, 45, cfg, 8, fsdp=8, device_memory=16 * GiB)
    assert 680e6 < sharded.n_params < 700e6
    for part in ("weights (f32)", "gradients (f32)", "AdamW moments (f32)"):
        assert replicated.static[part] / 8 <= sharded.static[part] <= 1.3 * replicated.static[part] / 8, part
    assert sharded.largest.activations == replicated.largest.activations, "the rows are split over all 8 either way"
    assert not replicated.fits and sharded.fits
    text = format_plan(replicated, cfg)
    assert "the configured batches: DOES NOT FIT" in text and "largest micro-batch of the T=2498 bucket" in text
    assert "the configured batches: fits" in format_plan(sharded, cfg)


def test_the_recommended_mesh_is_the_least_sharding_that_fits():
    best = plan_memory(REAL_BUCKETS, 45, GRU_687M, 8, device_memory=16 * GiB).recommended
    assert best.fits and best.fsdp > 1
    for fsdp in (f for f in (1, 2, 4) if f < best.fsdp):
        assert not plan_memory(REAL_BUCKETS, 45, GRU_687M, 8, fsdp=fsdp, device_memory=16 * GiB).fits
    tight = plan_memory(REAL_BUCKETS, 45, GRU_687M, 8, device_memory=4 * GiB).recommended
    assert (tight.fsdp, tight.fits) == (8, False), "nothing fits: the most sharding, for the largest micro-batch"
    assert "recommended on 8 devices: --mesh fsdp=8; no mesh fits" in format_plan(
        plan_memory(REAL_BUCKETS, 45, GRU_687M, 8, device_memory=4 * GiB), GRU_687M)


@pytest.mark.parametrize(("text", "n"), [("16GiB", 16 * GiB), ("512MiB", 512 * 1024**2), ("16GB", 16 * 10**9),
                                         ("1.5e9", 1_500_000_000), (" 2 gib ", 2 * GiB)])
def test_memory_sizes_parse(text, n):
    assert parse_bytes(text) == n


def test_bad_memory_size_says_how_to_write_it():
    with pytest.raises(ValueError, match="write e.g. 16GiB"):
        parse_bytes("sixteen gigs")
    for text in ("1e999GiB", "infGiB", "nanGiB"):  # an OverflowError's traceback, or a plan for nan bytes
        with pytest.raises(ValueError, match=f"memory size must be a finite size > 0, got '{text}'"):
            parse_bytes(text)


def test_b2t_plan_prints_the_bucket_table_without_a_run_dir(tmp_path):
    from b2t.data.manifest import Manifest
    from preprocess.synth import SynthSpec, write_dataset
    from preprocess.writer import prepare_dataset

    write_dataset(SynthSpec(sessions=2, train_trials=8, val_trials=2, test_trials=2, seed=4), tmp_path / "hdf5")
    prepare_dataset(tmp_path / "hdf5", tmp_path / "shards", TINY, splits=("train",), workers=1, progress=False)
    result = CliRunner().invoke(plan_main, [str(tmp_path / "shards"), "--config", str(TINY_CONFIG),
                                            "--devices", "4", "--device-memory", "1GiB"])
    assert result.exit_code == 0, result.output
    for b in Manifest.load(tmp_path / "shards").buckets:
        assert f"T={b.T:5d} B={b.B:4d} L={b.L:3d}  rows/device {b.B // 4:4d}" in result.output
    assert "devices: 4" in result.output and "estimated peak" in result.output
    assert "largest micro-batch" in result.output and "recommended on 4 devices: --mesh" in result.output
    sharded = CliRunner().invoke(plan_main, [str(tmp_path / "shards"), "--config", str(TINY_CONFIG),
                                             "--mesh", "data=2,fsdp=2"])
    assert sharded.exit_code == 0, sharded.output
    assert "devices: 4, --mesh data=2,fsdp=2 (batch rows split over all 4; weights, gradients" in sharded.output
    assert not list(tmp_path.glob("*.safetensors"))
    other = CliRunner().invoke(plan_main, [str(tmp_path / "shards"), "--config", str(TINY_CONFIG),
                                           "--set", "model.patch_size=15"])  # planned, exit 0; b2t-train refuses it
    assert other.exit_code == 2 and "model.patch_size=15 but the shards were bucketed for patch_size=14" in other.output

