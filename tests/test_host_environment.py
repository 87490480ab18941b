"""What this host lacks or limits, said in one line: issue 35, cases 13 to 17 (a read-only numba
cache, a device that is not there, a TPU runtime asked for on a host without a TPU, too few
file descriptors, running out of memory)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from b2t.cli.train import train_main
from b2t.config import TINY_CONFIG, load_config
from b2t.data import loader
from b2t.engine import devices
from b2t.engine.devices import DeviceError, checked_device
from b2t.errors import B2tError
from b2t.plan import compiler
from b2t.train.loop import Run, RunOptions, TrainingError, train

REPO = Path(__file__).resolve().parents[1]
CHECKS = "from b2t.data.rows import compiled_checks; compiled_checks(); print('compiled')"


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env})


def test_13_the_row_checks_compile_where_numba_cannot_cache(tmp_path):
    """A read-only install tree and no writable HOME: numba's `RuntimeError: cannot cache function
    '_rows_fine'` at the first batch. (No cache locator is usable, as there.)"""
    done = _python(CHECKS, NUMBA_CACHE_LOCATOR_CLASSES="IPythonCacheLocator")
    assert done.returncode == 0 and done.stdout.strip() == "compiled", done.stderr


def test_13_a_damaged_numba_cache_index_is_compiled_around(tmp_path):
    """A corrupt index gave an UnpicklingError, naming nothing, on every run."""
    assert _python(CHECKS, NUMBA_CACHE_DIR=str(tmp_path)).returncode == 0
    indexes = list(tmp_path.rglob("*.nbi"))
    assert indexes, "the first run wrote its cache"
    for index in indexes:
        index.write_bytes(b"\x80\x04garbage")
    done = _python(CHECKS, NUMBA_CACHE_DIR=str(tmp_path))
    assert done.returncode == 0 and done.stdout.strip() == "compiled", done.stderr


@pytest.mark.parametrize("device, xla, message", [
    ("potato:3", False, "--device 'potato:3' is not a device name: use cpu or cuda[:N]"),
    ("cuda", False, "--device cuda: this host has 0 CUDA devices: use --device cpu"),
    ("xla:0", False, "run on cpu or cuda[:N] (XLA devices: --backend xla or openxla)"),
    ("cpu", True, "--device cpu: the XLA backends run on XLA devices"),
])
def test_14_a_device_that_is_not_there_is_one_line(device, xla, message, monkeypatch):
    """A torch traceback from backend.py before. The host is made one without CUDA, so the test
    asks the same of a GPU host."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError) as caught:
        checked_device(device, xla)
    assert message in str(caught.value)
    assert checked_device("cpu", False).type == "cpu"


def test_14_train_with_a_device_that_is_not_there(tiny_dataset, tmp_path):
    result = CliRunner().invoke(train_main, [str(tiny_dataset[1]), str(tmp_path / "run"), "--config",
                                             str(TINY_CONFIG), "--backend", "eager", "--device", "potato:3"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert result.output.strip().splitlines()[-1].startswith("error: --device 'potato:3' is not a device name")
    assert not (tmp_path / "run").exists()


def test_15_the_tpu_runtime_asked_for_on_a_host_without_a_tpu(monkeypatch):
    """libtpu retried for minutes (`unexpected worker hostname`) and b2t said nothing."""
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    monkeypatch.setattr(devices, "tpu_present", lambda: False)
    with pytest.raises(DeviceError, match=r"PJRT_DEVICE=TPU, but this host has no TPU .*set PJRT_DEVICE=CPU"):
        devices.select_pjrt_device()
    monkeypatch.setattr(devices, "tpu_present", lambda: True)
    monkeypatch.setattr(devices.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DeviceError, match=r"the TPU runtime \(libtpu\) is not installed"):
        devices.select_pjrt_device()


def test_15_libtpus_start_up_noise_is_caught_and_shown_only_on_failure(capfd):
    """Every successful `b2t-plan --target` printed `E0000 ... INVALID_ARGUMENT` lines from libtpu's C++."""
    with compiler._start_up_noise_caught():
        os.write(2, b"E0000 INVALID_ARGUMENT: unexpected worker hostname\n")
    assert capfd.readouterr().err == ""
    with pytest.raises(RuntimeError), compiler._start_up_noise_caught():
        os.write(2, b"libtpu: the reason\n")
        raise RuntimeError("failed")
    assert capfd.readouterr().err == "libtpu: the reason\n"


def test_16_too_few_file_descriptors_for_the_loader_workers(monkeypatch):
    """`ulimit -n 40` with 2 workers: an `OSError: [Errno 24]` traceback from a queue thread, then a stall."""
    monkeypatch.setattr(loader.resource, "getrlimit", lambda _: (40, 40))
    monkeypatch.setattr(loader.resource, "setrlimit", lambda *_: pytest.fail("the hard limit is the soft one"))
    with pytest.raises(B2tError, match=r"the open-file limit \(ulimit -n\) is 40 with \d+ files open, and 2 "
                                       r"loader workers need about 60 more: raise it .* train.num_workers=0"):
        loader.check_open_files(2)
    loader.check_open_files(0)
    raised = []
    monkeypatch.setattr(loader.resource, "getrlimit", lambda _: (64, 4096))
    monkeypatch.setattr(loader.resource, "setrlimit", lambda _, limits: raised.append(limits))
    loader.check_open_files(2)
    assert raised == [(4096, 4096)], "a low soft limit is raised to the hard one"


@pytest.mark.parametrize("where", ["model", "step"])
def test_17_out_of_memory_is_one_line_naming_where(tiny_dataset, tmp_path, monkeypatch, where):
    """A 30-line allocator traceback before."""
    oom = RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: "
                       "you tried to allocate 3221225472 bytes.")

    def fail(*args, **kwargs):
        raise oom

    if where == "model":
        monkeypatch.setattr("b2t.engine.step.build_model", fail)
        expected = r"out of memory in building the model and its optimizer \(\[enforce fail"
    else:
        step = Run.step
        monkeypatch.setattr(Run, "step", lambda run, stream: fail() if run.state.step == 1 else step(run, stream))
        expected = r"out of memory in step 2 \(.*not enough memory.*\): lower data.batch_size or data.token_budget"
    cfg = load_config(TINY_CONFIG, ["train.backend=eager", "train.steps=3"])
    with pytest.raises(TrainingError, match=expected):
        train(tiny_dataset[1], tmp_path / "run", cfg, replace(RunOptions(), progress=False, device="cpu"))
