"""The suite compiles with XLA CPU's loop fusion emitters (tests/conftest.py, for speed): a
training step must give what the default emitters give, bit for bit, or the suite would be
testing other numbers than a user's CPU run computes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._cpu_codegen_probe import step
from tests.conftest import CPU_CODEGEN_FLAG

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a check of the suite's own flag, not of b2t: make test-all runs it
def test_the_suites_cpu_emitters_train_bit_identically_to_the_default_ones(tiny_dataset):
    _, shards = tiny_dataset
    assert CPU_CODEGEN_FLAG in os.environ["XLA_FLAGS"].split(), "the suite runs with the flag"
    default = os.environ["XLA_FLAGS"].replace(CPU_CODEGEN_FLAG, "").strip()
    theirs = subprocess.Popen([sys.executable, "-m", "tests._cpu_codegen_probe", str(shards)], cwd=REPO,
                              env={**os.environ, "XLA_FLAGS": default}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    ours = step(shards)
    out, err = theirs.communicate(timeout=300)
    assert theirs.returncode == 0, err[-3000:]
    assert ours == json.loads(out.splitlines()[-1])
