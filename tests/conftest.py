"""Suite-wide settings: the XLA device is the CPU one, hypothesis prints reproduction blobs."""

import os

os.environ.setdefault("PJRT_DEVICE", "CPU")

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "b2t",
    print_blob=True,
    deadline=None,
    max_examples=int(os.environ.get("B2T_HYPOTHESIS_EXAMPLES", "25")),
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("b2t")
