"""Data parallelism: XLA SPMD on 4 virtual CPU devices, weight-sharded (fsdp) SPMD on 8, DDP
under torchrun with gloo, layouts.

The SPMD runs happen in a subprocess with CPU_NUM_DEVICES=4 or 8 (SPMD must be switched on
before XLA computes anything; this pytest process already set up one XLA device), the
single-device reference in this process; both step the same batches from the same
checkpoint (tests/engine/_parallel_probe.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from b2t.config import CONFIG_DIR, TINY_CONFIG, MeshConfig, load_config
from b2t.data.manifest import Manifest
from b2t.engine.backend import make_backend
from b2t.engine.checkpoint import TrainState, load_checkpoint, read_checkpoint, save_checkpoint
from b2t.engine.mesh import ParallelError, parse_devices, shard_dim
from b2t.engine.optim import make_optimizer
from b2t.engine.parallel import Layout, make_layout, torchrun_rank_world
from b2t.engine.step import Stepper, seeded_model
from b2t.model.decoder import GRUDecoder
from b2t.model.registry import build_model
from b2t.run_dir import RunDir
from b2t.train.loop import TrainingError, weights_digest
from b2t.train.resume import check_same_readers
from preprocess.synth import SynthSpec, write_dataset
from preprocess.writer import prepare_dataset
from tests.engine import _parallel_probe as probe

REPO = Path(__file__).resolve().parents[2]
LOSS_RTOL = 1e-3
"""SPMD vs one device. The same math, but with the batch split over 4 devices every sum over
rows (the loss, each weight's gradient) becomes 4 partial sums plus an all-reduce, and the
matmuls feeding them run in bf16 (relative rounding about 4e-3 per element). Summed over
thousands of elements those differences mostly cancel: measured at most 6e-5 on losses
and 1e-3 on gradient norms over 5 steps; 1e-3 leaves room for the losses, the norms get 5e-3."""
NORM_RTOL = 5e-3
UPDATE_RTOL = 5e-2
"""Final weights, as |w_spmd - w_one| / |w_one - w_start| per tensor: AdamW moves every element
by about +-lr whatever its gradient's size, so an element whose gradient is near zero (the
output bias of phonemes absent from these batches) can take the other sign from rounding.
Measured: 2.7e-2 on out.bias, at most 2.2e-3 on every other tensor."""


@pytest.fixture(scope="module")
def hdf5(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("parallel") / "hdf5"
    write_dataset(SynthSpec(sessions=3, train_trials=32, val_trials=8, test_trials=4, seed=2), root)
    return root


def _prepare(hdf5: Path, out: Path, *overrides: str) -> Path:
    prepare_dataset(hdf5, out, load_config(TINY_CONFIG, ["data.batches_per_shard=2", *overrides]),
                    workers=1, progress=False)
    return out


@pytest.fixture(scope="module")
def shards(hdf5) -> Path:
    return _prepare(hdf5, hdf5.parent / "shards")


def _single_device_checkpoint(shards: Path, path: Path, config: Path = TINY_CONFIG) -> Path:
    """A checkpoint written on one XLA device: initial weights and AdamW's zero moments."""
    cfg = load_config(config, ["train.backend=xla"])
    backend = make_backend("xla")
    model = seeded_model(cfg, len(Manifest.load(shards).sessions), backend)
    optimizer = make_optimizer(model, cfg.optim)
    Stepper(model, optimizer, backend, cfg)  # creates the moments
    return save_checkpoint(path, model, optimizer, TrainState())


def _cpu_weights(path: Path, n_days: int) -> dict[str, torch.Tensor]:
    """The weights of `path` loaded into a model on the CPU (a one-device load)."""
    model = GRUDecoder(n_days, load_config(TINY_CONFIG).model)
    load_checkpoint(path, model)
    return model.state_dict()


