"""Dropout masks a model declares (b2t.model.masks): inverted dropout in the compute dtype."""

import torch

from b2t.contract import COMPUTE_DTYPE
from b2t.model.masks import DropoutMask


def test_a_drawn_mask_keeps_1_minus_p_and_scales_by_its_inverse():
    torch.manual_seed(0)
    mask = DropoutMask((64, 512), 0.25).draw(torch.device("cpu"))
    assert mask.shape == (64, 512) and mask.dtype == COMPUTE_DTYPE
    assert set(mask.unique().tolist()) == {0.0, torch.tensor(1 / 0.75, dtype=COMPUTE_DTYPE).item()}
    assert abs((mask > 0).float().mean().item() - 0.75) < 0.01
    assert DropoutMask((3,), 0.0).draw(torch.device("cpu")).tolist() == [1.0, 1.0, 1.0]
