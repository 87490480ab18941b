"""The scan CTC on the XLA CPU device against `torch.nn.functional.ctc_loss` on the CPU.

Gradients are compared w.r.t. the logits before log-softmax: the native kernel's gradient
w.r.t. log_probs is the logit gradient (softmax - occupancy), not d loss / d log_probs,
and the two only agree after the log-softmax backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch_xla
import torch_xla.debug.metrics as met
from hypothesis import given

from b2t.buckets import ctc_min_patches
from b2t.model.ctc import ctc_feasible, ctc_loss
from tests.strategies import ctc_batches

DEVICE = torch_xla.device()
"""Created at import: an XLA backward fails ("device_ready_queues_") in a process whose first
autograd backward ran before the XLA runtime was initialised."""

GRAD_ATOL = 3e-4
"""Logit gradients are softmax - occupancy, in [-1, 1]. The reference is the native kernel
in float64; the scan runs a float32 log-space recursion whose rounding grows with |nll|
(up to ~900 here): measured at most 7.6e-5 over 200 examples. The native float32 kernel
itself is up to 3.5e-4 off its float64 result on the same examples, so it is no reference."""


def _native(batch: dict[str, torch.Tensor], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """F.ctc_loss on the CPU in `dtype`: per-row loss (B,) and d sum(loss) / d logits (B, T, C)."""
    logits = batch["logits"].to(dtype, copy=True).requires_grad_(True)
    loss = F.ctc_loss(
        F.log_softmax(logits, dim=-1).transpose(0, 1),
        batch["targets"].long(),
        batch["input_lengths"].long(),
        batch["target_lengths"].long(),
        reduction="none",
        zero_infinity=True,
    )
    loss.sum().backward()
    return loss.detach(), logits.grad


def _traced_on_xla(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """`ctc_loss` and its logit gradient on the XLA device, traced but not yet run."""
    logits = batch["logits"].to(DEVICE).requires_grad_(True)
    loss = ctc_loss(
        F.log_softmax(logits, dim=-1),
        batch["targets"].to(DEVICE),
        batch["input_lengths"].to(DEVICE),
        batch["target_lengths"].to(DEVICE),
    )
    loss.sum().backward()
    return loss, logits.grad


def _on_xla(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """`ctc_loss` on the XLA device, same outputs as `_native`, fetched to the CPU."""
    loss, grad = _traced_on_xla(batch)
    torch_xla.sync()
    return loss.detach().cpu(), grad.cpu()


def _compiles() -> int:
    return int(met.metric_data("CompileTime")[0]) if "CompileTime" in met.metric_names() else 0


def _batch(B: int, T: int, L: int, C: int, seed: int) -> dict[str, torch.Tensor]:
    """A feasible batch of one shape with seed-dependent contents."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    return {
        "logits": torch.randn((B, T, C), generator=g, dtype=torch.float32, device="cpu") * 3.0,
        "targets": torch.randint(1, 4, (B, L), generator=g, dtype=torch.int32, device="cpu"),
        "input_lengths": torch.randint(T // 2, T + 1, (B,), generator=g, dtype=torch.int32, device="cpu"),
        "target_lengths": torch.randint(0, L + 1, (B,), generator=g, dtype=torch.int32, device="cpu"),
    }


@given(ctc_batches())
def test_scan_matches_native_ctc_in_value_and_gradient(batch):
    native_loss, _ = _native(batch, torch.float32)
    cpu_loss = ctc_loss(
        F.log_softmax(batch["logits"], dim=-1),
        batch["targets"],
        batch["input_lengths"],
        batch["target_lengths"],
    )
    torch.testing.assert_close(cpu_loss, native_loss, rtol=0, atol=0)  # the CPU dispatch's layout

    want_loss, want_grad = _native(batch, torch.float64)
    loss, grad = _on_xla(batch)
    assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
    torch.testing.assert_close(loss, want_loss.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, want_grad.float(), rtol=0, atol=GRAD_ATOL)
    infeasible = ~ctc_feasible(batch["targets"], batch["input_lengths"], batch["target_lengths"])
    assert (loss[infeasible] == 0).all() and (grad[infeasible] == 0).all()


