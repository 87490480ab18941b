"""Run by tests/model/test_ctc_op.py in a fresh process (SPMD is process-wide): the CTC op's
loss and gradient compiled as b2t-train compiles them on a mesh (`spmd_openxla`: the forward
by torch_xla's bridge, the backward traced lazily after it) on the CPU devices, rows sharded.
Seconds of unrelated work are queued on the mesh before each call, so the forward graph's
results are still placeholders when the backward op traces its scan over them (without the
wait for the mesh in `spmd_openxla`'s backward the process died in torch_xla on every run).
Prints the gradient's norm per call, then the norm of the uncompiled (lazy) gradient, the
reference. `--no-wait` compiles with torch_xla's plain backward instead
(tests/test_xla_workarounds.py's sentinel: the process still dies).

    CPU_NUM_DEVICES=4 PJRT_DEVICE=CPU python -m tests.model._pending_ctc_probe [--no-wait]
"""

import sys

import numpy as np
import torch
import torch_xla
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from functorch.compile import make_boxed_func

from b2t.engine.backend import spmd_openxla
from b2t.model.ctc_op import ctc_nll
from b2t.private_api import aot_autograd, openxla_eval_boxed


def loss(x: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, lengths: torch.Tensor,
         target_lengths: torch.Tensor) -> torch.Tensor:
    """(B, T, D) @ (D, C): enough matmul work before the op that its inputs are still pending."""
    h = x
    for _ in range(8):
        h = torch.tanh(h @ w[:, : x.shape[2]])
    return ctc_nll(torch.log_softmax(h @ w, dim=2), targets, lengths, target_lengths, blank=0).sum()


def main() -> None:
    if "--no-wait" in sys.argv[1:]:
        compiler = aot_autograd(fw_compiler=openxla_eval_boxed, bw_compiler=lambda gm, _: make_boxed_func(gm.forward))
    else:
        compiler = spmd_openxla()
    xr.use_spmd()
    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(n), (n,), ("data",))
    device = torch_xla.device()
    B, T, D, C, L = 4 * n, 64, 128, 160, 8
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, D, generator=gen).to(device)
    xs.mark_sharding(x, mesh, ("data", None, None))
    w = (torch.randn(D, C, generator=gen) / D**0.5).to(device).requires_grad_(True)
    targets = torch.randint(1, C, (B, L), generator=gen).to(device)
    lengths = torch.full((B,), T, dtype=torch.int64).to(device)
    target_lengths = torch.full((B,), L, dtype=torch.int64).to(device)
    step = torch.compile(loss, backend=compiler)
    busy = torch.randn(2048, 2048, generator=gen).to(device)
    for _ in range(3):
        for _ in range(4):  # seconds of work queued on the mesh ahead of the step
            busy = torch.tanh(busy @ busy / 64)
        torch_xla.sync()
        (grad,) = torch.autograd.grad(step(x, w, targets, lengths, target_lengths), [w])
        torch_xla.sync(wait=True)
        print(float(grad.norm()), flush=True)
    (grad,) = torch.autograd.grad(loss(x, w, targets, lengths, target_lengths), [w])
    print(float(grad.norm()), flush=True)


if __name__ == "__main__":
    main()
