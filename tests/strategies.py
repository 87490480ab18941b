"""Hypothesis strategies shared across the test suite (append new ones; keep each small)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from b2t.buckets import align_length
from b2t.config import DataConfig, GRUConfig, ModelConfig, NoiseSeparatingConfig
from b2t.data.manifest import SPLITS
from preprocess.trials import TrialRef

SESSIONS = tuple(f"t15.2023.{m:02d}.{d:02d}" for m in (8, 9) for d in (11, 13, 18, 20))
"""Session names in day order, as the reader would list them."""


@st.composite
def trial_refs(draw, *, max_trials: int = 60, max_len: int = 300, max_label: int = 40,
               splits: tuple[str, ...] = SPLITS) -> list[TrialRef]:
    """TrialRefs over a few sessions and splits; lengths and label lengths mix feasible and not.

    Test trials carry no labels, as in the real test files.
    """
    n_sessions = draw(st.integers(1, len(SESSIONS)))
    rows = draw(st.lists(
        st.tuples(
            st.integers(0, n_sessions - 1),
            st.sampled_from(splits),
            st.integers(1, max_len),
            st.lists(st.integers(1, 40), max_size=max_label),
        ),
        min_size=1, max_size=max_trials,
    ))
    return [
        TrialRef(
            file=f"{SESSIONS[day]}/data_{split}.hdf5", group=f"trial_{i:04d}", split=split,
            session=SESSIONS[day], day_index=day, block=1 + i // 20, trial=i % 20,
            n_time_steps=length, labels=() if split == "test" else tuple(labels),
            sentence=None if split == "test" else f"sentence {i}",
        )
        for i, (day, split, length, labels) in enumerate(rows)
    ]


@st.composite
def patchings(draw, max_size: int = 16) -> ModelConfig:
    """Model configs differing only in the patching (the part batching depends on)."""
    size = draw(st.integers(1, max_size))
    return ModelConfig(patch_size=size, patch_stride=draw(st.integers(1, size)))


@st.composite
def data_configs(draw, *, max_len: int = 300, patch_size: int = 14, patch_stride: int = 4) -> DataConfig:
    """DataConfigs whose token budget (when set) holds row_multiple rows of any bucket up to `max_len`."""
    row_multiple = draw(st.sampled_from([1, 2, 4]))
    batch_size = row_multiple * draw(st.integers(1, 8))
    longest = align_length(max_len, patch_size, patch_stride)
    budget = draw(st.none() | st.integers(row_multiple * longest, batch_size * longest))
    return DataConfig(
        n_buckets=draw(st.integers(1, 5)), batch_size=batch_size, token_budget=budget,
        row_multiple=row_multiple, label_multiple=draw(st.sampled_from([1, 4, 8])),
        days_per_batch=draw(st.integers(1, 4)), epochs=draw(st.integers(1, 3)),
        batches_per_shard=draw(st.integers(1, 4)), seed=draw(st.integers(0, 2**16)),
    )


@st.composite
def layout_inputs(draw, *, max_len: int = 300) -> tuple[list[TrialRef], DataConfig, ModelConfig]:
    """Trials plus a data config and patching that fit together (what `plan_layout` takes)."""
    model = draw(patchings())
    refs = draw(trial_refs(max_len=max_len))
    data = draw(data_configs(max_len=max_len, patch_size=model.patch_size, patch_stride=model.patch_stride))
    return refs, data, model


CORPUS_WORDS = ("the", "cat", "sat", "on", "a", "mat", "dog's")


@st.composite
def corpora(draw, *, words: tuple[str, ...] = CORPUS_WORDS, max_sentences: int = 12) -> list[str]:
    """Small text corpora over a few words, so n-grams repeat (counts of 1, 2 and more)."""
    sentence = st.lists(st.sampled_from(words), min_size=1, max_size=8).map(" ".join)
    return draw(st.lists(sentence, min_size=1, max_size=max_sentences))


CTC_SHAPES = ((3, 12, 5, 5), (4, 40, 10, 41))
"""(B, T, L, C) of generated CTC batches: few on purpose, each new shape is an XLA compile."""


@st.composite
def ctc_batches(draw, *, shapes: tuple[tuple[int, ...], ...] = CTC_SHAPES) -> dict[str, torch.Tensor]:
    """CPU CTC inputs: logits (B, T, C) f32, targets (B, L) int32, lengths (B,) int32.

    Labels are 1..C-1 with a coin-flip repeat of the previous label (repeats need an extra
    frame); input lengths are the full T, anything in 0..T, or close to the frames the row
    needs, so padding rows (0, 0), empty targets and infeasible rows all come up.
    """
    B, T, L, C = draw(st.sampled_from(shapes))
    g = torch.Generator(device="cpu").manual_seed(draw(st.integers(0, 2**31 - 1)))
    scale = draw(st.sampled_from([0.5, 3.0, 10.0]))  # flat to peaky output distributions
    logits = torch.randn((B, T, C), generator=g, dtype=torch.float32, device="cpu") * scale
    targets = torch.zeros((B, L), dtype=torch.int32, device="cpu")
    input_lengths, target_lengths = [], []
    for b in range(B):
        if draw(st.integers(0, 3)) == 0:  # a padding row, about one in four
            input_lengths.append(0)
            target_lengths.append(0)
            continue
        labels: list[int] = []
        for repeat, label in draw(st.lists(st.tuples(st.booleans(), st.integers(1, C - 1)), max_size=L)):
            labels.append(labels[-1] if repeat and labels else label)
        targets[b, : len(labels)] = torch.tensor(labels, dtype=torch.int32, device="cpu")
        need = len(labels) + sum(x == y for x, y in zip(labels, labels[1:]))
        near = st.integers(min(T, max(0, need - 2)), min(T, need + 1))
        input_lengths.append(draw(st.just(T) | st.integers(0, T) | near))
        target_lengths.append(len(labels))
    return {
        "logits": logits,
        "targets": targets,
        "input_lengths": torch.tensor(input_lengths, dtype=torch.int32, device="cpu"),
        "target_lengths": torch.tensor(target_lengths, dtype=torch.int32, device="cpu"),
    }


@st.composite
def model_configs(draw, max_units: int = 96, max_layers: int = 4) -> ModelConfig:
    """Small GRU decoder shapes: any size, depth and patching."""
    patching = draw(patchings())
    gru = GRUConfig(n_units=draw(st.integers(1, max_units)), n_layers=draw(st.integers(1, max_layers)))
    return ModelConfig(patch_size=patching.patch_size, patch_stride=patching.patch_stride, gru=gru)


@st.composite
def gru_configs(draw, max_units: int = 24, max_layers: int = 2) -> GRUConfig:
    return GRUConfig(n_units=draw(st.integers(1, max_units)), n_layers=draw(st.integers(1, max_layers)),
                     rnn_dropout=draw(st.sampled_from([0.0, 0.3])))


@st.composite
def family_configs(draw, max_size: int = 6) -> ModelConfig:
    """Small models of every family (small sizes and patches, so many examples run in seconds)."""
    patching = draw(patchings(max_size=max_size))
    sizes = {"patch_size": patching.patch_size, "patch_stride": patching.patch_stride,
             "input_dropout": draw(st.sampled_from([0.0, 0.2]))}
    if draw(st.sampled_from(["gru", "noise_separating"])) == "gru":
        return ModelConfig(family="gru", gru=draw(gru_configs()), **sizes)
    parts = NoiseSeparatingConfig(noise=draw(gru_configs()), clean=draw(gru_configs()), noisy=draw(gru_configs()),
                                  noisy_loss_warmup_steps=draw(st.integers(0, 5)),
                                  reversal_warmup_steps=draw(st.integers(0, 5)))
    return ModelConfig(family="noise_separating", noise_separating=parts, **sizes)
