"""A model trained in a process where another model (another family, another size) was trained
or evaluated first takes, bit for bit, the losses it takes alone in a fresh process: through
b2t's real train and eval steps (`Stepper`), on the XLA CPU device.

What once broke it: torch_xla's scan caches the step it traced by shapes and dtypes, so the
noise-separating family's evaluation (its decode head only: the CTC scan at B rows, without
gradients) left a trace that the GRU family's training at B rows then reused: no gradient
reached the GRU's weights (grad norm 0), and its losses were other than alone
(`b2t.model.custom_ops.traced_with_grad`; tests/model/test_scan_cache.py holds the op-level
case). Two sizes of one family trace the CTC scan at the same shapes too: trained first they
leave a trace with gradients, only evaluated first (as b2t-eval runs) one without.

Each sequence runs in a fresh process of its own (tests/engine/_cross_model_probe.py): what this
pytest process traced before must not decide the outcome. Each costs a process start and its
compiles (10-25 s on 2 cores), so the default run keeps the two-family case; the slow twins add
the two sizes (trained first, the scan cache cannot leak: the trace has gradients) and openxla
(whose custom-op kernels make the scan's inputs require grad themselves, `custom_ops.detached_run`).
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

ALONE = ("gru_small:3",)
"""A small GRU-family model, 3 train steps and an eval step, in a process of its own."""


def _last_model(backend: str, models: tuple[str, ...]) -> dict[str, Any]:
    """The last model's losses, grad norms and eval losses from the probe of `models` in a fresh process."""
    result = subprocess.run([sys.executable, "-m", "tests.engine._cross_model_probe", backend, *models], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])[-1]


@functools.cache
def _alone(backend: str) -> dict[str, Any]:
    """`ALONE`'s losses on `backend`, once per pytest process."""
    result = _last_model(backend, ALONE)
    assert all(norm > 0 for norm in result["grad_norms"]), result
    return result


@pytest.mark.parametrize(("backend", "first"), [
    pytest.param("xla", "noise_separating:3", id="xla-another-family-trained"),
    pytest.param("xla", "gru:0", id="xla-another-size-only-evaluated", marks=pytest.mark.slow),
    pytest.param("xla", "gru:3", id="xla-another-size-trained", marks=pytest.mark.slow),
    pytest.param("openxla", "noise_separating:3", id="openxla-another-family-trained", marks=pytest.mark.slow),
    pytest.param("openxla", "gru:0", id="openxla-another-size-only-evaluated", marks=pytest.mark.slow),
])
def test_a_model_trained_after_another_in_one_process_takes_its_losses_alone(backend, first):
    """Bit for bit: per-step losses and grad norms, and the eval's per-row losses."""
    assert _last_model(backend, (first, *ALONE)) == _alone(backend)
