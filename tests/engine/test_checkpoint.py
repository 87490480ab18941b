"""Checkpoints round-trip weights and AdamW state exactly, refuse damaged or mismatched files."""

import pytest
import torch
from torch import nn

from b2t.engine.checkpoint import (
    NonFiniteCheckpoint,
    TrainState,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
)


def _model_and_optimizer(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = torch.optim.AdamW([{"params": model[0].parameters(), "lr": 0.1},
                             {"params": model[2].parameters(), "lr": 0.01, "weight_decay": 0.0}])
    return model, opt


def _train(model, opt, steps):
    for i in range(steps):
        x = torch.full((3, 4), float(i + 1), dtype=torch.float32)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return loss.item()


def test_round_trip_continues_identically(tmp_path):
    model, opt = _model_and_optimizer(0)
    _train(model, opt, 3)
    state = TrainState(step=3, batches=3, best_per=0.5, best_step=2, sessions=["a", "b"], config={"x": {"y": 1}})
    path = save_checkpoint(tmp_path / "last.safetensors", model, opt, state)
    assert [p.name for p in tmp_path.iterdir()] == ["last.safetensors"], "no temp file left behind"
    reference = _train(model, opt, 2)

    model2, opt2 = _model_and_optimizer(1)
    loaded = load_checkpoint(path, model2, opt2)
    assert loaded == state
    assert _train(model2, opt2, 2) == reference
    assert opt2.param_groups[1]["weight_decay"] == 0.0


def test_file_is_not_a_pickle(tmp_path):
    model, opt = _model_and_optimizer(0)
    path = save_checkpoint(tmp_path / "c.safetensors", model, opt, TrainState())
    tensors, meta = read_checkpoint(path)
    assert not path.read_bytes().startswith(b"\x80"), "pickle protocol header"
    assert meta["format"] == "b2t-checkpoint-1" and "model.0.weight" in tensors


def test_shape_mismatch_names_the_key(tmp_path):
    model, _ = _model_and_optimizer(0)
    path = save_checkpoint(tmp_path / "c.safetensors", model, None, TrainState())
    other = nn.Sequential(nn.Linear(4, 9), nn.Tanh(), nn.Linear(9, 2))
    with pytest.raises(ValueError, match=r"0\.weight is \(8, 4\) in the checkpoint, \(9, 4\) here"):
        load_checkpoint(path, other)


def test_weights_only_checkpoint_cannot_resume(tmp_path):
    model, opt = _model_and_optimizer(0)
    path = save_checkpoint(tmp_path / "best.safetensors", model, None, TrainState())
    with pytest.raises(ValueError, match="holds no optimizer state"):
        load_checkpoint(path, model, opt)


def test_damaged_file_is_a_clear_error(tmp_path):
    model, opt = _model_and_optimizer(0)
    path = save_checkpoint(tmp_path / "c.safetensors", model, opt, TrainState())
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(ValueError, match="not a readable b2t checkpoint"):
        load_checkpoint(path, model, opt)


def test_a_checkpoint_the_user_cannot_read_is_the_os_error_naming_it(tmp_path, monkeypatch):
    """safetensors said "No such file or directory" for a file without read permission. (The
    suite may run as root, which chmod cannot keep out, so the refusal is the OS's, simulated.)"""
    import builtins

    import b2t.engine.checkpoint as checkpoint

    model, opt = _model_and_optimizer(0)
    path = save_checkpoint(tmp_path / "c.safetensors", model, opt, TrainState())

    def denied(file, *args, **kwargs):
        if str(file) == str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return builtins.open(file, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "open", denied, raising=False)
    with pytest.raises(PermissionError) as caught:
        load_checkpoint(path, model, opt)
    assert caught.value.filename == str(path)


def test_non_finite_weights_are_never_written_and_the_error_names_the_last_finite(tmp_path):
    model, opt = _model_and_optimizer(0)
    _train(model, opt, 2)
    path = save_checkpoint(tmp_path / "last.safetensors", model, opt, TrainState(step=2))
    before = path.read_bytes()
    with torch.no_grad():
        model[2].weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteCheckpoint, match=r"by step 4: model\.2\.weight holds NaN/Inf.*"
                       r"the last finite checkpoint is .*last\.safetensors \(step 2\)"):
        save_checkpoint(path, model, opt, TrainState(step=4))
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["last.safetensors"]
    with pytest.raises(NonFiniteCheckpoint, match="there is no earlier finite checkpoint"):
        save_checkpoint(tmp_path / "best.safetensors", model, None, TrainState(step=4))
    assert not (tmp_path / "best.safetensors").exists()


def test_a_non_finite_loss_is_refused_too(tmp_path):
    model, opt = _model_and_optimizer(0)
    with pytest.raises(NonFiniteCheckpoint, match="the loss is inf"):
        save_checkpoint(tmp_path / "last.safetensors", model, opt, TrainState(step=1), loss=float("inf"))
    assert save_checkpoint(tmp_path / "last.safetensors", model, opt, TrainState(step=1), loss=2.5).exists()
