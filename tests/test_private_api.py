"""The private torch / torch_xla APIs b2t depends on (all in b2t/private_api.py) still exist
and still do what b2t relies on: an upgrade that breaks them fails here, by name."""

from __future__ import annotations

import torch
import torch_xla

from b2t.private_api import (
    autograd_excluded,
    autograd_inside_op,
    scalars_as_device_data,
    special_scalars_handled,
)


def test_the_private_names_exist():
    for name in ("_ForceDispatchKeyGuard", "_dispatch_tls_local_include_set", "_dispatch_tls_local_exclude_set"):
        assert hasattr(torch._C, name), f"torch._C.{name} is gone: update b2t/private_api.py"
    for key in ("AutogradFunctionality", "ADInplaceOrView"):
        assert hasattr(torch._C.DispatchKey, key), f"DispatchKey.{key} is gone: update b2t/private_api.py"
    assert hasattr(torch_xla._XLAC, "_set_xla_handle_special_scalars"), "update b2t/private_api.py"


@torch.library.custom_op("b2t_test::probe_keys", mutates_args=())
def _probe(x: torch.Tensor) -> torch.Tensor:
    """Inside a custom op's kernel: autograd off, then back on under `autograd_inside_op`,
    with autocast exactly as it was (the trap: the exclusion set also switches autocast)."""
    before = torch._C._dispatch_tls_local_exclude_set()
    excluded_outside = autograd_excluded()
    with autograd_inside_op():
        inside = torch._C._dispatch_tls_local_exclude_set()
        leaf = x.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad((leaf * leaf).sum(), leaf)
        excluded_inside = autograd_excluded()
        autocast_same = all((k in repr(before)) == (k in repr(inside)) for k in ("AutocastXLA", "AutocastCPU"))
    return torch.stack([torch.tensor(float(v)) for v in (excluded_outside, excluded_inside, autocast_same)] +
                       [(grad - 2 * x).abs().max().to("cpu")])


@_probe.register_fake
def _(x):
    return x.new_empty((4,))


def test_autograd_comes_back_inside_a_custom_op_and_autocast_does_not():
    x = torch.arange(3.0)
    for autocast in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            excluded_outside, excluded_inside, autocast_same, grad_error = _probe(x).tolist()
        assert excluded_outside == 1.0, "a custom op kernel no longer runs with autograd excluded"
        assert excluded_inside == 0.0 and grad_error == 0.0
        assert autocast_same == 1.0, "autograd_inside_op changed the autocast keys"


def test_scalars_stay_device_data():
    with special_scalars_handled(True):
        scalars_as_device_data()
        t = torch.zeros((), device="cpu").to(torch_xla.device())
        assert "device_data" in torch_xla._XLAC._get_xla_tensors_text([t])
        with special_scalars_handled(True):
            t = torch.zeros((), device="cpu").to(torch_xla.device())
            assert "device_data" not in torch_xla._XLAC._get_xla_tensors_text([t])