@pytest.mark.slow  # the default run's SPMD check: test_spmd_training_compiles_only_in_its_warm_up[xla-mesh2]
@pytest.mark.parametrize("backend", ["xla", "openxla"])
def test_spmd_on_4_devices_trains_like_one_device(shards, tmp_path, backend):
    init = _single_device_checkpoint(shards, tmp_path / "init.safetensors")
    spmd = probe.spawn(shards, init, tmp_path / "spmd", 4, ["all"], backend)
    one = probe.run(shards, init, tmp_path / "one", None, backend)
    (many,) = probe.results(spmd, tmp_path / "spmd", 1)

    # the batch is split along its rows over the 4 devices; the weights are whole on each
    assert many["batch_sharding"]["features"] == "{devices=[4,1,1]0,1,2,3}"
    assert many["batch_sharding"]["seq_class_ids"] == "{devices=[4,1]0,1,2,3}"
    for name in ("n_time_steps", "phone_seq_lens", "day_indices", "valid"):
        assert many["batch_sharding"][name] == "{devices=[4]0,1,2,3}", name
    assert set(many["weight_sharding"].values()) == {"{replicated}"}
    assert set(one["batch_sharding"].values()) == {""}, "one device: nothing sharded"

    # the same losses, gradients and evaluation as one device
    torch.testing.assert_close([s["loss"] for s in many["steps"]], [s["loss"] for s in one["steps"]],
                               rtol=LOSS_RTOL, atol=0.0)
    torch.testing.assert_close([s["grad_norm"] for s in many["steps"]], [s["grad_norm"] for s in one["steps"]],
                               rtol=NORM_RTOL, atol=0.0)
    torch.testing.assert_close(many["eval_nll"], one["eval_nll"], rtol=LOSS_RTOL, atol=0.0)

    counts = [s["compilations"] for s in many["steps"]]
    assert many["fallbacks"] == one["fallbacks"] == {}, "no op runs on the host"
    if backend == "openxla":
        # dynamo's graphs settle in a bucket's second step (the trainer's warm-up takes two);
        # the mesh compiles no more graphs than one device (its backward joins the lazy step)
        assert counts[3] == counts[2], f"bucket 0 recompiled after bucket 1: {counts}"
        assert many["train_compilations"] <= one["train_compilations"], (counts, one["steps"])
        assert many["eval_compilations"] <= one["eval_compilations"] + 1
        return
    # one graph per bucket: revisiting a bucket compiles nothing; evaluation is one more graph
    n_buckets = len(set(probe.order(len(counts))))
    assert counts[3:] == [counts[2]] * (len(counts) - 3), f"revisited buckets recompiled: {counts}"
    # +1: the first SPMD step also annotates the learning-rate tensors as replicated, so its graph
    # has three more outputs than every later one (the trainer compiles it during its warm-up)
    assert many["train_compilations"] <= n_buckets + 1, counts
    assert many["train_compilations"] <= one["train_compilations"] + 1
    assert many["eval_compilations"] == 1

    # the checkpoint of the 4-device run loads on one device and holds the same weights
    n_days = len(Manifest.load(shards).sessions)
    start = _cpu_weights(init, n_days)
    ends = [_cpu_weights(tmp_path / run / "final.safetensors", n_days) for run in ("spmd/mesh0", "one")]
    for k, w in start.items():
        moved = (ends[1][k] - w).norm()
        assert moved > 0, k
        assert (ends[0][k] - ends[1][k]).norm() <= UPDATE_RTOL * moved, k
    tensors, _ = read_checkpoint(tmp_path / "spmd" / "mesh0" / "final.safetensors")
    assert any(k.startswith("optim.") for k in tensors), "the AdamW state is saved too, for resuming"


FSDP_STEPS = 10
"""Steps of the fsdp=8 tests; the data=2,fsdp=4 one takes 6 (every bucket revisited, a third
less compiling time on one device and the mesh)."""
FSDP_NORM_RTOL = 2e-2
"""Gradient norms over 10 steps: the bf16 rounding differences of NORM_RTOL compound with the
steps; measured at most 5.2e-3 (data=2,fsdp=4) and 9.0e-3 (fsdp=8), both at a late step, with
the losses within 2.8e-4, under the tiny recipe's earlier Adam eps of 0.001; under eps 0.1 at
most 1.4e-3 on both meshes and both backends, the losses within 1.0e-4."""


@pytest.mark.parametrize(("backend", "mesh", "steps"), [
    pytest.param("xla", "data=2,fsdp=4", 6, marks=pytest.mark.slow),
    pytest.param("xla", "fsdp=8", FSDP_STEPS, marks=pytest.mark.slow),
    pytest.param("openxla", "fsdp=8", FSDP_STEPS, marks=pytest.mark.slow)],
    ids=["xla-data=2,fsdp=4", "xla-fsdp=8", "openxla-fsdp=8"])
