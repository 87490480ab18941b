"""The TPU compiler's verdict on b2t's own train step, compiled for one v5e chip on this CPU
machine (libtpu's compile-only devices; no TPU needed)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from b2t.tpu.compiler import Memory, summarise_refusal
from b2t.tpu.targets import TARGETS, parse_target

REPO = Path(__file__).resolve().parents[2]
GiB = 1024**3


def test_known_targets_and_a_clear_refusal_of_others():
    assert parse_target("v5e-8").chips == 8 and parse_target("v5litepod-8").topology == "v5e:2x4"
    assert parse_target("v4-8").chips == 4 and parse_target("v4-8").chip_config == "megacore"
    assert {"v5e-1", "v5e-4", "v5e-8", "v6e-8", "v5p-8", "v4-8", "v5e-64"} <= set(TARGETS)
    assert TARGETS["v5e-64"].hosts == 16
    with pytest.raises(ValueError, match="v9-8.*choose one of v5e-1"):
        parse_target("v9-8")


def test_the_out_of_memory_message_is_summarised_with_the_compilers_figures():
    message = ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. "
               "Used 22.32G of 15.75G hbm. Exceeded hbm capacity by 6.57G.\n\nTotal hbm usage >= 22.57G: ...")
    assert summarise_refusal(message) == "does not fit: needs 22.32G of 15.75G HBM per chip (6.57G over)"
    assert summarise_refusal("\nINVALID_ARGUMENT: bad sharding\nmore") == "compiler error: INVALID_ARGUMENT: bad sharding"


def test_a_graph_total_counts_donated_outputs_once():
    m = Memory(arguments=100, outputs=80, aliased=60, temp=30, code=5)
    assert m.total == 100 + 80 - 60 + 30 + 5


def _probe(*shapes: str) -> list[dict]:
    out = subprocess.run([sys.executable, str(REPO / "tests/tpu/_compile_probe.py"), *shapes], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_the_tpu_compiler_sizes_the_train_step_and_refuses_a_batch_too_large_for_a_v5e_chip():
    """A small GRU model's train step (forward, CTC, backward, AdamW) at 4 rows fits one v5e chip,
    with the state the step overwrites donated (aliased); at 8192 rows x 64 bins its per-row day
    weights and activations need more than the chip's 16 GiB, and the compiler says by how much."""
    small, huge = _probe("64x4", "64x8192")
    assert small["fits"] and small["refusal"] == ""
    m = small["memory"]
    assert m["arguments"] > 0 and m["code"] > 0 and 0 < m["total"] < 16 * GiB
    # weights, gradients and AdamW moments are overwritten by the step: their buffers are reused
    assert small["donors"] > 0 and m["aliased"] > 0.5 * m["outputs"]
    assert small["flops"] > 0
    assert not huge["fits"] and huge["memory"] is None
    assert huge["refusal"].startswith("does not fit: needs ") and "HBM per chip" in huge["refusal"]
    needed = float(huge["refusal"].split("needs ")[1].split("G of")[0])
    assert needed > 16
