"""The register of torch_xla workarounds (b2t.xla_workarounds) and its sentinels.

Each sentinel reproduces a problem with the plain torch / torch_xla API and asserts that it
is still there: on the upgrade that fixes it, the sentinel fails, and the workaround it
names can go.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch_xla
import torch_xla.debug.metrics as met

from b2t.private_api import drop_pending_graphs, special_scalars_handled, warm_up_cache
from b2t.xla_workarounds import WORKAROUNDS

REPO = Path(__file__).resolve().parents[1]


def _test_names(path: Path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}


def test_every_workaround_names_an_existing_sentinel_or_says_why_none():
    assert len({w.key for w in WORKAROUNDS}) == len(WORKAROUNDS)
    for w in WORKAROUNDS:
        if w.sentinel is None:
            assert w.no_sentinel, f"{w.key}: no sentinel and no reason"
            continue
        file, _, name = w.sentinel.partition("::")
        assert name in _test_names(REPO / file), f"{w.key}: sentinel {w.sentinel} does not exist"


def _compilations() -> int:
    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


def test_sentinel_import_torch_xla_rebinds_nn_gru():
    assert torch.nn.GRU is not torch.nn.modules.rnn.GRU


def test_sentinel_openxla_cannot_trace_scan():
    from torch_xla.experimental.scan import scan

    def step(carry, x):
        return carry + x, carry.clone()

    def cumulative(xs):
        final, _ = scan(step, torch.zeros(3, device=xs.device), xs)
        return final

    device = torch_xla.device()
    with pytest.raises(RuntimeError, match="Expected XLA tensor"):
        torch.compile(cumulative, backend="openxla")(torch.ones(5, 3, device=device))
        torch_xla.sync()
    torch._dynamo.reset()


@pytest.mark.parametrize(("shape", "graphs"), [((), 2), ((1,), 1)])
def test_sentinel_zero_dim_zero_is_a_graph_constant(shape, graphs):
    """A 0-dim upload of 0.0 compiles a graph of its own; other values share one. (1,) tensors never do."""
    device = torch_xla.device()
    x = torch.ones(4, device=device)
    torch_xla.sync()
    before = _compilations()
    with special_scalars_handled(True):  # torch_xla's default; the XLA backends switch it off
        for value in (0.0, 0.5, 0.25, 0.0):
            s = torch.full(shape, 0.0, dtype=torch.float32, device="cpu").fill_(value).to(device)
            (x * s + 1).cpu()
    assert _compilations() - before == graphs


def test_sentinel_cpu_backward_before_the_xla_device_breaks_xla_backward():
    code = ("import torch, torch_xla\n"
            "a = torch.ones(2, requires_grad=True); (a * 2).sum().backward()\n"
            "x = torch.ones(2, device=torch_xla.device(), requires_grad=True); (x * 2).sum().backward()\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={"PJRT_DEVICE": "CPU", "PATH": "/usr/bin:/bin"})
    assert run.returncode != 0 and "device_ready_queues_" in run.stderr


def test_sentinel_a_graph_compiled_without_running_is_compiled_again_by_sync():
    """An in-place update traced, compiled without running, then synced: two compilations of one graph."""
    w = torch.ones(8, 8).to(torch_xla.device())
    w.mul_(0.5).add_(1.0)
    before = _compilations()
    warm_up_cache([w])  # compiled and cached, not run: w still holds the pending graph
    assert _compilations() - before == 1
    torch_xla.sync()  # the same pending graph, now run
    assert _compilations() - before == 2
    assert torch.equal(w.cpu(), torch.full((8, 8), 1.5))


def _compile_beside_a_sync(source: torch.Tensor, ops: int) -> tuple[float, float]:
    """When a graph of `ops` ops over `source` finished compiling in another thread, and when a
    device-wide sync made meanwhile (nothing pending) returned, in seconds from the compile's start."""
    x = torch.ones(64, 64).to(torch_xla.device())
    torch_xla.sync()
    graph = source
    for i in range(ops):
        graph = torch.sin(graph @ x + i) * torch.cos(graph[:, :1] + i * 0.5)
    ends: dict[str, float] = {}

    def compile_graph() -> None:
        torch_xla._XLAC._xla_warm_up_cache([graph], [])
        ends["compiled"] = time.perf_counter()

    thread = threading.Thread(target=compile_graph)
    start = time.perf_counter()
    thread.start()
    time.sleep(0.2)
    drop_pending_graphs(torch_xla.device())  # the sync has nothing of its own to compile or run
    torch_xla.sync()
    ends["synced"] = time.perf_counter()
    thread.join()
    return ends["compiled"] - start, ends["synced"] - start


def test_sentinel_a_graph_compiling_over_a_placeholder_holds_up_a_sync():
    """Over a placeholder the sync returns only as the compile ends (about 2 s; the compiling
    thread notes its end a moment after the sync is let go, hence the 0.1 s); over a real buffer,
    at once (the graphs differ by an op, so neither finds the other's in the cache)."""
    from torch_xla.core.xla_builder import create_placeholder_tensor

    real = torch.ones(64, 64).to(torch_xla.device())
    compiled, synced = _compile_beside_a_sync(real, 61)
    assert synced < compiled / 2, "a sync waited for a compile over real buffers"
    compiled, synced = _compile_beside_a_sync(create_placeholder_tensor((64, 64), torch.float32), 60)
    assert compiled > 0.5 and synced > compiled - 0.1, (compiled, synced)


def test_sentinel_equal_scalar_uploads_share_one_graph_input():
    """With torch_xla's device-data cache on, two uploaded 0-dim zeros are one input of a graph over both."""
    enabled = torch_xla._XLAC._get_xla_enable_device_data_cache()
    try:
        for cache, inputs in ((True, 1), (False, 2)):
            torch_xla._XLAC._set_xla_enable_device_data_cache(cache)
            a, b = (torch.zeros(()).to(torch_xla.device()) for _ in range(2))
            _, data = torch_xla._XLAC._get_tensors_xla_device_data_node([a * b])
            assert len(data) == inputs, f"device-data cache {'on' if cache else 'off'}"
    finally:
        torch_xla._XLAC._set_xla_enable_device_data_cache(enabled)


def test_sentinel_a_scan_over_a_pending_sharded_result_crashes():
    """tests/model/_pending_ctc_probe.py with torch_xla's plain backward (no wait for the mesh):
    the process dies, with GetHandle's check failing or, on a loaded host, of a segmentation fault
    before that check is reached."""
    run = subprocess.run([sys.executable, "-m", "tests.model._pending_ctc_probe", "--no-wait"],
                         cwd=Path(__file__).parents[1], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "CPU_NUM_DEVICES": "4", "PJRT_DEVICE": "CPU"})
    crashed = run.returncode == -signal.SIGSEGV or "GetHandle" in run.stderr
    assert run.returncode != 0 and crashed, (run.returncode, run.stderr[-2000:])