def test_fsdp_trains_like_one_device_and_its_checkpoint_evaluates_on_one(hdf5, tmp_path, backend, mesh, steps):
    """Weights, gradients and AdamW moments sharded over fsdp, the batch over all 8 devices: resumed
    from a one-device checkpoint, the steps give one device's losses, nothing compiles after the
    first steps of each bucket, each device holds 1/fsdp of the training state, and the final
    checkpoint evaluates on one device as on the mesh."""
    shards = _prepare(hdf5, tmp_path / "shards", "data.row_multiple=8")
    init = _single_device_checkpoint(shards, tmp_path / "init.safetensors")
    spmd = probe.spawn(shards, init, tmp_path / "spmd", 8, [mesh], backend, steps)
    one = probe.run(shards, init, tmp_path / "one", None, backend, steps)
    (many,) = probe.results(spmd, tmp_path / "spmd", 1)
    fsdp = parse_devices(None, mesh).fsdp

    assert many["batch_sharding"]["features"] == "{devices=[8,1,1]0,1,2,3,4,5,6,7}", "rows over both axes"
    model = GRUDecoder(3, load_config(TINY_CONFIG).model)
    for name, p in model.named_parameters():
        assert (many["weight_sharding"][name] == "{replicated}") == (shard_dim(p.shape, fsdp) is None), name
    assert many["moment_sharding"] == many["weight_sharding"]["gru.weight_ih_l0"]
    assert many["grads_kept"] == 0, "gradients live within a step"
    whole = sum(p.numel() * 4 for p in model.parameters())  # f32 bytes of each: weights, one moment
    for part, copies in (("weights", 1), ("moments", 2)):
        for held in many["state_bytes"][part]:  # per device
            assert copies * whole / fsdp <= held <= 1.3 * copies * whole / fsdp, (part, held, whole)

    torch.testing.assert_close([s["loss"] for s in many["steps"]], [s["loss"] for s in one["steps"]],
                               rtol=LOSS_RTOL, atol=0.0)
    torch.testing.assert_close([s["grad_norm"] for s in many["steps"]], [s["grad_norm"] for s in one["steps"]],
                               rtol=FSDP_NORM_RTOL, atol=0.0)
    counts = [s["compilations"] for s in many["steps"]]
    settled = 3 if backend == "xla" else 5  # to bucket 1's first step (openxla: its second, as the warm-up's two)
    assert counts[settled:] == [counts[settled - 1]] * (steps - settled), f"compiled after warm-up: {counts}"
    assert many["save_compilations"] == one["save_compilations"] == 0, "saving a sharded checkpoint compiles nothing"
    assert many["fallbacks"] == {}

    on_one = probe.evaluate_checkpoint(shards, tmp_path / "spmd" / "mesh0" / "final.safetensors", backend, steps)
    torch.testing.assert_close(on_one["eval_nll"], many["eval_nll"], rtol=LOSS_RTOL, atol=0.0)
    assert on_one["per"] == many["per"] and on_one["phonemes"] == many["phonemes"]


@pytest.mark.slow
def test_the_noise_separating_family_trains_under_fsdp_like_one_device(hdf5, tmp_path):
    """configs/noise_tiny.yaml on `data=2,fsdp=4`: one device's losses, 1/fsdp of the training
    state per device, nothing compiled after the first steps of each bucket."""
    config = CONFIG_DIR / "noise_tiny.yaml"
    shards = _prepare(hdf5, tmp_path / "shards", "data.row_multiple=8")
    init = _single_device_checkpoint(shards, tmp_path / "init.safetensors", config)
    spmd = probe.spawn(shards, init, tmp_path / "spmd", 8, ["data=2,fsdp=4"], "xla", FSDP_STEPS, config)
    one = probe.run(shards, init, tmp_path / "one", None, "xla", FSDP_STEPS, config)
    (many,) = probe.results(spmd, tmp_path / "spmd", 1)
    torch.testing.assert_close([s["loss"] for s in many["steps"]], [s["loss"] for s in one["steps"]],
                               rtol=LOSS_RTOL, atol=0.0)
    model = build_model(load_config(config).model, 3)
    whole = sum(p.numel() * 4 for p in model.parameters())
    assert all(whole / 4 <= held <= 1.3 * whole / 4 for held in many["state_bytes"]["weights"])
    counts = [s["compilations"] for s in many["steps"]]
    assert counts[3:] == [counts[2]] * (FSDP_STEPS - 3), f"compiled after warm-up: {counts}"
    assert many["fallbacks"] == {}


