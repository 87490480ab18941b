"""Suite-wide settings: the XLA device is the CPU one, hypothesis prints reproduction blobs."""

import os

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch_xla  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

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
