"""The suite compiles with XLA CPU's loop fusion emitters (tests/conftest.py, for speed): a
training step must give what the default emitters give, or the suite would be testing other
numbers than a user's CPU run computes. The loss and gradient norm agree bit for bit; the
weights after the AdamW update may differ by a rounding (the two emitters round the update's
arithmetic differently: measured, 1 f32 ulp at 1.0 in a few thousand of day.weight's 1.3M
entries), never by more than one rounding at each tensor's scale."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests._cpu_codegen_probe import step
from tests.conftest import CPU_CODEGEN_FLAG

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a check of the suite's own flag, not of b2t: make test-all runs it
def test_the_suites_cpu_emitters_train_like_the_default_ones(tiny_dataset, tmp_path):
    _, shards = tiny_dataset
    assert CPU_CODEGEN_FLAG in os.environ["XLA_FLAGS"].split(), "the suite runs with the flag"
    default = os.environ["XLA_FLAGS"].replace(CPU_CODEGEN_FLAG, "").strip()
    theirs = subprocess.Popen([sys.executable, "-m", "tests._cpu_codegen_probe", str(shards), str(tmp_path / "d.npz")],
                              cwd=REPO, env={**os.environ, "XLA_FLAGS": default}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    ours = step(shards, tmp_path / "ours.npz")
    out, err = theirs.communicate(timeout=300)
    assert theirs.returncode == 0, err[-3000:]
    assert ours == json.loads(out.splitlines()[-1])
    mine, default_weights = np.load(tmp_path / "ours.npz"), np.load(tmp_path / "d.npz")
    assert sorted(mine.files) == sorted(default_weights.files)
    for name in mine.files:
        a, b = mine[name], default_weights[name]
        rounding = np.spacing(np.float32(np.abs(a).max()))  # one f32 rounding at the tensor's largest value
        assert np.abs(a - b).max() <= rounding, (name, float(np.abs(a - b).max()), float(rounding))
