"""Which XLA runtime this process talks to, and how many devices and hosts it spans.

The lowest module of the train layer: the backend, the SPMD mesh and the data-parallel
layout all ask it, and it asks nothing of them.
"""

from __future__ import annotations

import os


def select_pjrt_device() -> None:
    """PJRT_DEVICE for torch_xla, unless set: the TPU when this host has one, else the CPU."""
    os.environ.setdefault("PJRT_DEVICE", "TPU" if tpu_present() else "CPU")


def tpu_present() -> bool:
    """True on a TPU VM (its chips appear as /dev/accel* or, on v5e and later, /dev/vfio/*)."""
    return os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0")


def xla_rank_world() -> tuple[int, int]:
    """(host index, host count) of the XLA runtime: 0 of 1 on one host, pod hosts otherwise."""
    import torch_xla.runtime as xr

    return xr.process_index(), xr.process_count()


def device_count(xla: bool) -> int:
    """Devices a run could use: every XLA device of this host's runtime, else CUDA GPUs (at least 1)."""
    if xla:
        select_pjrt_device()
        import torch_xla.runtime as xr

        return xr.global_runtime_device_count()
    import torch

    return max(torch.cuda.device_count(), 1)


def use_compile_cache(path: str | os.PathLike) -> None:
    """Keep every compiled XLA executable in `path` and load it from there in later runs (a
    resumed or repeated run on a TPU or GPU skips its compiles). Call before any XLA work.

    The XLA CPU runtime writes entries but cannot load them back, so on the CPU a second run
    compiles again (torch_xla 2.9); the results are the same either way.
    """
    select_pjrt_device()
    import torch_xla.runtime as xr

    os.makedirs(path, exist_ok=True)
    xr.initialize_cache(os.fspath(path), readonly=False)
