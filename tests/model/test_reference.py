"""The baseline checkpoint's keys (b2t.model.reference): its weights give its logits in GRUDecoder."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.modules.rnn import GRU as TorchGRU

from b2t.config import ModelConfig
from b2t.model.decoder import CTC_HEAD, GRUDecoder
from b2t.model.reference import from_reference_state_dict, reference_shapes, strip_compile_prefix
from tests.model.test_decoder import SMALL, batch, small_model
from tests.model.test_layers import unfold_patches

CPU = torch.device("cpu")


def reference_state_dict(model: GRUDecoder) -> dict[str, torch.Tensor]:
    """`model`'s weights in the baseline checkpoint's layout (per-day keys, `_orig_mod.` prefix)."""
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("day.") and k != "gru.h0"}
    state["h0"] = model.gru.h0.detach()
    for d in range(model.n_days):
        state[f"day_weights.{d}"] = model.day.weight[d].detach()
        state[f"day_biases.{d}"] = model.day.bias[d].detach()
    return {f"_orig_mod.{k}": v for k, v in state.items()}


def reference_logits(
    state: dict[str, torch.Tensor], cfg: ModelConfig, x: torch.Tensor, days: torch.Tensor
) -> torch.Tensor:
    """The baseline's forward in eval mode, written out: a per-row loop over day weights."""
    state = {k.removeprefix("_orig_mod."): v for k, v in state.items()}
    w = torch.stack([state[f"day_weights.{d}"] for d in days.tolist()])  # (B, F, F)
    b = torch.cat([state[f"day_biases.{d}"] for d in days.tolist()]).unsqueeze(1)  # (B, 1, F)
    x = F.softsign(torch.einsum("btd,bdk->btk", x, w) + b)
    x = unfold_patches(x, cfg.patch_size, cfg.patch_stride)
    g = cfg.gru
    gru = TorchGRU(x.shape[2], g.n_units, g.n_layers, batch_first=True, device=CPU, dtype=torch.float32)
    gru.load_state_dict({k.removeprefix("gru."): v for k, v in state.items() if k.startswith("gru.")})
    h0 = state["h0"].expand(g.n_layers, x.shape[0], g.n_units).contiguous()
    return F.linear(gru(x, h0)[0], state["out.weight"], state["out.bias"])


def test_forward_equals_the_baseline_forward_on_its_checkpoint() -> None:
    """Day selection (vs a per-row loop), patch order and h0 expansion, end to end."""
    donor = small_model(seed=1)
    with torch.no_grad():  # days that differ, so a wrong day choice shows
        donor.day.weight.add_(0.1 * torch.randn_like(donor.day.weight))
        donor.day.bias.add_(0.1 * torch.randn_like(donor.day.bias))
    state = reference_state_dict(donor)
    model = small_model().eval()
    model.load_state_dict(from_reference_state_dict(state))
    x, _ = batch(5, 37)
    days = torch.tensor([2, 0, 2, 1, 0], dtype=torch.int32, device=CPU)
    with torch.no_grad():
        torch.testing.assert_close(model(x, days)[CTC_HEAD], reference_logits(state, SMALL, x, days))


def test_reference_state_dict_with_a_missing_day_is_refused() -> None:
    state = reference_state_dict(small_model())
    del state["_orig_mod.day_weights.1"]
    with pytest.raises(ValueError, match=r"day_weights\.<d> keys must be numbered 0\.\.n-1"):
        from_reference_state_dict(state)


def test_reference_shapes_name_the_baseline_keys():
    shapes = reference_shapes(small_model(), 2)
    assert shapes["day_weights.1"] == (512, 512) and shapes["day_biases.0"] == (1, 512)
    assert shapes["h0"] == (1, 1, SMALL.gru.n_units) and "gru.h0" not in shapes
    assert strip_compile_prefix({"_orig_mod.out.bias": 1, "h0": 2}) == {"out.bias": 1, "h0": 2}