@given(ctc_batches())
def test_feasible_rows_are_those_with_enough_frames(batch):
    got = ctc_feasible(batch["targets"], batch["input_lengths"], batch["target_lengths"])
    want = [
        ctc_min_patches(labels[:n].tolist()) <= t
        for labels, n, t in zip(batch["targets"], batch["target_lengths"], batch["input_lengths"])
    ]
    assert got.tolist() == want


def test_edge_rows_have_exact_values():
    """Padding row, empty target, infeasible repeat, and a one-frame one-label row."""
    log_probs = F.log_softmax(torch.randn((4, 3, 5), dtype=torch.float32, device="cpu"), dim=-1)  # (B, T, C)
    targets = torch.tensor([[0, 0], [0, 0], [2, 2], [3, 0]], dtype=torch.int32, device="cpu")
    input_lengths = torch.tensor([0, 3, 2, 1], dtype=torch.int32, device="cpu")
    target_lengths = torch.tensor([0, 0, 2, 1], dtype=torch.int32, device="cpu")
    want = torch.stack([
        torch.zeros((), dtype=torch.float32, device="cpu"),
        -log_probs[1, :, 0].sum(),  # all blanks
        torch.zeros((), dtype=torch.float32, device="cpu"),  # "2 2" needs 3 frames, has 2
        -log_probs[3, 0, 3],
    ])
    got = ctc_loss(*(t.to(DEVICE) for t in (log_probs, targets, input_lengths, target_lengths)))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)
    feasible = ctc_feasible(targets, input_lengths, target_lengths)
    assert feasible.tolist() == [True, True, False, True]


def test_same_shape_compiles_once_without_host_fallback():
    met.clear_all()
    counts = []
    for seed in range(3):
        _on_xla(_batch(B=4, T=50, L=7, C=41, seed=seed))
        counts.append(_compiles())
    fallbacks = [name for name in met.counter_names() if name.startswith("aten::")]
    assert fallbacks == [], f"ops ran on the host: {fallbacks}"
    assert counts[0] >= 1 and counts[1:] == [counts[0]] * 2, f"compilations after each step: {counts}"


def test_compiled_graph_does_not_grow_with_time():
    """The recursion is one while-loop: the HLO for T=60 and T=600 has the same instructions."""
    instructions, seconds = {}, {}
    for T in (60, 600):
        loss, grad = _traced_on_xla(_batch(B=4, T=T, L=9, C=41, seed=T))
        hlo = torch_xla._XLAC._get_xla_tensors_hlo([loss, grad])
        instructions[T] = sum(1 for line in hlo.splitlines() if " = " in line)
        assert " while(" in hlo
        met.clear_all()
        torch_xla.sync()
        assert _compiles() == 1
        seconds[T] = met.metric_data("CompileTime")[1] / 1e9
    print(f"first-step compile seconds (forward + backward): {seconds}")
    assert instructions[60] == instructions[600], instructions


def test_runs_inside_torch_compile_openxla_as_one_graph():
    """Under openxla the recursion is the custom op `b2t::ctc_nll` inside dynamo's graph (no
    break): same loss and gradient as the lazy scan."""
    batch = _batch(B=3, T=20, L=5, C=41, seed=7)
    want_loss, want_grad = _on_xla(batch)

    def summed_loss(logits, targets, input_lengths, target_lengths):
        return ctc_loss(F.log_softmax(logits, dim=-1), targets, input_lengths, target_lengths).sum()

    logits = batch["logits"].to(DEVICE).requires_grad_(True)
    labels = [batch[k].to(DEVICE) for k in ("targets", "input_lengths", "target_lengths")]
    try:
        explained = torch._dynamo.explain(summed_loss)(logits, *labels)
        assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
        loss = torch.compile(summed_loss, backend="openxla")(logits, *labels)
        loss.backward()
        torch_xla.sync()
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(loss.detach().cpu(), want_loss.sum())
    torch.testing.assert_close(logits.grad.cpu(), want_grad)
