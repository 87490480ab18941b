"""The checked checkpoint reader: a crafted or damaged checkpoint is refused, naming the file and
what is wrong, by `--resume`, `--init-from` and `b2t-eval` alike (issue 35, cases 10-12).

Each checkpoint here is a real one (the tiny model, its AdamW state made as a run makes it)
rewritten with one thing changed, as a hostile user or another b2t version would.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.torch import save_file

from b2t.cli.eval import eval_main
from b2t.config import TINY_CONFIG, load_config
from b2t.data.dataset import Dataset
from b2t.data.manifest import Manifest
from b2t.engine.backend import make_backend
from b2t.engine.checkpoint import TrainState, load_checkpoint, read_checkpoint, read_state, save_checkpoint
from b2t.engine.checkpoint_checks import CheckpointError
from b2t.engine.device_state import start_training_state
from b2t.engine.optim import make_optimizer
from b2t.model.registry import build_model
from b2t.train.init_from import init_from_checkpoint
from b2t.train.resume import resume_state

CFG = load_config(TINY_CONFIG, ["train.backend=eager"])


def _model_and_optimizer(n_days: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = build_model(CFG.model, n_days)
    optimizer = make_optimizer(model, CFG.optim)
    start_training_state(model, optimizer, make_backend("eager", "cpu"))
    return model, optimizer


@pytest.fixture
def good(tiny_dataset, tmp_path) -> tuple[Path, Manifest]:
    """A checkpoint of the tiny model for the tiny dataset, with its (never stepped) AdamW state."""
    manifest = Manifest.load(tiny_dataset[1])
    model, optimizer = _model_and_optimizer(len(manifest.sessions))
    state = TrainState(sessions=manifest.sessions, config=CFG.to_dict(),
                       dataset={"path": str(tiny_dataset[1]), "identity": manifest.identity()})
    return save_checkpoint(tmp_path / "last.safetensors", model, optimizer, state), manifest


def _rewrite(path: Path, tensors=None, meta=None) -> Path:
    """`path` rewritten with `tensors(dict)` / `meta(dict)` applied to its content."""
    with safe_open(str(path), framework="pt") as f:
        contents = {k: f.get_tensor(k) for k in f.keys()}
        b2t = json.loads(f.metadata()["b2t"])
    if tensors is not None:
        tensors(contents)
    if meta is not None:
        b2t = meta(b2t)
    save_file(contents, str(path), metadata={"b2t": json.dumps(b2t)})
    return path


def _resume(path: Path, manifest: Manifest, dataset: Path) -> TrainState:
    model, optimizer = _model_and_optimizer(len(manifest.sessions))
    return resume_state(path, model, optimizer, Dataset(dataset, manifest), CFG)


def _eval_says(path: Path, dataset: Path, message: str) -> None:
    result = CliRunner().invoke(eval_main, [str(path), str(dataset), "--split", "val", "--device", "cpu",
                                            "--no-progress"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert str(path) in result.output and message in result.output, result.output


def test_a_good_checkpoint_resumes(good, tiny_dataset):
    path, manifest = good
    assert _resume(path, manifest, tiny_dataset[1]).step == 0


def test_10_a_state_field_from_a_newer_b2t_is_named(good, tiny_dataset):
    """It ended in a TypeError from TrainState(**state) at checkpoint.py:98."""
    path, manifest = good
    _rewrite(path, meta=lambda m: {**m, "state": {**m["state"], "ema_decay": 0.999}})
    with pytest.raises(CheckpointError, match=r"state fields this b2t does not know \(ema_decay\): it was written "
                                              r"by a newer b2t"):
        _resume(path, manifest, tiny_dataset[1])
    _eval_says(path, tiny_dataset[1], "written by a newer b2t")


def test_10_metadata_that_is_a_json_list_is_named(good, tiny_dataset):
    """An AttributeError at checkpoint.py:91 before."""
    path, _ = good
    _rewrite(path, meta=lambda m: [m])
    with pytest.raises(CheckpointError, match=r"last.safetensors: its b2t metadata is a JSON list, expected an object"):
        read_state(path)
    _rewrite(path, meta=lambda m: {**m[0], "state": [1, 2]})
    with pytest.raises(CheckpointError, match="its saved state is a JSON list, expected an object"):
        read_state(path)
    _eval_says(path, tiny_dataset[1], "expected an object")


def test_11_an_adamw_moment_of_the_wrong_shape_is_refused_before_any_step(good, tiny_dataset):
    """The traceback came from inside torch's adam.py at the first step."""
    path, manifest = good
    _rewrite(path, tensors=lambda t: t.update({"optim.0.exp_avg": t["optim.0.exp_avg"][:1].clone()}))
    with pytest.raises(CheckpointError, match=r"optim.0.exp_avg is float32 \(1, \d+\), its parameter is float32"):
        _resume(path, manifest, tiny_dataset[1])


