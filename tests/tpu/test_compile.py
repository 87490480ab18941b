"""The TPU compiler's verdict on b2t's own train step, compiled for one v5e chip on this CPU
machine (libtpu's compile-only devices; no TPU needed)."""

import json
import os
import re
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
    one = ("RESOURCE_EXHAUSTED: Allocation (size=35219570688) would exceed memory (size=17179869184) :: "
           "#allocation882 [shape = 'bf16[622,3072,9216]{1,2,0:T(8,128)(2,1)}', space=hbm, size = 0xffffffffffffffff, "
           "tag = 'output of broadcast.34508.clone.1@{}'] :: <no-hlo-instruction>")
    assert summarise_refusal(one) == ("does not fit: one buffer of 32.8 GiB (bf16[622,3072,9216], output of "
                                      "broadcast.34508.clone.1@{}) exceeds the chip's 16.0 GiB")
    assert summarise_refusal("\nINVALID_ARGUMENT: bad sharding\nmore") == "compiler error: INVALID_ARGUMENT: bad sharding"


def test_a_graph_total_counts_donated_outputs_once():
    m = Memory(arguments=100, outputs=80, aliased=60, temp=30, code=5)
    assert m.total == 100 + 80 - 60 + 30 + 5


def _probe(*shapes: str) -> list[dict]:
    out = subprocess.run([sys.executable, str(REPO / "tests/tpu/_compile_probe.py"), *shapes], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_the_tpu_compiler_sizes_the_train_step_and_refuses_a_step_too_large_for_a_v5e_chip():
    """A small GRU model's train step (day layers, GRU, CTC, backward, AdamW) at 4 rows fits one
    v5e chip, with the state the step overwrites donated (aliased). With 16384 GRU units its f32
    weights, gradients and AdamW moments alone are about 18 GiB: the compiler refuses it and
    says by how much it is over the chip's 16 GiB."""
    small, huge = _probe("64x4x16", "64x4x16384")
    assert small["fits"] and small["refusal"] == ""
    m = small["memory"]
    assert m["arguments"] > 0 and m["code"] > 0 and 0 < m["total"] < 16 * GiB
    # weights, gradients and AdamW moments are overwritten by the step: their buffers are reused
    assert small["donors"] > 0 and m["aliased"] > 0.5 * m["outputs"]
    assert small["flops"] > 0
    assert not huge["fits"] and huge["memory"] is None
    # the compiler's own figure: all buffers together, or (here, measured) the largest one alone
    assert re.match(r"does not fit: (needs [\d.]+G of [\d.]+G HBM|one buffer of [\d.]+ GiB)", huge["refusal"]), huge

