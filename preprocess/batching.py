"""Which trials go into which fixed-shape batch: exclusions, the bucket table, batch plans.

Pure (no I/O) so the writer, the tests and the benchmark plan identical batches from the
same TrialRefs and config. Every split shares one bucket table, so train, val and test
batches together show the compiled step at most `data.n_buckets` shapes.

Shape legend: B rows per batch, T time bins, L label slots (see `b2t.contract`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from b2t.buckets import align_length, bucket_index, bucket_table, ctc_min_patches, padding_fraction, patch_count
from b2t.config import ConfigError, DataConfig, ModelConfig
from b2t.contract import BucketShape
from b2t.data.manifest import SPLITS, Exclusion
from b2t.errors import UsageError
from preprocess.trials import DataError, TrialRef


@dataclass(frozen=True)
class BatchPlan:
    """One batch to write: exactly its bucket's B rows, None marking a padding row."""

    split: str
    epoch: int  # train composition index; 0 for val/test
    bucket: int  # index into the bucket table
    rows: tuple[TrialRef | None, ...]

    @property
    def trials(self) -> list[TrialRef]:
        return [r for r in self.rows if r is not None]


@dataclass(frozen=True)
class SplitStats:
    n_trials: int  # valid rows in all batches (summed over epochs for train)
    n_batches: int
    padding_rows: int  # rows that only fill a batch
    padding_fraction: float  # time bins padded in valid rows (b2t.buckets.padding_fraction)
    slot_padding_fraction: float  # share of all B x T bins that hold no data, padding rows included

    def to_dict(self) -> dict[str, float | int]:
        return {
            "n_trials": self.n_trials, "n_batches": self.n_batches, "padding_rows": self.padding_rows,
            "padding_fraction": self.padding_fraction, "slot_padding_fraction": self.slot_padding_fraction,
        }


@dataclass(frozen=True)
class Layout:
    buckets: list[BucketShape]
    plans: list[BatchPlan]  # train epoch by epoch, then val, then test
    exclusions: list[Exclusion]  # trials no bucket can serve, with the reason
    stats: dict[str, SplitStats]  # per split present in the input


def infeasibility(ref: TrialRef, patch_size: int, patch_stride: int) -> str | None:
    """Why the model cannot learn from `ref` under CTC, or None when it can."""
    n = ref.n_time_steps
    if n < patch_size:
        return f"{n} time bins are shorter than one patch of {patch_size} bins"
    have = patch_count(n, patch_size, patch_stride)
    need = ctc_min_patches(ref.labels)
    if have < need:
        return (f"{n} time bins give {have} patches (size {patch_size}, stride {patch_stride}), "
                f"but CTC needs {need} for its {len(ref.labels)} phonemes "
                f"({need - len(ref.labels)} repeated pairs need a blank between them)")
    return None


def split_feasible(refs: Iterable[TrialRef], model: ModelConfig) -> tuple[list[TrialRef], list[Exclusion]]:
    """Keep the trials CTC can align; the others become exclusions naming the reason."""
    kept, excluded = [], []
    for ref in refs:
        reason = infeasibility(ref, model.patch_size, model.patch_stride)
        if reason is None:
            kept.append(ref)
        else:
            excluded.append(Exclusion(file=ref.file, trial=ref.group, reason=reason))
    return kept, excluded


def too_long(refs: Iterable[TrialRef], data: DataConfig, model: ModelConfig, *,
             skip_bad: bool) -> tuple[list[TrialRef], list[Exclusion]]:
    """Keep the trials a batch can hold under `data.token_budget` (B x T, with B at least
    `data.row_multiple`); the others raise DataError naming the first, or with `skip_bad` become
    exclusions. Such a trial made the whole bucket table fail, naming no trial."""
    if data.token_budget is None:
        return list(refs), []
    longest = data.token_budget // data.row_multiple  # the longest T a batch of row_multiple rows fits
    kept, excluded = [], []
    for ref in refs:
        T = align_length(ref.n_time_steps, model.patch_size, model.patch_stride)
        if T <= longest:
            kept.append(ref)
            continue
        reason = (f"{ref.n_time_steps} bins need a bucket of T={T}, and data.token_budget={data.token_budget} holds "
                  f"{data.token_budget // T} rows of it, fewer than data.row_multiple={data.row_multiple}")
        if not skip_bad:
            raise DataError(ref.file, ref.group, f"{reason}: raise data.token_budget to at least "
                                                 f"{T * data.row_multiple}, or pass --skip-bad to leave it out")
        excluded.append(Exclusion(file=ref.file, trial=ref.group, reason=reason))
    return kept, excluded


