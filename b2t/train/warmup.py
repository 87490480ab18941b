"""The warm-up: every graph a run will need compiled before its first real batch, and the
report of what compiled."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from tqdm import tqdm

from b2t.contract import Batch, BucketShape, empty_batch
from b2t.train.backend import Backend
from b2t.train.device_state import preserved_state
from b2t.train.step import Stepper


def warm_up(stepper: Stepper, buckets: Sequence[BucketShape], report: Callable[[str], None], *,
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
    `log_probs`: warm the word-decoding eval step instead of the greedy one.
    """
    evaluate = stepper.log_probs_step if log_probs else stepper.eval_step
    batches = [Batch(i, empty_batch(shape), {}) for i, shape in enumerate(buckets)]
    with preserved_state(stepper.model, stepper.optimizer, stepper.backend) as restore:
        for i, batch in enumerate(batches):
            if i:
                restore()  # every bucket from the run's initial state
            if stepper.optimizer is not None:
                report(f"train step, {_shape_of(batch)}")
                for step in (1, 2):  # seeds of later steps: a seed of 0 is traced as a constant
                    stepper.train_step([batch] * stepper.cfg.train.grad_accum, step)
            report(f"eval step, {_shape_of(batch)}")
            evaluate(batch)
    for batch in batches:
        report(f"eval step again, {_shape_of(batch)}")
        evaluate(batch)
    if stepper.optimizer is not None:
        stepper.take_losses()  # warm-up losses are not the run's


class WarmUpReport:
    """`warm_up`'s `report`: one line per piece that compiled, e.g. `compiled eval step,
    bucket T=126 B=16: 2 graphs, 3.1 s`, and none for a piece whose graphs were cached (XLA
    counts them; inductor's are not counted, so each of its pieces gets a line; eager compiles
    nothing). On a terminal the bar also says what compiles now; piped output gets only the
    lines, no carriage-return frames."""

    def __init__(self, bar: tqdm, backend: Backend) -> None:
        self.bar, self.backend = bar, backend
        stream = getattr(bar, "fp", None)
        self.live = not getattr(bar, "disable", True) and bool(getattr(stream, "isatty", lambda: False)())
        self.what, self.started, self.before = "", time.perf_counter(), self._compiled()

    def _compiled(self) -> int | None:
        return self.backend.stats().compilations if self.backend.xla else None

    def __call__(self, what: str) -> None:
        compiled = self._compiled()
        if self.what and self.backend.name != "eager":
            seconds = time.perf_counter() - self.started
            if compiled is None:
                self.bar.write(f"compiled {self.what}: {seconds:.1f} s")
            elif compiled > self.before:
                n = compiled - self.before
                self.bar.write(f"compiled {self.what}: {n} graph{'s' * (n > 1)}, {seconds:.1f} s")
        hint = "" if self.what else " (the first compile can take minutes)"
        self.what, self.started, self.before = what, time.perf_counter(), compiled
        if what and self.live:
            self.bar.set_description_str(f"compiling {what}{hint}")


def _shape_of(batch: Batch) -> str:
    B, T, _ = batch.tensors["features"].shape
    return f"bucket T={T} B={B}"