@pytest.mark.parametrize(("backend", "mesh"), [
    pytest.param("xla", ("--devices", "all"), marks=pytest.mark.slow),
    pytest.param("openxla", ("--devices", "all"), marks=pytest.mark.slow),
    ("xla", ("--mesh", "data=2,fsdp=2")),
    pytest.param("openxla", ("--mesh", "data=2,fsdp=2"), marks=pytest.mark.slow)])
def test_spmd_training_compiles_only_in_its_warm_up(hdf5, tmp_path, backend, mesh):
    """The CLI on 4 devices: 8 steps over 2 buckets, validation twice, a checkpoint, nothing compiled
    after the warm-up, and the step donating every buffer of its training state (`Backend.donate`:
    with torch_xla's own donors alone the revisited bucket compiled again, so aliasing was off under
    SPMD). (Before `Backend.sync` waited under SPMD, such runs crashed within a few steps.)"""
    shards = _prepare(hdf5, tmp_path / "shards", "data.n_buckets=2")  # 2 buckets: each compile is revisited
    run = tmp_path / "run"
    result = subprocess.run(
        [str(Path(sys.executable).parent / "b2t-train"), str(shards), str(run), "--config", str(TINY_CONFIG),
         "--backend", backend, *mesh, "--no-progress", "--set", "train.steps=8",
         "--set", "train.log_every=1", "--set", "train.val_every=4", "--set", "train.checkpoint_every=8"],
        cwd=REPO, env={**os.environ, "CPU_NUM_DEVICES": "4", "PJRT_DEVICE": "CPU"},
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    layout = next(r for r in records if r["kind"] == "layout")
    assert (layout["parallel"], layout["devices"]) == ("spmd", 4)
    assert layout["mesh"] == ({"data": 4} if mesh[0] == "--devices" else {"data": 2, "fsdp": 2})
    summary = next(r for r in records if r["kind"] == "summary")
    assert summary["buckets"] == 2
    warm = summary["warm_up"]["compilations"]
    assert [r["compilations"] for r in records if r["kind"] == "train"] == [warm] * 8, "nothing compiles after warm-up"
    assert summary["final"]["compilations"] == warm
    if backend == "xla":
        assert warm <= 3 * summary["buckets"], "per bucket a train and an eval graph, plus the warm-up's own two"
    assert len([r for r in records if r["kind"] == "val"]) == 2
    compile_record = next(r for r in records if r["kind"] == "compile")
    assert compile_record["donated"] == compile_record["training_state"] > 0, "every state buffer donated"


@pytest.mark.slow  # the default run's DDP check: test_ddp_all_reduces_once_per_optimizer_step
def test_ddp_under_torchrun_splits_shards_and_keeps_replicas_equal(hdf5, tmp_path):
    """Two gloo ranks on the CPU with the inductor backend (the GPU recipe's), accumulating 2 micro-batches.
    One bucket: inductor's warm-up compiles each bucket's graphs on every rank, and the DDP
    checks need only one shape."""
    shards = _prepare(hdf5, tmp_path / "shards", "data.n_buckets=1")
    torchrun = Path(sys.executable).parent / "torchrun"
    b2t_train = Path(sys.executable).parent / "b2t-train"
    run = tmp_path / "run"
    result = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "2", str(b2t_train), str(shards), str(run),
         "--config", str(TINY_CONFIG), "--backend", "inductor", "--no-progress",
         "--set", "train.steps=4", "--set", "train.grad_accum=2", "--set", "train.log_every=2",
         "--set", "train.val_every=4", "--set", "train.checkpoint_every=4", "--set", "train.shuffle_buffer=1"],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    logs = [[json.loads(line) for line in (run / name).read_text().splitlines()]
            for name in ("metrics.jsonl", "metrics.rank1.jsonl")]
    layouts = [next(r for r in log if r["kind"] == "layout") for log in logs]
    assert [(x["parallel"], x["rank"], x["world"]) for x in layouts] == [("ddp", 0, 2), ("ddp", 1, 2)]
    shares = [set(x["first_pass_shards"]) for x in layouts]
    assert shares[0] and shares[1] and not shares[0] & shares[1], "each rank reads its own shards"
    summaries = [next(r for r in log if r["kind"] == "summary") for log in logs]
    assert summaries[0]["weights_sha256"] == summaries[1]["weights_sha256"], "replicas stay identical"
    assert [r["kind"] for r in logs[1]].count("val") == 0, "only rank 0 validates"
    assert sorted(p.name for p in run.glob("*.safetensors")) == ["best.safetensors", "last.safetensors"]
    # rank 0's checkpoint loads on one device and holds the replicas' weights
    model = GRUDecoder(len(Manifest.load(shards).sessions), load_config(TINY_CONFIG).model)
    state = load_checkpoint(run / "last.safetensors", model)
    assert state.step == 4
    assert weights_digest(model) == summaries[0]["weights_sha256"]