def make_buckets(refs: Sequence[TrialRef], data: DataConfig, model: ModelConfig) -> list[BucketShape]:
    """The shared bucket table over `refs` (all splits; test trials carry no labels)."""
    try:
        return bucket_table(
            [r.n_time_steps for r in refs], [len(r.labels) for r in refs],
            n_buckets=data.n_buckets, patch_size=model.patch_size, patch_stride=model.patch_stride,
            batch_size=data.batch_size, token_budget=data.token_budget,
            row_multiple=data.row_multiple, label_multiple=data.label_multiple,
        )
    except ValueError as e:
        raise ConfigError(f"data: {e}") from None


def eval_order_key(ref: TrialRef) -> tuple:
    """Sessions in day order, then trials in file order (group names compared numerically)."""
    return ref.day_index, ref.session, ref.file, len(ref.group), ref.group


def _pad(split: str, epoch: int, bucket: int, trials: Sequence[TrialRef], rows: int) -> BatchPlan:
    return BatchPlan(split, epoch, bucket, tuple(trials) + (None,) * (rows - len(trials)))


def _by_bucket(refs: Iterable[TrialRef], lengths: Sequence[int]) -> dict[int, list[TrialRef]]:
    groups: dict[int, list[TrialRef]] = {}
    for ref in refs:
        groups.setdefault(bucket_index(ref.n_time_steps, lengths), []).append(ref)
    return groups


def eval_plans(split: str, refs: Sequence[TrialRef], buckets: Sequence[BucketShape]) -> list[BatchPlan]:
    """Every trial exactly once, deterministic: bucket by bucket, each in `eval_order_key` order."""
    groups = _by_bucket(sorted(refs, key=eval_order_key), [b.T for b in buckets])
    plans = []
    for b in sorted(groups):
        rows = buckets[b].B
        members = groups[b]
        plans += [_pad(split, 0, b, members[i:i + rows], rows) for i in range(0, len(members), rows)]
    return plans


