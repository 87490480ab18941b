"""Every registered family satisfies `b2t.model.family.ModelFamily`: each member present with
the Protocol's signature (names, kinds, defaults, type hints; `isinstance` alone checks names
only), its constructor the `FamilyConstructor`'s, and on a tiny model on the CPU each method
returns what the step reads."""

from __future__ import annotations

import inspect
import typing

import pytest
import torch
from torch import nn

from b2t.buckets import patch_count
from b2t.config import GRUConfig, ModelConfig, NoiseSeparatingConfig
from b2t.contract import FEATURE_DIM
from b2t.model.decoder import GRUDecoder
from b2t.model.family import FamilyConstructor, ModelFamily
from b2t.model.masks import DropoutMask
from b2t.model.registry import FAMILIES, build_model
from b2t.phonemes import N_CLASSES

TINY_GRU = GRUConfig(n_units=8, n_layers=2, rnn_dropout=0.2)
TINY = {
    "gru": ModelConfig(patch_size=4, patch_stride=2, input_dropout=0.1, gru=TINY_GRU),
    "noise_separating": ModelConfig(family="noise_separating", patch_size=4, patch_stride=2, input_dropout=0.1,
                                    noise_separating=NoiseSeparatingConfig(noise=TINY_GRU, clean=TINY_GRU,
                                                                           noisy=TINY_GRU)),
}
N_DAYS, B, T = 3, 2, 12
METHODS = ("forward", "dropout_masks", "output_lengths", "schedule", "loss_weights")
ATTRIBUTES = ("heads", "decode_head")


def same_signature(impl: typing.Callable, spec: typing.Callable, *, skip_first: bool) -> list[str]:
    """How `impl`'s signature differs from `spec`'s (parameter names, kinds, defaults, hints);
    `skip_first`: leave out `spec`'s `self` (`impl` is a class, whose signature has none)."""
    want, got = inspect.signature(spec), inspect.signature(impl)
    want_params = list(want.parameters.values())[1 if skip_first else 0:]
    shape = [(p.name, p.kind, p.default) for p in want_params]
    if [(p.name, p.kind, p.default) for p in got.parameters.values()] != shape:
        return [f"parameters {got} differ from {want}"]
    hints = typing.get_type_hints(impl.__init__ if isinstance(impl, type) else impl)
    want_hints = typing.get_type_hints(spec)
    if isinstance(impl, type):  # `__init__` returns None; the Protocol says what the class makes
        del hints["return"], want_hints["return"]
    return [] if hints == want_hints else [f"type hints {hints} differ from {want_hints}"]


def protocol_violations(cls: type) -> list[str]:
    """Every way `cls` falls short of `ModelFamily` and `FamilyConstructor`, as readable lines."""
    problems = [f"{cls.__name__} has no {name}" for name in (*METHODS, *ATTRIBUTES) if not hasattr(cls, name)]
    for name in METHODS:
        if hasattr(cls, name):
            problems += [f"{cls.__name__}.{name}: {p}"
                         for p in same_signature(getattr(cls, name), getattr(ModelFamily, name), skip_first=False)]
    problems += [f"{cls.__name__}(): {p}" for p in same_signature(cls, FamilyConstructor.__call__, skip_first=True)]
    return problems


def test_the_protocol_lists_what_the_step_uses():
    """The check below walks METHODS and ATTRIBUTES: they must be the Protocol's members."""
    members = {n for n, v in vars(ModelFamily).items() if inspect.isfunction(v) and not n.startswith("_")}
    assert members == set(METHODS) and set(typing.get_type_hints(ModelFamily)) == set(ATTRIBUTES)


def test_every_registered_family_has_a_tiny_config_here():
    assert set(TINY) == set(FAMILIES) and all(cfg.family == name for name, cfg in TINY.items())


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_family_has_the_protocol_signatures(family):
    assert protocol_violations(FAMILIES[family]) == []


def test_a_dropped_or_renamed_member_is_caught():
    class Renamed(GRUDecoder):
        def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
            return super().output_lengths(lengths)

    class Retyped(GRUDecoder):
        def schedule(self, step: float) -> dict[str, float]:
            return {}

    class Rebuilt(GRUDecoder):
        def __init__(self, n_days: int, cfg: ModelConfig) -> None:
            super().__init__(n_days, cfg)

    def members(*left_out: str) -> type:
        """A module with GRUDecoder's family members but those `left_out` (and nn.Module's constructor)."""
        kept = {n: getattr(GRUDecoder, n) for n in (*METHODS, *ATTRIBUTES) if n not in left_out}
        return type("Dropped", (nn.Module,), kept)

    assert [len(protocol_violations(c)) for c in (Renamed, Retyped, Rebuilt)] == [1, 1, 1]
    assert isinstance(members()(), ModelFamily)
    for name in (*METHODS, *ATTRIBUTES):
        # without its own forward nn.Module's stands in: isinstance passes, the signature does not
        assert any(p.startswith((f"Dropped has no {name}", f"Dropped.{name}: ")) for p in protocol_violations(members(name)))
        assert isinstance(members(name)(), ModelFamily) == (name == "forward")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_tiny_model_answers_every_member_as_the_step_reads_it(family):
    torch.manual_seed(0)
    model = build_model(TINY[family], N_DAYS).train()
    assert isinstance(model, ModelFamily) and isinstance(model, nn.Module)
    heads = model.heads
    assert isinstance(heads, tuple) and heads and all(isinstance(h, str) for h in heads)
    assert model.decode_head in heads

    masks = model.dropout_masks(B, T)
    assert masks and all(isinstance(m, DropoutMask) for m in masks.values())
    drawn = {name: m.draw(torch.rand(m.shape)) for name, m in masks.items()}
    schedule = model.schedule(100)
    weights = model.loss_weights(100)
    assert all(isinstance(v, float) for v in (*schedule.values(), *weights.values()))
    assert set(weights) == set(heads)

    features = torch.randn(B, T, FEATURE_DIM)
    days = torch.tensor([0, N_DAYS - 1], dtype=torch.int32)
    uploaded = {name: torch.tensor([v]) for name, v in schedule.items()}
    out = model(features, days, drawn, uploaded, None)
    n_patches = patch_count(T, TINY[family].patch_size, TINY[family].patch_stride)
    assert set(out) == set(heads)
    assert {tuple(v.shape) for v in out.values()} == {(B, n_patches, N_CLASSES)}
    assert set(model.eval()(features, days, heads=(model.decode_head,))) >= {model.decode_head}

    lengths = model.output_lengths(torch.tensor([T, 3], dtype=torch.int32))
    assert lengths.dtype == torch.int32 and lengths.tolist() == [n_patches, 0]
