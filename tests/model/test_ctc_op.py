"""The CTC custom ops: on the CPU `b2t::ctc_native` (torch's CTC kernel and, from the alpha
table it saves, torch's CTC backward) is `ctc_loss` exactly; on XLA `b2t::ctc_nll` (the scan,
its backward by recomputation) matches the float64 native loss; on shapes and lengths that
include padding rows (length 0), infeasible rows, and labels shorter than their slots."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import torch_xla
from hypothesis import given

from b2t.model.ctc import ctc_feasible, ctc_loss
from tests.model.test_ctc import GRAD_ATOL, _batch, _native
from tests.strategies import ctc_batches

DEVICE = torch_xla.device()


def _op(batch: dict[str, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's loss, masked as `ctc_loss` masks it, and d sum(loss) / d logits."""
    logits = batch["logits"].to(device).detach().requires_grad_(True)  # a CPU .to(cpu) is the tensor itself
    labels = [batch[k].to(device) for k in ("targets", "input_lengths", "target_lengths")]
    log_probs = F.log_softmax(logits, dim=-1)
    if device.type == "xla":
        nll = torch.ops.b2t.ctc_nll(log_probs, *labels, 0)
    else:
        nll, _ = torch.ops.b2t.ctc_native(log_probs, *labels, 0)
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


def test_compiled_on_the_cpu_it_is_one_graph_with_the_eager_loss_and_gradient():
    """Under torch.compile on the CPU the loss is `b2t::ctc_native` inside dynamo's graph (where
    `F.ctc_loss` breaks it), with exactly eager's loss and gradient (AOTAutograd, no codegen)."""
    batch = _batch(B=3, T=20, L=5, C=41, seed=7)
    labels = [batch[k] for k in ("targets", "input_lengths", "target_lengths")]

    def loss_and_grad(fn):
        logits = batch["logits"].clone().requires_grad_(True)
        loss = fn(logits, *labels)
        loss.backward()
        return loss.detach(), logits.grad

    def summed_loss(logits, targets, input_lengths, target_lengths):
        return ctc_loss(F.log_softmax(logits, dim=-1), targets, input_lengths, target_lengths).sum()

    try:
        explained = torch._dynamo.explain(summed_loss)(batch["logits"], *labels)
        assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
        assert any("ctc_native" in str(n.target) for n in explained.graphs[0].graph.nodes)
        compiled = loss_and_grad(torch.compile(summed_loss, backend="aot_eager"))
    finally:
        torch._dynamo.reset()
    for got, want in zip(compiled, loss_and_grad(summed_loss)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_on_a_mesh_the_compiled_backward_waits_for_the_forward_results_it_closes_over():
    """Under openxla on an SPMD mesh the op's backward kernel traces its scan while the forward
    graph may still be running; the scan's lowering then read a sharded placeholder's missing
    first shard and the process died (`b2t.engine.backend.spmd_openxla` waits). Made certain here by queueing
    seconds of other work ahead of each step; every gradient equals the uncompiled one."""
    result = subprocess.run([sys.executable, "-m", "tests.model._pending_ctc_probe"], cwd=Path(__file__).parents[2],
                            env={**os.environ, "CPU_NUM_DEVICES": "4", "PJRT_DEVICE": "CPU"},
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    *compiled, reference = [float(line) for line in result.stdout.split()]
    assert len(compiled) == 3
    torch.testing.assert_close(compiled, [reference] * 3, rtol=1e-4, atol=0)

