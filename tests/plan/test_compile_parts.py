"""tools/hlo_parts: which part of the step an HLO instruction and a TPU kernel belong to.

The parsing tests run on small hand-written modules and log lines in the formats XLA and libtpu
write; the trace test tags the tiny config's real train step on the XLA CPU device (in a fresh
process: the trace sets XLA's dump flags before torch_xla starts) and checks that every part the
docs' table names is found, so a renamed function cannot silently empty a row.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from tools.hlo_parts import INPUTS, backend_seconds, computations, count, duration, kernel_parts, loop_computations, part

REPO = Path(__file__).resolve().parents[2]

MODULE = (Path(__file__).parent / "hlo" / "traced.txt").read_text()  # the form of XLA's text dump


def test_the_innermost_named_scope_decides_the_part_and_backward_copies_get_their_own_row():
    assert part("Stepper.train_step.1/Stepper.update.3/adam.1/_single_tensor_adam.9/aten__div") == "AdamW"
    assert part("Stepper.update.3/Optimizer.zero_grad.32/aten__expand") == "zero gradients"
    assert part("Stepper._heads_and_nll.1/augment.2/TorchRng.normal.3/aten__normal") == "RNG"
    assert part("Stepper._heads_and_nll.1/augment.2/aten__add") == "augmentation and smoothing"
    assert part("backward/Stepper._heads_and_nll.1/DayLayer.forward.5/aten__mul") == "day layers (backward)"
    assert part("Stepper._heads_and_nll.1/GRUDecoder.forward.3/_Patches.forward.1/aten__slice") == "patching"
    assert part("backward/GRUDecoder.forward.3/_Patches.backward.2/aten__add") == "patching (backward)"
    assert part("backward/gru_stack.1/_LazyGRULayers.backward.2/stack_backward.3/_walk_scan.4/aten__mm") == "GRU backward"
    # a scope that merely contains a rule's word does not match it
    assert part("scan_nll.1/aot_forward.74/Module._call_impl.1/aten__logsumexp") == "CTC"
    assert part("Stepper.train_step.74/aten__mean") == "loss totals"
    assert part("xla__device_data", "xla__device_data") == INPUTS
    assert part("", "", default="CTC") == "CTC"


def test_a_module_is_counted_per_part_with_loop_bodies_and_callees_taking_their_callers_part():
    comps = computations(MODULE)
    assert set(comps) == {"body.3", "cond.4", "add.5", "SyncTensorsGraph.9"}
    assert [i.opcode for i in comps["SyncTensorsGraph.9"]] == ["parameter", "while", "reduce", "multiply", "tuple"]
    assert loop_computations(comps) == {"body.3", "cond.4"}
    c = count(MODULE)
    assert c.instructions == 12 and c.loops == 1
    # the loop's body and condition: their metadata-less instructions are the while's (GRU forward)
    assert c.total["GRU forward"] == 1 + 3 + 2 and c.in_loops["GRU forward"] == 5
    assert c.total["gradient clipping"] == 1 + 2  # the reduce and its reducer computation
    assert c.total["day layers (backward)"] == 1 and c.total["loss totals"] == 1 and c.total[INPUTS] == 1


def test_libtpu_log_lines_give_each_kernel_its_compiler_thread_time():
    log = "\n".join([
        "I1203 15:47:24.643246    9433 2a886c8_compiler_base.cc:7215] HLO_PASSES stage duration: 434.62594175ms",
        "I1203 15:47:25.000000    9578 2a886c8_compiler_base.cc:2377] [fusion.1] LLO optimizing 1,072 instructions",
        "I1203 15:47:25.500000    9578 2a886c8_compiler_base.cc:10780] LSRAv2 *** total bundle packing time: 3 ms",
        "I1203 15:47:25.100000    9577 2a886c8_compiler_base.cc:2377] [copy.4] LLO optimizing 23 instructions",
        "I1203 15:47:25.300000    9577 2a886c8_compiler_base.cc:10780] LSRAv2 *** total bundle packing time: 1 ms",
        "I1203 15:47:25.600000    9578 2a886c8_compiler_base.cc:2377] [fusion.2] LLO optimizing 5 instructions",
        "I1203 15:47:27.500000    9578 2a886c8_compiler_base.cc:10780] LSRAv2 *** total bundle packing time: 9 ms",
        "I1203 15:48:31.000000    9433 2a886c8_compiler_base.cc:10435] BACKEND_PASSES stage duration: 1m7.04s",
    ])
    b = backend_seconds(log)
    assert b.threads == 2 and b.llo == {"fusion.1": 1072, "copy.4": 23, "fusion.2": 5}
    # a thread's first kernel is timed from its first line, later ones from the previous kernel's end
    assert abs(b.kernels["fusion.1"] - 0.5) < 1e-6 and abs(b.kernels["copy.4"] - 0.2) < 1e-6
    assert abs(b.kernels["fusion.2"] - 2.0) < 1e-6
    assert abs(b.stages["HLO_PASSES"] - 0.43462594175) < 1e-9 and abs(b.stages["BACKEND_PASSES"] - 67.04) < 1e-9
    assert abs(duration("1m7.044448705s") - 67.044448705) < 1e-9 and abs(duration("505us") - 505e-6) < 1e-12


def test_a_kernel_belongs_to_the_part_whose_matmul_it_holds():
    optimized = (Path(__file__).parent / "hlo" / "optimized.txt").read_text()  # a fused matmul kernel
    owners = kernel_parts(optimized)
    assert owners["fusion.7"] == "GRU backward"


def test_tagging_the_tiny_train_step_finds_every_part_of_the_step():
    code = """
import json, os, sys, tempfile
from pathlib import Path
from b2t.config import load_config
from b2t.contract import BucketShape
from b2t.plan.capture import prepare_process, trace, trace_backend
from tools import hlo_parts
with tempfile.TemporaryDirectory() as tmp:
    prepare_process(1, Path(tmp))
    os.environ["XLA_FLAGS"] += " --xla_dump_hlo_as_text"
    backend = trace_backend(None)
    with hlo_parts.tagged():
        trace(load_config(Path("configs/tiny.yaml"), ()), 3, backend, "train", BucketShape(T=64, B=4, L=8), Path(tmp))
    text = next(Path(tmp).glob("*before_optimizations.txt")).read_text()
    c = hlo_parts.count(text)
    print(json.dumps({"total": c.total, "in_loops": c.in_loops, "instructions": c.instructions}))
"""
    env = {**os.environ, "PYTHONPATH": str(REPO), "XLA_IR_DEBUG": "1", "XLA_HLO_DEBUG": "1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    total, loops = r["total"], r["in_loops"]
    for name in ("day layers", "day layers (backward)", "augmentation and smoothing", "RNG", "dropout masks",
                 "patching", "patching (backward)", "GRU forward", "GRU backward", "CTC", "CTC (backward)",
                 "gradient clipping", "AdamW", "loss totals", "loss and objective"):
        assert total.get(name, 0) > 0, (name, total)
    # the recurrences are while-loops: the GRU's forward and backward walks and the CTC recursion
    assert loops["GRU forward"] > 0 and loops["GRU backward"] > 0 and loops["CTC"] > 0
    # nearly every instruction is attributed to a named part of the step
    unnamed = total.get(INPUTS, 0) + total.get("gradient accumulation (autograd)", 0) + total.get("backward (other)", 0)
    assert unnamed < 0.05 * r["instructions"], total
