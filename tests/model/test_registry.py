"""The model registry (b2t.model.registry): one place that builds every family, counted on `meta`."""

from __future__ import annotations

import torch

from b2t.config import MODEL_FAMILIES, ModelConfig
from b2t.model.registry import FAMILIES, build_model, count_parameters


def test_every_config_family_is_registered():
    assert tuple(FAMILIES) == MODEL_FAMILIES


def test_meta_build_has_the_real_shapes_and_no_storage():
    cfg = ModelConfig()
    meta = build_model(cfg, 4, device=torch.device("meta"))
    assert {p.device.type for p in meta.parameters()} == {"meta"}
    real = build_model(cfg, 4)
    assert {k: v.shape for k, v in meta.state_dict().items()} == {k: v.shape for k, v in real.state_dict().items()}


def test_the_reference_model_has_44m_parameters_with_45_days():
    counts = count_parameters(ModelConfig(), 45)
    assert counts == {"day": 45 * (512 * 512 + 512), "gru": 32_464_128, "out": 768 * 41 + 41, "total": 44_315_177}
