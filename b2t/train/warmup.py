"""The warm-up: every graph a run will need compiled before its first real batch, in numbered
pieces (`warmup_progress` shows and records them)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from b2t.contract import Batch, BucketShape, empty_batch
from b2t.engine.device_state import preserved_state
from b2t.engine.step import Stepper
from b2t.train.warmup_progress import Piece


def warm_up_pieces(buckets: Sequence[BucketShape], *, train: bool) -> list[Piece]:
    """The warm-up's pieces in the order `warm_up` runs them (numbered for the progress lines)."""
    kinds = [(kind, b) for b in buckets for kind in (("train step", "eval step") if train else ("eval step",))]
    kinds += [("eval step again", b) for b in buckets]
    return [Piece(kind, b.T, b.B, i, len(kinds)) for i, (kind, b) in enumerate(kinds, start=1)]


def warm_up(stepper: Stepper, buckets: Sequence[BucketShape], report: Callable[[Piece | None], None], *,
            log_probs: bool = False) -> None:
    """Compile every graph a run will need, on one all-padding batch per bucket: the one
    warm-up recipe of training and evaluation alike.

    The batches are made on the host and placed by the step, as the loader's batches are
    (a batch made on the device is a different graph input, and under SPMD it takes
    another placement path). With an optimizer, per bucket two optimizer steps and an
    eval inside `device_state.preserved_state`, which puts weights and optimizer state back
    before each later bucket and at the end; then one eval per bucket again. Each
    bucket starts from the run's initial state, as a run's first step may fall in any
    bucket (AdamW's step counts are (1,) tensors, `optim.step_count`, so fresh and
    stepped state trace the same step graph). Measured on
    XLA: the eval graph traced right after training steps and the one traced after the
    restore differ (the order of the lazy graph's outputs), and validation meets both;
    and under openxla a shape's second eval call still compiles one more graph.
    `report(piece)` is called as each piece starts, `report(None)` after the last
    (`warmup_progress.WarmUpReport`). `log_probs`: warm the word-decoding eval step instead
    of the greedy one.
    """
    evaluate = stepper.log_probs_step if log_probs else stepper.eval_step
    batches = [Batch(i, empty_batch(shape), {}) for i, shape in enumerate(buckets)]
    pieces = iter(warm_up_pieces(buckets, train=stepper.optimizer is not None))
    with preserved_state(stepper.model, stepper.optimizer, stepper.backend) as restore:
        for i, batch in enumerate(batches):
            if i:
                restore()  # every bucket from the run's initial state
            if stepper.optimizer is not None:
                report(next(pieces))
                for step in (1, 2):  # seeds of later steps: a seed of 0 is traced as a constant
                    stepper.train_step([batch] * stepper.cfg.train.grad_accum, step)
            report(next(pieces))
            evaluate(batch)
    for batch in batches:
        report(next(pieces))
        evaluate(batch)
    report(None)
    if stepper.optimizer is not None:
        stepper.take_losses()  # warm-up losses are not the run's
