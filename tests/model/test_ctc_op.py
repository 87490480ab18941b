"""`b2t::ctc_nll` as a custom op: its CPU kernel is torch's `ctc_loss` exactly, its XLA
kernel (the scan) and its backward op (recomputation) match the float64 native loss, on
shapes and lengths that include padding rows (length 0) and infeasible rows."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch_xla
from hypothesis import given

from b2t.model.ctc import ctc_feasible
from tests.model.test_ctc import GRAD_ATOL, _native
from tests.strategies import ctc_batches

DEVICE = torch_xla.device()


def _op(batch: dict[str, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's loss, masked as `ctc_loss` masks it, and d sum(loss) / d logits."""
    logits = batch["logits"].to(device).detach().requires_grad_(True)  # a CPU .to(cpu) is the tensor itself
    labels = [batch[k].to(device) for k in ("targets", "input_lengths", "target_lengths")]
    nll = torch.ops.b2t.ctc_nll(F.log_softmax(logits, dim=-1), *labels, 0)
    loss = torch.where(ctc_feasible(*labels), nll, 0.0)
    loss.sum().backward()
    torch_xla.sync()
    return loss.detach().cpu(), logits.grad.cpu()


@given(ctc_batches())
def test_op_kernels_match_native_ctc_in_value_and_gradient(batch):
    native_loss, native_grad = _native(batch, torch.float32)
    cpu_loss, cpu_grad = _op(batch, torch.device("cpu"))
    torch.testing.assert_close(cpu_loss, native_loss, rtol=0, atol=0)
    torch.testing.assert_close(cpu_grad, native_grad, rtol=0, atol=0)

    want_loss, want_grad = _native(batch, torch.float64)
    loss, grad = _op(batch, DEVICE)
    assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
    torch.testing.assert_close(loss, want_loss.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, want_grad.float(), rtol=0, atol=GRAD_ATOL)
    infeasible = ~ctc_feasible(batch["targets"], batch["input_lengths"], batch["target_lengths"])
    assert (loss[infeasible] == 0).all() and (grad[infeasible] == 0).all()