def even_split(rows: int, available: Sequence[int]) -> list[int]:
    """How many of `rows` to take from each pool: as even as possible, never more than a pool holds.

    Water-filling from the smallest pool up, so a short pool's shortfall goes to the others;
    the takes sum to min(rows, sum(available)).
    """
    takes = [0] * len(available)
    left = rows
    order = sorted(range(len(available)), key=lambda i: available[i])
    for pos, i in enumerate(order):
        takes[i] = min(available[i], left // (len(order) - pos))
        left -= takes[i]
    return takes


def _choose_days(pools: dict[str, list[TrialRef]], rows: int, days: int, rng: np.random.Generator) -> list[str]:
    """`days` sessions for the next batch: a random draw, topped up so it can fill the batch.

    Sessions are drawn with odds inverse to the trials they have left, so small leftovers
    are dealt early, next to big pools, rather than meeting each other in a half-empty
    batch at the end. While the draw holds fewer than `rows` trials, its smallest pool
    (never the first draw) is swapped for the largest undrawn one.
    """
    names = list(pools)
    odds = np.array([1.0 / len(pools[s]) for s in names], dtype=np.float64)
    draw = rng.choice(len(names), size=min(days, len(names)), replace=False, p=odds / odds.sum())
    chosen = [names[i] for i in draw]
    spare = sorted(set(names) - set(chosen), key=lambda s: (len(pools[s]), s))
    while spare and len(chosen) > 1 and sum(len(pools[s]) for s in chosen) < rows:
        smallest = min(chosen[1:], key=lambda s: len(pools[s]))
        if len(pools[spare[-1]]) <= len(pools[smallest]):
            break
        chosen[chosen.index(smallest)] = spare.pop()
    return chosen


def day_mixed_batches(refs: Sequence[TrialRef], rows: int, days_per_batch: int,
                      rng: np.random.Generator) -> list[list[TrialRef]]:
    """Deal `refs` (one bucket) into batches of <= `rows` trials from <= `days_per_batch` sessions.

    Like the reference recipe (64 trials from 4 random days, as evenly as possible), but
    every trial is dealt exactly once per epoch: each batch picks its days at random
    (`_choose_days`) and takes an even share from each. A batch is short only when its
    first day and the biggest other pools hold fewer than `rows` trials between them (the
    tail of a bucket); the writer pads it with invalid rows.
    """
    pools: dict[str, list[TrialRef]] = {}
    for ref in refs:
        pools.setdefault(ref.session, []).append(ref)
    pools = {s: [pool[i] for i in rng.permutation(len(pool))] for s, pool in sorted(pools.items())}
    batches = []
    while pools:
        chosen = _choose_days(pools, rows, days_per_batch, rng)
        batch: list[TrialRef] = []
        for s, take in zip(chosen, even_split(rows, [len(pools[s]) for s in chosen])):
            batch += pools[s][:take]
            pools[s] = pools[s][take:]
            if not pools[s]:
                del pools[s]
        batches.append([batch[i] for i in rng.permutation(len(batch))])
    return batches


def train_plans(refs: Sequence[TrialRef], buckets: Sequence[BucketShape], data: DataConfig) -> list[BatchPlan]:
    """`data.epochs` compositions, each dealing every train trial once, seeded by (seed, epoch).

    Within an epoch the buckets' batches are interleaved in a random order, so the
    trainer sees shapes mixed as it would with one shuffled loader.
    """
    groups = _by_bucket(sorted(refs, key=eval_order_key), [b.T for b in buckets])
    plans = []
    for epoch in range(data.epochs):
        rng = np.random.default_rng([data.seed, epoch])
        epoch_plans = [
            _pad("train", epoch, b, batch, buckets[b].B)
            for b in sorted(groups)
            for batch in day_mixed_batches(groups[b], buckets[b].B, data.days_per_batch, rng)
        ]
        plans += [epoch_plans[i] for i in rng.permutation(len(epoch_plans))]
    return plans


def split_stats(plans: Sequence[BatchPlan], buckets: Sequence[BucketShape]) -> SplitStats:
    lengths = [r.n_time_steps for p in plans for r in p.trials]
    slots = sum(buckets[p.bucket].B * buckets[p.bucket].T for p in plans)
    return SplitStats(
        n_trials=len(lengths),
        n_batches=len(plans),
        padding_rows=sum(len(p.rows) - len(p.trials) for p in plans),
        padding_fraction=padding_fraction(lengths, [b.T for b in buckets]),
        slot_padding_fraction=1.0 - sum(lengths) / slots if slots else 0.0,
    )


def plan_layout(refs: Sequence[TrialRef], data: DataConfig, model: ModelConfig, *, skip_bad: bool = False) -> Layout:
    """Exclusions, the shared bucket table and every batch plan for `refs` (any splits).
    `skip_bad`: a trial longer than the token budget allows is excluded, not an error."""
    unknown = sorted({r.split for r in refs} - set(SPLITS))
    if unknown:
        raise UsageError(f"unknown splits {unknown}; expected some of {SPLITS}")
    fitting, overlong = too_long(refs, data, model, skip_bad=skip_bad)
    kept, exclusions = split_feasible(fitting, model)
    exclusions = overlong + exclusions
    if not kept:
        first = f" (first: {exclusions[0].file}: {exclusions[0].trial}: {exclusions[0].reason})" if exclusions else ""
        raise DataError("the input", None, f"no trial is left to batch: {len(exclusions)} excluded{first}")
    buckets = make_buckets(kept, data, model)
    plans, stats = [], {}
    for split in SPLITS:
        members = [r for r in kept if r.split == split]
        if not members and not any(r.split == split for r in refs):
            continue
        split_plans = (train_plans(members, buckets, data) if split == "train"
                       else eval_plans(split, members, buckets))
        plans += split_plans
        stats[split] = split_stats(split_plans, buckets)
    return Layout(buckets=buckets, plans=plans, exclusions=exclusions, stats=stats)
