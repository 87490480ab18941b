"""Batch planning (preprocess.batching): the layout properties for any generated input."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from b2t.buckets import ctc_min_patches, patch_count
from b2t.config import DataConfig, ModelConfig
from preprocess.batching import even_split, infeasibility, plan_layout
from preprocess.trials import DataError, TrialRef
from tests.strategies import SESSIONS, layout_inputs, trial_refs

# --- pieces of the plan --------------------------------------------------------------

@given(st.integers(0, 100), st.lists(st.integers(0, 50), min_size=1, max_size=6))
def test_even_split_is_even_and_bounded(rows, available):
    takes = even_split(rows, available)
    assert sum(takes) == min(rows, sum(available))
    assert all(0 <= t <= a for t, a in zip(takes, available))
    # a pool that still has trials left got at least as many as any other pool
    open_takes = [t for t, a in zip(takes, available) if t < a]
    assert not open_takes or max(open_takes) >= max(takes) - 1


def test_infeasibility_reasons():
    ref = _ref(n=13, labels=(1,))
    assert "shorter than one patch of 14 bins" in infeasibility(ref, 14, 4)
    # 18 bins -> 2 patches; (5, 5) needs 3 (a blank between the repeats); (5, 6) needs 2
    assert "CTC needs 3" in infeasibility(_ref(n=18, labels=(5, 5)), 14, 4)
    assert infeasibility(_ref(n=18, labels=(5, 6)), 14, 4) is None
    assert infeasibility(_ref(n=14, labels=()), 14, 4) is None


def _ref(n: int, labels: tuple[int, ...], session: str = SESSIONS[0], split: str = "train", i: int = 0):
    return TrialRef(file=f"{session}/data_{split}.hdf5", group=f"trial_{i:04d}", split=split,
                    session=session, day_index=SESSIONS.index(session), block=1, trial=i,
                    n_time_steps=n, labels=labels, sentence="s")


# --- the layout, for any input -------------------------------------------------------

@given(layout_inputs())
def test_layout_properties(inputs):
    refs, data, model = inputs
    feasible = [r for r in refs if infeasibility(r, model.patch_size, model.patch_stride) is None]
    if not feasible:
        with pytest.raises(DataError, match="no trial is left"):
            plan_layout(refs, data, model)
        return
    layout = plan_layout(refs, data, model)
    buckets = layout.buckets

    # shapes: <= K, patch-aligned, each plan exactly its bucket's B rows, padding rows last
    assert len(buckets) <= data.n_buckets
    assert [b.T for b in buckets] == sorted({b.T for b in buckets})
    assert all((b.T - model.patch_size) % model.patch_stride == 0 for b in buckets)
    assert all(b.B % data.row_multiple == 0 and b.L % data.label_multiple == 0 for b in buckets)
    for p in layout.plans:
        assert len(p.rows) == buckets[p.bucket].B
        assert p.rows[:len(p.trials)] == tuple(p.trials)
        for r in p.trials:  # each trial fits its bucket, and it is the smallest that does
            assert r.n_time_steps <= buckets[p.bucket].T and len(r.labels) <= buckets[p.bucket].L
            assert p.bucket == 0 or r.n_time_steps > buckets[p.bucket - 1].T
            assert r.split == p.split
        # the reference's day rule: a batch mixes at most days_per_batch sessions
        if p.split == "train":
            assert len({r.session for r in p.trials}) <= data.days_per_batch
        assert p.trials, "a batch holds at least one real trial"

    # exclusions: exactly the infeasible trials, each with a reason; nothing dropped silently
    excluded = {(e.file, e.trial) for e in layout.exclusions}
    assert excluded == {(r.file, r.group) for r in refs} - {(r.file, r.group) for r in feasible}
    assert all(e.reason for e in layout.exclusions)
    for r in feasible:
        assert patch_count(r.n_time_steps, model.patch_size, model.patch_stride) >= max(1, ctc_min_patches(r.labels))

    # coverage: val/test once, train once per epoch, nothing from outside the source
    for split in ("val", "test"):
        seen = Counter(r for p in layout.plans if p.split == split for r in p.trials)
        assert seen == Counter(r for r in feasible if r.split == split)
    train = [r for r in feasible if r.split == "train"]
    for epoch in range(data.epochs):
        seen = Counter(r for p in layout.plans if p.split == "train" and p.epoch == epoch for r in p.trials)
        assert seen == Counter(train)
    assert {p.epoch for p in layout.plans if p.split != "train"} <= {0}

    # stats agree with the plans
    for split, stats in layout.stats.items():
        plans = [p for p in layout.plans if p.split == split]
        assert stats.n_batches == len(plans)
        assert stats.n_trials == sum(len(p.trials) for p in plans)
        assert stats.padding_rows == sum(len(p.rows) for p in plans) - stats.n_trials
        assert 0.0 <= stats.padding_fraction <= stats.slot_padding_fraction < 1.0


@given(trial_refs(max_trials=40, max_label=0, splits=("val", "test")), st.randoms(use_true_random=False))
def test_eval_plans_are_deterministic_and_full_but_last(refs, rnd):
    data, model = DataConfig(batch_size=4, n_buckets=2), ModelConfig(patch_size=1, patch_stride=1)
    layout = plan_layout(refs, data, model)
    shuffled = list(refs)
    rnd.shuffle(shuffled)
    assert plan_layout(shuffled, data, model).plans == layout.plans
    for split in ("val", "test"):
        for b in range(len(layout.buckets)):
            plans = [p for p in layout.plans if p.split == split and p.bucket == b]
            assert all(len(p.trials) == layout.buckets[b].B for p in plans[:-1])
            order = [(r.day_index, int(r.group[6:])) for p in plans for r in p.trials]
            assert order == sorted(order)


def test_train_epochs_are_shuffled_differently_and_reproducibly():
    rnd = random.Random(0)
    refs = [_ref(n=rnd.randint(14, 200), labels=(1, 2), session=SESSIONS[i % 6], i=i) for i in range(300)]
    data, model = DataConfig(batch_size=16, epochs=2, days_per_batch=4), ModelConfig()
    layout = plan_layout(refs, data, model)
    by_epoch = [[p.rows for p in layout.plans if p.epoch == e] for e in range(2)]
    assert by_epoch[0] != by_epoch[1]
    assert plan_layout(refs, data, model).plans == layout.plans
    assert plan_layout(refs, DataConfig(batch_size=16, epochs=2, seed=1), model).plans != layout.plans
    # six sessions with plenty of trials each: only the tail of each bucket is short
    unavoidable = sum(-sum(len(p.trials) for p in layout.plans if p.epoch == e and p.bucket == b) % B.B
                      for e in range(2) for b, B in enumerate(layout.buckets))
    assert layout.stats["train"].padding_rows == unavoidable
    assert {len({r.session for r in p.trials}) for p in layout.plans} <= {1, 2, 3, 4}
    # batches interleave buckets rather than running one bucket after another
    buckets = [p.bucket for p in layout.plans if p.epoch == 0]
    assert sum(a != b for a, b in zip(buckets, buckets[1:])) > len(set(buckets))


def test_a_trial_too_long_for_the_token_budget_is_named():
    refs = [_ref(n=500, labels=(1,))]
    with pytest.raises(DataError, match=r"trial_0000: 500 bins need a bucket of T=502.*token_budget to at least 502"):
        plan_layout(refs, DataConfig(batch_size=8, token_budget=100), ModelConfig())


def test_skip_bad_leaves_out_a_trial_too_long_for_the_token_budget():
    """Issue 35 case 18: one 20,000-bin trial failed the whole bucket table, naming no trial, with --skip-bad too."""
    refs = [_ref(n=200 + 4 * i, labels=(1, 2), i=i) for i in range(8)] + [_ref(n=20_000, labels=(1,), i=8)]
    data = DataConfig(batch_size=8, token_budget=4096, epochs=1)
    layout = plan_layout(refs, data, ModelConfig(), skip_bad=True)
    assert [(e.trial, e.reason) for e in layout.exclusions] == [
        ("trial_0008", "20000 bins need a bucket of T=20002, and data.token_budget=4096 holds 0 rows of it, "
                       "fewer than data.row_multiple=1")]
    assert sum(len(p.trials) for p in layout.plans) == 8 and max(b.T for b in layout.buckets) < 4096