def test_rank_and_world_come_from_torchrun():
    assert torchrun_rank_world({}) is None
    assert torchrun_rank_world({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}) == (3, 8, 1)
    with pytest.raises(ParallelError, match="WORLD_SIZE is set but RANK, LOCAL_RANK are not"):
        torchrun_rank_world({"WORLD_SIZE": "2"})


def test_layouts_refuse_what_cannot_run(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    assert make_layout("xla", MeshConfig()) == (Layout("single"), None, None)
    assert make_layout("eager", MeshConfig()) == (Layout("single"), None, None)
    with pytest.raises(ParallelError, match="torchrun --nproc-per-node N"):
        make_layout("inductor", MeshConfig(data=-1))
    with pytest.raises(ParallelError, match="does not shard weights: mesh.fsdp needs --backend xla or openxla"):
        make_layout("eager", MeshConfig(fsdp=8))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ParallelError, match="SPMD in one process per host"):
        make_layout("openxla", MeshConfig(data=-1))
    with pytest.raises(ParallelError, match="--devices 3 differs from torchrun's 2 processes"):
        make_layout("eager", MeshConfig(data=3))


def test_resume_under_another_reader_count_is_refused(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"kind": "layout", "parallel": "ddp", "world": 2}) + "\n")
    check_same_readers(RunDir(tmp_path), Layout("ddp", rank=0, world=2, devices=2))
    with pytest.raises(TrainingError, match="trained with 2 data readers .* this run has 1: resume with 2"):
        check_same_readers(RunDir(tmp_path), Layout("single"))


def _ddp_all_reduces(shards: Path, tmp_path: Path, grad_accum: int) -> int:
    """All-reduce calls of one optimizer step over `grad_accum` micro-batches, DDP in a world of 1."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from b2t.data.loader import StreamConfig, train_batches
    from b2t.engine.parallel import close_ddp, wrap_ddp

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / f"store{grad_accum}"), 1), rank=0, world_size=1)
    try:
        cfg = load_config(TINY_CONFIG, ["train.backend=eager", f"train.grad_accum={grad_accum}"])
        manifest, backend = Manifest.load(shards), make_backend("eager", "cpu")
        model = seeded_model(cfg, len(manifest.sessions), backend)
        ddp = wrap_ddp(model, backend.device)
        calls = []
        ddp.register_comm_hook(None, lambda state, bucket: calls.append(1) or allreduce_hook(state, bucket))
        stepper = Stepper(model, make_optimizer(model, cfg.optim), backend, cfg, ddp)
        batches = train_batches(shards, manifest, StreamConfig())
        stepper.train_step([next(batches) for _ in range(grad_accum)], 1)
        return len(calls)
    finally:
        close_ddp()


def test_ddp_all_reduces_once_per_optimizer_step(shards, tmp_path):
    once = _ddp_all_reduces(shards, tmp_path, 1)
    assert once >= 1
    assert _ddp_all_reduces(shards, tmp_path, 3) == once, "micro-batches before the last skip the all-reduce"


def test_spmd_openxla_avoids_the_bridge_bug_stock_openxla_has():
    result = subprocess.run([sys.executable, "-m", "tests.engine._bridge_repro"], cwd=REPO, capture_output=True,
                            text=True, timeout=300, env={**os.environ, "CPU_NUM_DEVICES": "4", "PJRT_DEVICE": "CPU"})
    assert result.returncode == 0, result.stderr[-3000:]
    errors = json.loads(result.stdout.splitlines()[-1])
    assert max(errors["spmd_openxla"]) < 1e-5, errors
    assert errors["openxla"][0] < 1e-5 and errors["openxla"][1] > 0.1, (
        f"stock openxla under SPMD no longer reuses the first call's saved input ({errors}): "
        "torch_xla fixed its bridge, so b2t.engine.backend.spmd_openxla can go")
