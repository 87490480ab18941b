"""The process-wide settings: made by one function, idempotent, refused where they cannot hold."""

import pytest
import torch
import torch_xla

from b2t.engine.backend import RECOMPILE_LIMIT, configure_process
from b2t.private_api import special_scalars_handled


def test_configuring_makes_the_settings_and_again_keeps_them():
    """From torch's and torch_xla's defaults (the suite's conftest made the settings already).

    The limit is set back by dynamo's own `config.patch`: pytest's monkeypatch deletes the
    attribute on undo, which hides the key from torch's config module for the rest of the process."""
    with torch._dynamo.config.patch(recompile_limit=8), special_scalars_handled(True):
        for _ in range(2):
            configure_process("openxla")
            assert torch._dynamo.config.recompile_limit == RECOMPILE_LIMIT
            assert not torch_xla._XLAC._get_xla_handle_special_scalars(), "0-dim 0 and 1 would be graph constants"


def test_spmd_needs_an_xla_backend_and_a_known_name():
    with pytest.raises(ValueError, match="an SPMD mesh needs an XLA backend, not 'eager'"):
        configure_process("eager", spmd=True)
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        configure_process("tpu")
