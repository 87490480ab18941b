"""The suite compiles with XLA CPU's loop fusion emitters (tests/conftest.py, for speed): a
training step must compute what the default emitters compute, up to where they round, or the
suite would be testing other numbers than a user's CPU run computes.

The step computes in bf16, and the two emitters may round its products and order its sums
differently (the GRU backward's weight gradients sum over rows and steps as two dims).
So the loss and the gradient norm agree to a few f32 roundings, and each weight after the AdamW
update to one f32 rounding of its own plus one bf16 rounding of the largest move AdamW makes
in a step (lr: a first step moves a weight by lr * g / (|g| + eps)); a miscompiled step would
differ by the move itself. docs/testing.md gives the measured differences."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests._cpu_codegen_probe import step
from tests.conftest import CPU_CODEGEN_FLAG

REPO = Path(__file__).resolve().parents[1]
FLOAT_ROUNDINGS = 8  # f32 roundings between the two loss and gradient norm values


@pytest.mark.slow  # a check of the suite's own flag, not of b2t: make test-all runs it
def test_the_suites_cpu_emitters_train_like_the_default_ones(tiny_dataset, tmp_path):
    _, shards = tiny_dataset
    assert CPU_CODEGEN_FLAG in os.environ["XLA_FLAGS"].split(), "the suite runs with the flag"
    default = os.environ["XLA_FLAGS"].replace(CPU_CODEGEN_FLAG, "").strip()
    theirs = subprocess.Popen([sys.executable, "-m", "tests._cpu_codegen_probe", str(shards), str(tmp_path / "d.npz")],
                              cwd=REPO, env={**os.environ, "XLA_FLAGS": default}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    ours = {k: float.fromhex(v) for k, v in step(shards, tmp_path / "ours.npz").items()}
    out, err = theirs.communicate(timeout=300)
    assert theirs.returncode == 0, err[-3000:]
    default_floats = {k: float.fromhex(v) for k, v in json.loads(out.splitlines()[-1]).items()}
    assert ours["lr"] == default_floats["lr"] > 0
    for name in ("loss", "grad_norm"):
        a, b = np.float32(ours[name]), np.float32(default_floats[name])
        assert abs(a - b) <= FLOAT_ROUNDINGS * np.spacing(a), (name, ours[name], default_floats[name])
    move = torch.finfo(torch.bfloat16).eps * ours["lr"]  # one bf16 rounding of AdamW's largest move
    mine, default_weights = np.load(tmp_path / "ours.npz"), np.load(tmp_path / "d.npz")
    assert sorted(mine.files) == sorted(default_weights.files)
    for name in mine.files:
        a, b = mine[name], default_weights[name]
        own = np.spacing(np.float32(np.abs(a).max()))  # one f32 rounding at the tensor's largest value
        assert np.abs(a - b).max() <= own + move, (name, float(np.abs(a - b).max()), float(own), move)
