"""Which XLA runtime this process talks to, and how many devices and hosts it spans.

The lowest module of the train layer: the backend, the SPMD mesh and the data-parallel
layout all ask it, and it asks nothing of them.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from typing import TYPE_CHECKING

from b2t.errors import B2tError

if TYPE_CHECKING:
    import torch


class DeviceError(B2tError, ValueError):
    """The device asked for is not on this host; the message says what is and what to ask for."""


def select_pjrt_device() -> None:
    """PJRT_DEVICE for torch_xla, unless set: the TPU when this host has one, else the CPU.

    PJRT_DEVICE=TPU on a host without a TPU is refused at once (`check_tpu_runtime`): libtpu
    would retry its start for minutes, printing only `unexpected worker hostname`.
    """
    os.environ.setdefault("PJRT_DEVICE", "TPU" if tpu_present() else "CPU")
    if os.environ["PJRT_DEVICE"].upper() == "TPU":
        check_tpu_runtime()


def tpu_present() -> bool:
    """True on a TPU VM (its chips appear as /dev/accel* or, on v5e and later, /dev/vfio/*)."""
    return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


def check_tpu_runtime() -> None:
    """DeviceError unless this host can start the TPU runtime: a TPU's device files and libtpu."""
    if not tpu_present():
        raise DeviceError("PJRT_DEVICE=TPU, but this host has no TPU (no /dev/accel* or /dev/vfio/* device): "
                          "unset PJRT_DEVICE, or set PJRT_DEVICE=CPU to run XLA on the CPU")
    if importlib.util.find_spec("libtpu") is None:
        raise DeviceError("PJRT_DEVICE=TPU, but the TPU runtime (libtpu) is not installed: make install TARGET=tpu "
                          "(or pip install -e '.[tpu]')")


def checked_device(device: str, xla: bool) -> torch.device:
    """`--device` as a device of this host the backend runs on (XLA devices for the XLA
    backends; cpu or an existing cuda:N for the others), else DeviceError saying what to use.
    A torch traceback from deep inside the backend said it before."""
    import torch

    try:
        d = torch.device(device)
    except RuntimeError:
        raise DeviceError(f"--device {device!r} is not a device name: use cpu or cuda[:N] (eager, inductor), "
                          "xla[:N] (openxla, xla)") from None
    if xla:
        if d.type != "xla":
            raise DeviceError(f"--device {device}: the XLA backends run on XLA devices (xla:N, the "
                              f"PJRT_DEVICE={os.environ.get('PJRT_DEVICE')} runtime's); drop --device, or use "
                              "--backend eager or inductor for cpu and cuda")
        return d
    if d.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (d.index or 0) >= count:
            raise DeviceError(f"--device {device}: this host has {count} CUDA devices"
                              + (f" (cuda:0..cuda:{count - 1})" if count else "") + ": use --device cpu, or drop --device")
        return d
    if d.type != "cpu":
        raise DeviceError(f"--device {device}: the eager and inductor backends run on cpu or cuda[:N]"
                          + (" (XLA devices: --backend xla or openxla)" if d.type == "xla" else ""))
    return d


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
    """Hand `path` to torch_xla's persistent compilation cache, which stores every compiled
    executable there for later runs to load. Call before any XLA work.

    torch_xla 2.9 writes entries on every runtime but cannot load them back (the CPU measured,
    TPU per pytorch/xla#9094), so a second run compiles again; the results are the same either
    way, and `CompileStats.cache_line` tells the user.
    """
    select_pjrt_device()
    import torch_xla.runtime as xr

    os.makedirs(path, exist_ok=True)
    xr.initialize_cache(os.fspath(path), readonly=False)
