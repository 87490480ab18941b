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
