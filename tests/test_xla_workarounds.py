"""The register of torch_xla workarounds (b2t.xla_workarounds) and its sentinels.

Each sentinel reproduces a problem with the plain torch / torch_xla API and asserts that it
is still there: on the upgrade that fixes it, the sentinel fails, and the workaround it
names can go.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch_xla
import torch_xla.debug.metrics as met

from b2t.private_api import special_scalars_handled, warm_up_cache
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


def test_sentinel_a_scan_over_a_pending_sharded_result_crashes():
    """tests/model/_pending_ctc_probe.py with torch_xla's plain backward (no wait for the mesh):
    the process dies."""
    run = subprocess.run([sys.executable, "-m", "tests.model._pending_ctc_probe", "--no-wait"],
                         cwd=Path(__file__).parents[1], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "CPU_NUM_DEVICES": "4", "PJRT_DEVICE": "CPU"})
    assert run.returncode != 0 and "GetHandle" in run.stderr, run.stderr[-2000:]

