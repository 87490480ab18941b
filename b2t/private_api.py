"""The one place b2t touches private torch and torch_xla APIs (tests/test_private_api.py
fails loudly when an upgrade moves any of them).

`autograd_inside_op`: the XLA kernels of b2t's custom ops (`gru_op`, `ctc_op`) run torch_xla's `scan`,
which builds its own backward with AOTAutograd while it traces, so it needs autograd.
A custom op's kernel runs with the autograd dispatch keys excluded (the op is one opaque
node to autograd), and a plain `scan` there fails ("element 0 of tensors does not
require grad"). `autograd_inside_op` re-includes exactly those keys for the kernel's
duration. It removes ONLY the autograd keys from the exclusion set and keeps the rest:
the exclusion set is also how autocast is switched off, and replacing it wholesale would
turn XLA autocast on inside the kernel (an f32 scan then silently computes in bf16).

Functionalization stays off inside the kernel too, so a kernel must not write through
views (a slice assignment there updates a copy). Private names (torch 2.9):
`torch._C._ForceDispatchKeyGuard`, `torch._C._dispatch_tls_local_{include,exclude}_set`,
`torch._C.DispatchKey.{AutogradFunctionality, ADInplaceOrView}`.

`scalars_as_device_data`: torch_xla traces a 0-dim tensor holding 0 or 1, even one copied
from the host, as a constant of the graph ("special scalars"). AdamW's step counters
start at 0 and the loss gradient seed is 1, so the first step, a snapshot restore, or a
fresh counter each traced graphs no later step reuses. With the handling off they are
device data like any other value. Private name (torch_xla 2.9):
`torch_xla._XLAC._set_xla_handle_special_scalars` (the XLA_NO_SPECIAL_SCALARS variable
does the same but is read only once, at start-up).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_AUTOGRAD_KEYS = (torch._C.DispatchKey.AutogradFunctionality, torch._C.DispatchKey.ADInplaceOrView)
"""Removing the functionality key removes every per-backend Autograd* key with it."""


def autograd_excluded() -> bool:
    """True where autograd is switched off by the dispatcher (inside a custom op's kernel)."""
    return torch._C._dispatch_tls_local_exclude_set().has(torch._C.DispatchKey.AutogradFunctionality)


@contextlib.contextmanager
def autograd_inside_op() -> Iterator[None]:
    """Autograd dispatch keys re-included and grad mode on, every other TLS key unchanged."""
    include = torch._C._dispatch_tls_local_include_set()
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in _AUTOGRAD_KEYS:
        exclude = exclude.remove(key)
    with torch._C._ForceDispatchKeyGuard(include, exclude), torch.enable_grad():
        yield


def scalars_as_device_data() -> None:
    """Process-wide: 0-dim 0 and 1 values on XLA stay device data (see the module docstring)."""
    import torch_xla

    torch_xla._XLAC._set_xla_handle_special_scalars(False)


@contextlib.contextmanager
def special_scalars_handled(handled: bool) -> Iterator[None]:
    """torch_xla's special-scalar handling set to `handled` inside, restored on exit (for the
    sentinel that shows the plain behaviour in a process where the trainer switched it off)."""
    import torch_xla

    before = torch_xla._XLAC._get_xla_handle_special_scalars()
    torch_xla._XLAC._set_xla_handle_special_scalars(handled)
    try:
        yield
    finally:
        torch_xla._XLAC._set_xla_handle_special_scalars(before)
