"""The process-wide settings b2t makes, all in one place: `configure_process`.

Each one changes how torch, dynamo or torch_xla behave for the whole process, and some of them
count only when made before the XLA runtime starts or before the first graph is traced. So
they are made at start-up, by `make_backend` and `mesh.enable_spmd` (the first things every
entry point does with a device: b2t-train, b2t-eval, the tools), and once by tests/conftest.py
for the whole suite, so that no test depends on which test made them first.
"""

from __future__ import annotations

from b2t.config import BACKENDS, XLA_BACKENDS
from b2t.engine.devices import select_pjrt_device
from b2t.errors import UsageError
from b2t.private_api import raise_recompile_limit, scalars_as_device_data

RECOMPILE_LIMIT = 64
"""Dynamo graphs per compiled function before it silently runs the function eagerly: one per
bucket shape, so well above any sensible bucket count."""


def configure_process(backend_name: str, spmd: bool = False) -> None:
    """Make the settings a run on `backend_name` needs (over an SPMD mesh with `spmd`). Call it
    before anything is traced; calling it again is harmless (every setting is idempotent), and
    it only ever adds settings: a process once switched to SPMD stays so.

    - openxla, inductor: dynamo's recompile limit raised to `RECOMPILE_LIMIT` (one graph per
      bucket; past the limit dynamo would run a bucket eagerly, silently).
    - XLA: PJRT_DEVICE chosen unless set (the TPU where this host has one, else the CPU;
      `devices.select_pjrt_device`), before torch_xla starts its runtime.
    - XLA: 0-dim 0 and 1 values stay device data instead of graph constants
      (`private_api.scalars_as_device_data`): AdamW's zero step counters, a snapshot restore
      and the loss gradient seed would each trace graphs no later step reuses
      (`b2t.xla_workarounds`: special-scalars).
    - SPMD: torch_xla's `use_spmd()`, before the first XLA computation: the process sees
      the mesh's devices as one.

    The model's initial weights are seeded per run (`b2t.engine.step.seeded_model`, from `train.seed`), and
    every step reseeds the draws it makes (`Backend.seed`): those are run inputs, not settings.
    """
    if backend_name not in BACKENDS:
        raise ValueError(f"unknown backend {backend_name!r}: choose one of {', '.join(BACKENDS)}")
    if spmd and backend_name not in XLA_BACKENDS:
        raise UsageError(f"an SPMD mesh needs an XLA backend, not {backend_name!r}")
    if backend_name in ("openxla", "inductor"):
        raise_recompile_limit(RECOMPILE_LIMIT)
    if backend_name not in XLA_BACKENDS:
        return
    select_pjrt_device()
    scalars_as_device_data()
    if spmd:
        import torch_xla.runtime as xr

        xr.use_spmd()
