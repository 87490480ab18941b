"""`--init-from`: a checkpoint's weights, day layers matched by session name, sizes checked by name."""

from __future__ import annotations

import pytest
import torch

from b2t.config import TINY_CONFIG, config_from_dict, load_config
from b2t.data.manifest import Manifest
from b2t.engine.checkpoint import load_checkpoint
from b2t.import_baseline import import_baseline
from b2t.model.registry import build_model
from b2t.run_dir import read_records
from b2t.train.init_from import InitError, init_from_checkpoint
from b2t.train.loop import RunOptions, train
from preprocess.synth import SynthSpec, write_dataset
from preprocess.writer import prepare_dataset
from tests.test_import_baseline import (
    SESSIONS,
    SIZES,
    ReferenceDecoder,
    baseline_args,
    reference_model,
    save_release,
)

MODEL = {"patch_size": SIZES["patch_size"], "patch_stride": SIZES["patch_stride"],
         "gru": {"n_units": SIZES["n_units"], "n_layers": SIZES["n_layers"]}}
CFG = config_from_dict({"model": MODEL, "train": {"backend": "eager"}})
DAYS = ("day.weight", "day.bias")
NEW = "t15.2023.09.01"


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """A baseline release imported with b2t-import-baseline: (checkpoint, the model it holds)."""
    root = tmp_path_factory.mktemp("baseline")
    save_release(root / "release", reference_model(), baseline_args(SESSIONS))
    report = import_baseline(root / "release", root / "imported.safetensors", base=CFG)
    source = build_model(CFG.model, len(SESSIONS))
    load_checkpoint(report.output, source)
    return report.output, source


def test_known_days_keep_their_layers_and_a_new_day_starts_from_identity(imported):
    path, source = imported
    sessions = [SESSIONS[2], NEW, SESSIONS[0], SESSIONS[1]]  # another order and one extra session
    torch.manual_seed(1)
    model = build_model(CFG.model, len(sessions))
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    report = init_from_checkpoint(path, model, sessions, CFG)
    assert report.kept == [SESSIONS[2], SESSIONS[0], SESSIONS[1]] and report.new == [NEW]
    ours, theirs = model.state_dict(), source.state_dict()
    for day, s in enumerate(sessions):
        for k in DAYS:
            expected = fresh[k][day] if s == NEW else theirs[k][SESSIONS.index(s)]
            assert torch.equal(ours[k][day], expected), (k, s)
    assert torch.equal(ours["day.weight"][1], torch.eye(512)), "a new session's day layer is the identity"
    for k, v in theirs.items():
        if k not in DAYS:
            assert torch.equal(ours[k], v), k


def test_another_model_size_is_refused_by_name(imported):
    path, _ = imported
    cfg = config_from_dict({"model": {**MODEL, "gru": {**MODEL["gru"], "n_units": 32}}})
    model = build_model(cfg.model, 1)
    with pytest.raises(InitError, match=r"gru\.weight_hh_l0 is \(72, 24\) in the checkpoint, \(96, 32\) here.*"
                                        r"model\.gru\.n_units=24 in the checkpoint, 32 here"):
        init_from_checkpoint(path, model, [SESSIONS[0]], cfg)


def test_a_run_initialised_from_an_imported_baseline_trains_on_a_dataset_with_a_new_session(tmp_path):
    sets = [f"model.{k}={v}" for k, v in MODEL.items() if k != "gru"]
    sets += [f"model.gru.{k}={v}" for k, v in MODEL["gru"].items()]
    cfg = load_config(TINY_CONFIG, [*sets, "data.batch_size=8", "data.epochs=1", "train.backend=eager",
                                    "train.steps=3", "train.log_every=1", "train.val_every=3"])
    write_dataset(SynthSpec(sessions=3, train_trials=16, val_trials=4, test_trials=0, seed=2), tmp_path / "hdf5")
    prepare_dataset(tmp_path / "hdf5", tmp_path / "shards", cfg, splits=("train", "val"), progress=False)
    sessions = Manifest.load(tmp_path / "shards").sessions
    torch.manual_seed(3)
    baseline = ReferenceDecoder(2, **SIZES)  # trained on the first two sessions only
    save_release(tmp_path / "release", baseline, baseline_args(sessions[:2]))
    ckpt = import_baseline(tmp_path / "release", tmp_path / "imported.safetensors", base=cfg).output

    summary = train(tmp_path / "shards", tmp_path / "run", cfg,
                    RunOptions(progress=False, device="cpu", init_from=ckpt))
    records = list(read_records(tmp_path / "run" / "metrics.jsonl"))
    init = next(r for r in records if r["kind"] == "init")
    assert init["kept"] == sessions[:2] and init["new"] == [sessions[2]]
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert summary["steps"] == 3 and len(losses) == 3 and all(x is not None for x in losses)
