"""The Stepper (b2t.engine.step): what its warm-up leaves behind. The compiled steps
themselves are tested through the trainer (test_loop) and the models (tests/model)."""

from __future__ import annotations

import torch

from b2t.config import TINY_CONFIG, load_config
from b2t.contract import BucketShape
from b2t.engine.backend import make_backend
from b2t.engine.optim import make_optimizer, set_lrs
from b2t.engine.step import Stepper
from b2t.model.registry import build_model
from b2t.train.warmup import warm_up


def _training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    state = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    for i, s in enumerate(optimizer.state.values()):
        state.update({f"optim.{i}.{k}": torch.as_tensor(v).detach().clone() for k, v in s.items()})
    return state


def test_the_warm_up_leaves_the_training_state_as_it_found_it():
    """Two optimizer steps per bucket on all-padding batches still apply weight decay and
    count AdamW's steps: the warm-up must put weights and optimizer state back, or a run
    (and a resumed one, whose warm-up comes after the load) trains from another state.
    Eager on the CPU, where the snapshot once aliased the live tensors."""
    cfg = load_config(TINY_CONFIG, ["train.backend=eager"])
    backend = make_backend("eager", "cpu")
    model = build_model(cfg.model, 2).to(backend.device)
    optimizer = make_optimizer(model, cfg.optim)
    stepper = Stepper(model, optimizer, backend, cfg)
    set_lrs(optimizer, 10, cfg.optim)  # a learning rate well above 0, as at a resume
    before = _training_state(model, optimizer)
    warm_up(stepper, [BucketShape(T=30, B=4, L=8), BucketShape(T=62, B=4, L=8)])
    after = _training_state(model, optimizer)
    assert after.keys() == before.keys()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed == [], f"the warm-up changed {changed[:5]}"
