"""Two models in one process train as each would alone: torch_xla's scan caches the step it
traced by shapes and dtypes, so an evaluation (no gradient) at some shapes must not leave a
trace that a later training call at those shapes, another model's, reuses without gradients
(`b2t.model.custom_ops.traced_with_grad`). Shapes here are their own: no other test traces them
first, in a process that runs this file after others."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch_xla

from b2t.model.ctc import ctc_loss
from b2t.model.gru_op import gru_stack
from tests.model.test_ctc import _batch
from tests.model.test_gru_op import CPU, DEVICE, _case, _outputs, gru_weights


def test_an_evaluation_first_leaves_a_later_gru_training_call_its_gradients():
    case = _case(2, 4, 11, 13, 2, True, 5)  # H=13: no other test's shape
    gru, x, h0, keep, _ = case
    with torch.no_grad():  # the first model's evaluation, at these shapes
        weights = [w.to(DEVICE) for w in gru_weights(gru)]
        gru_stack(x.to(DEVICE), h0.to(DEVICE), weights, keep.to(DEVICE))
        torch_xla.sync()
    for got, want in zip(_outputs(gru_stack, case, DEVICE), _outputs(gru_stack, case, CPU)):
        assert got is not None
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_an_evaluation_first_leaves_a_later_ctc_training_call_its_gradient():
    batch = _batch(B=3, T=23, L=6, C=41, seed=3)  # T=23, L=6: no other test's shape
    labels = [batch[k] for k in ("targets", "input_lengths", "target_lengths")]

    def loss_and_grad(device, grad: bool):
        logits = batch["logits"].to(device).detach().requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            loss = ctc_loss(F.log_softmax(logits, dim=-1), *[t.to(device) for t in labels]).sum()
        if grad:
            loss.backward()
        torch_xla.sync()
        return loss.detach().cpu(), None if logits.grad is None else logits.grad.cpu()

    loss_and_grad(DEVICE, grad=False)  # the first model's evaluation, at these shapes
    loss, grad = loss_and_grad(DEVICE, grad=True)
    want_loss, want_grad = loss_and_grad(CPU, grad=True)
    assert grad is not None
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, want_grad, rtol=1e-4, atol=3e-4)
