"""The torch_xla 2.9 dynamo-bridge bug `b2t.engine.backend.spmd_openxla` works around, in brief.

On an SPMD mesh, `torch.compile(backend="openxla")` of `bmm(x, W.expand(B, ...))` gives the
right gradient of W on the first call and a wrong one from the second call on: the compiled
backward reads the saved forward input `x` from the first call's buffer. With the backward
traced lazily (`spmd_openxla`) every call is right. Run with CPU_NUM_DEVICES=4; prints one
JSON line: per compiler, the largest gradient error of each of three calls.

    python -m tests.engine._bridge_repro
"""

from __future__ import annotations

import json

import numpy as np
import torch


def main() -> None:
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    from b2t.engine.backend import spmd_openxla

    xr.use_spmd()
    n = xr.global_runtime_device_count()
    mesh, device = xs.Mesh(np.arange(n), (n,), ("data",)), torch_xla.device()
    B, F = 4 * n, 8
    w0 = torch.randn(F, F, generator=torch.Generator().manual_seed(0))

    def loss(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.bmm(x, w.expand(x.shape[0], F, F)).square().sum()  # x: (B, 5, F)

    errors = {}
    for name, compiler in (("openxla", "openxla"), ("spmd_openxla", spmd_openxla())):
        torch._dynamo.reset()
        w = w0.clone().to(device).requires_grad_()
        fn = torch.compile(loss, backend=compiler)
        gen, errors[name] = torch.Generator().manual_seed(1), []
        for _ in range(3):
            x = torch.randn(B, 5, F, generator=gen)
            (x_dev,) = xm.send_cpu_data_to_device([x], device, xs.ShardingSpec(mesh, ("data", None, None)))
            w.grad = None
            fn(x_dev, w).backward()
            torch_xla.sync(wait=True)
            w_ref = w0.clone().requires_grad_()
            loss(x, w_ref).backward()
            errors[name].append(float((w.grad.cpu() - w_ref.grad).abs().max() / w_ref.grad.abs().max()))
    print(json.dumps(errors))


if __name__ == "__main__":
    main()
