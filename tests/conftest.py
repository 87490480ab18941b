"""Suite-wide settings: the XLA device is the CPU one (compiled with the faster loop emitters),
b2t's process-wide settings made once, before any test (`b2t.engine.backend.configure_process`: no test depends
on which test made them first), hypothesis prints reproduction blobs."""

import os

os.environ.setdefault("PJRT_DEVICE", "CPU")

CPU_CODEGEN_FLAG = "--xla_cpu_use_fusion_emitters=false"
"""XLA CPU's older loop emitters for fusions: the suite compiles about a hundred graphs and runs
each a few times, and these compile the tiny train step in about half the time (4 graphs: 29 s
-> 17 s of CompileTime) to the same step up to where the bf16 arithmetic rounds
(tests/test_cpu_codegen.py says how far and checks it).
Set before torch_xla starts its client; the subprocesses tests spawn inherit it."""
if CPU_CODEGEN_FLAG.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {CPU_CODEGEN_FLAG}".strip()

import torch_xla  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from b2t.engine.backend import configure_process  # noqa: E402

configure_process("openxla")  # every non-SPMD setting: openxla's are a superset of the other backends'

# Create the XLA device before any CPU backward runs: otherwise the autograd engine's
# device queues are set up without it and the first XLA backward fails an internal assert.
torch_xla.device()

settings.register_profile(
    "b2t",
    print_blob=True,
    deadline=None,
    max_examples=int(os.environ.get("B2T_HYPOTHESIS_EXAMPLES", "25")),
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("b2t")


import pytest  # noqa: E402

from b2t.config import TINY_CONFIG  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    """A b2t-synth tree (5 sessions) preprocessed with configs/tiny.yaml: (hdf5 root, shard dir)."""
    from b2t.config import load_config
    from preprocess.synth import SynthSpec, write_dataset
    from preprocess.writer import prepare_dataset

    root = tmp_path_factory.mktemp("tiny")
    write_dataset(SynthSpec(sessions=5, seed=0), root / "hdf5")
    prepare_dataset(root / "hdf5", root / "shards", load_config(TINY_CONFIG), workers=1, progress=False)
    return root / "hdf5", root / "shards"