def test_11_optimizer_state_that_disagrees_with_the_step_or_lacks_a_moment(good, tiny_dataset):
    path, manifest = good
    _rewrite(path, meta=lambda m: {**m, "state": {**m["state"], "step": 7}})
    with pytest.raises(CheckpointError, match=r"optim.0.step is 0.0, the checkpoint's step is 7"):
        _resume(path, manifest, tiny_dataset[1])
    _rewrite(path, meta=lambda m: {**m, "state": {**m["state"], "step": 0}},
             tensors=lambda t: t.pop("optim.3.exp_avg_sq"))
    with pytest.raises(CheckpointError, match="AdamW's state of parameter 3 lacks exp_avg_sq"):
        _resume(path, manifest, tiny_dataset[1])


def test_12_nan_weights_are_refused_by_eval_resume_and_init_from(good, tiny_dataset, tmp_path):
    """b2t-eval reported PER 1.0 with exit 0; --resume trained on, then blamed the same file."""
    path, manifest = good
    _rewrite(path, tensors=lambda t: t["model.out.weight"].fill_(float("nan")))
    with pytest.raises(CheckpointError, match=r"model.out.weight holds NaN/Inf: the weights had diverged"):
        read_checkpoint(path)
    with pytest.raises(CheckpointError, match="holds NaN/Inf"):
        _resume(path, manifest, tiny_dataset[1])
    model, _ = _model_and_optimizer(len(manifest.sessions))
    with pytest.raises(CheckpointError, match="holds NaN/Inf"):
        init_from_checkpoint(path, model, manifest.sessions, CFG)
    _eval_says(path, tiny_dataset[1], "holds NaN/Inf")


def test_12_integer_weights_are_not_cast_silently(good, tiny_dataset):
    path, manifest = good
    _rewrite(path, tensors=lambda t: t.update({"model.out.bias": t["model.out.bias"].to(torch.int64)}))
    model, optimizer = _model_and_optimizer(len(manifest.sessions))
    with pytest.raises(ValueError, match=r"out.bias is int64 in the checkpoint, float32 here"):
        load_checkpoint(path, model, optimizer)
    with pytest.raises(ValueError, match=r"out.bias is int64 in the checkpoint, float32 here"):
        init_from_checkpoint(path, model, manifest.sessions, CFG)


def test_12_a_checkpoint_without_a_step_does_not_restart_the_count(good, tiny_dataset):
    path, manifest = good
    _rewrite(path, meta=lambda m: {**m, "state": {k: v for k, v in m["state"].items() if k != "step"}})
    with pytest.raises(CheckpointError, match=r"its saved state lacks step: not a checkpoint b2t wrote"):
        _resume(path, manifest, tiny_dataset[1])
    _rewrite(path, meta=lambda m: {**m, "state": {**m["state"], "step": "3", "batches": 3}})
    with pytest.raises(CheckpointError, match=r"state field step is '3', expected int"):
        read_state(path)


def test_a_tensor_that_is_neither_weight_nor_optimizer_state_is_named(good):
    path, _ = good
    _rewrite(path, tensors=lambda t: t.update({"payload": torch.zeros(3)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'payload'"):
        read_checkpoint(path)


def test_a_fifo_is_not_opened_as_a_checkpoint(tmp_path):
    import os

    os.mkfifo(tmp_path / "last.safetensors")
    with pytest.raises(ValueError, match=r"last.safetensors is a FIFO \(named pipe\), not a regular file"):
        read_state(tmp_path / "last.safetensors")
