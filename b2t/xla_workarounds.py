"""The register of torch_xla (and torch) behaviours b2t works around, measured on 2.9.0.

One entry per workaround: what goes wrong, what b2t does instead and where, the version it
was measured on, and the sentinel test that reproduces the problem with the plain API. A
sentinel asserts the problem is still there, so it fails on the upgrade that fixes it:
then the workaround can go (and its entry with it). Entries whose problem is a crash that
cannot be reproduced on demand say so instead of naming a sentinel.

`tests/test_xla_workarounds.py` checks that every named sentinel exists.
"""

from __future__ import annotations

from dataclasses import dataclass

MEASURED_ON = "torch 2.9.0, torch_xla 2.9.0"


@dataclass(frozen=True)
class Workaround:
    key: str
    problem: str  # what the plain API does wrong
    fix: str  # what b2t does instead, and where
    sentinel: str | None  # tests/<file>.py::<test> that reproduces `problem`, or None
    no_sentinel: str = ""  # why there is none (a crash that cannot be reproduced on demand)


WORKAROUNDS: tuple[Workaround, ...] = (
    Workaround(
        "gru-rebind",
        "`import torch_xla` rebinds `torch.nn.GRU` process-wide to a scan GRU that rejects CPU and CUDA tensors.",
        "b2t.model.layers.GRUStack takes torch's own class from torch.nn.modules.rnn and runs `torch.gru` off XLA.",
        "tests/test_xla_workarounds.py::test_sentinel_import_torch_xla_rebinds_nn_gru",
    ),
    Workaround(
        "scan-in-dynamo",
        "torch.compile(backend='openxla') over a function that calls torch_xla's `scan` fails to trace.",
        "The GRU stack and the CTC NLL are torch.library custom ops (b2t.model.gru_op, b2t.model.ctc_op): dynamo "
        "sees one node each, the bridge traces their XLA kernels (the scans), whose autograd keys are re-included "
        "by b2t.private_api.autograd_inside_op.",
        "tests/test_xla_workarounds.py::test_sentinel_openxla_cannot_trace_scan",
    ),
    Workaround(
        "special-scalars",
        "A 0-dim host value of 0 or 1 uploaded to XLA is traced as a graph constant, so a later value makes a new graph.",
        "Per-step values and loss accumulators are uploaded (1,) tensors (b2t.engine.backend.Backend.upload); "
        "learning rates are (1,) tensors uploaded each step (b2t.engine.optim); for the XLA backends "
        "b2t.engine.backend.XlaBackend.configure switches the handling off (b2t.private_api.scalars_as_device_data) "
        "for AdamW's 0-dim step counters and the loss gradient seed.",
        "tests/test_xla_workarounds.py::test_sentinel_zero_dim_zero_is_a_graph_constant",
    ),
    Workaround(
        "openxla-rng-in-graph",
        "Under torch.compile(backend='openxla') a dropout inside the compiled graph draws the same mask every call.",
        "Models declare their masks (b2t.model.masks.DropoutMask); on XLA the compiled step draws them, "
        "and the augmentation noise, from a counter RNG keyed by a per-step seed tensor (b2t.engine.rng, "
        "Backend.rng); eager and inductor draw from torch's RNG.",
        None,
        "seen in the full training step with its islands (val PER stuck near 1 while the lazy backend learned); "
        "a compiled dropout on its own, reseeded per call, draws new masks, so there is no small reproduction",
    ),
    Workaround(
        "autograd-device-queue",
        "A CPU backward before the XLA device exists sets up autograd's device queues without it, and the first "
        "XLA backward then fails an internal assert.",
        "The trainer creates its backend (the XLA device) before any backward; tests/conftest.py does so for the suite.",
        "tests/test_xla_workarounds.py::test_sentinel_cpu_backward_before_the_xla_device_breaks_xla_backward",
    ),
    Workaround(
        "spmd-bridge-backward",
        "Under SPMD, dynamo's compiled backward graph re-run by the openxla bridge reads a forward input from the "
        "first call's buffer (wrong day-layer gradients from step 2).",
        "b2t.engine.backend.spmd_openxla: openxla forward graphs, backward graphs traced lazily into the step.",
        "tests/engine/test_parallel.py::test_spmd_openxla_avoids_the_bridge_bug_stock_openxla_has",
    ),
    Workaround(
        "precompile-not-reused",
        "A graph compiled without running it (`_xla_warm_up_cache`, what the dynamo bridge and the TPU check use) is "
        "cached under another key than the same graph synced by `torch_xla.sync()` (the sync's aliasing setting is "
        "part of the key), so the sync compiles it again.",
        "The warm-up compiles the xla backend's graphs, and what openxla leaves lazy (the update; on a mesh the "
        "backward), by running its steps, one graph after another (b2t.train.warmup); only openxla's dynamo graphs, "
        "which the bridge itself compiles unrun, are compiled side by side (b2t.engine.concurrent_compiles).",
        "tests/test_xla_workarounds.py::test_sentinel_a_graph_compiled_without_running_is_compiled_again_by_sync",
    ),
    Workaround(
        "placeholder-compile-blocks-sync",
        "A graph that reads a placeholder (device data with no buffer yet), compiling in one thread, holds up every "
        "device-wide sync (`torch_xla.sync()`, which the dynamo bridge makes before each trace) in every other "
        "thread until its compile ends; a graph of real buffers compiling does not.",
        "The side-by-side warm-up's stand-ins for the outputs a later graph of the trace reads (openxla's forward, "
        "read by its backward) are zero-filled device buffers (b2t.private_api.bridge_compiles_handed_off).",
        "tests/test_xla_workarounds.py::test_sentinel_a_graph_compiling_over_a_placeholder_holds_up_a_sync",
    ),
    Workaround(
        "device-data-cache",
        "torch_xla's device-data cache gives equal 0-dim uploads one buffer, so a graph traced over two of them "
        "reads one input for both: the side-by-side warm-up's zero stand-ins once made every gradient NaN.",
        "b2t.private_api.bridge_compiles_handed_off makes its stand-ins with the cache off.",
        "tests/test_xla_workarounds.py::test_sentinel_equal_scalar_uploads_share_one_graph_input",
    ),
    Workaround(
        "spmd-async-trace",
        "Under SPMD, tracing the next step while the mesh still runs this one crashed the process inside torch_xla "
        "(a segfault building the scan backward's lowering, or a collective rendezvous timeout) within a few steps.",
        "b2t.engine.backend.Backend.sync waits for each step on a mesh.",
        None,
        "an intermittent crash: no test can make it happen on demand",
    ),
    Workaround(
        "spmd-pending-scan-input",
        "Under SPMD, a scan traced over the result of a graph still running (openxla's lazily traced backward "
        "over its forward's results) segfaulted building its lowering: a sharded placeholder has no first shard "
        "to name it (PjRtShardedData::GetHandle).",
        "b2t.engine.backend.spmd_openxla: each backward waits for the mesh before it is traced.",
        "tests/test_xla_workarounds.py::test_sentinel_a_scan_over_a_pending_sharded_result_crashes",
    ),
)
