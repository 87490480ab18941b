"""The warm-up: every graph a run will need compiled before its first real batch, in numbered
pieces (`warmup_progress` shows and records them)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from b2t.contract import Batch, BucketShape, empty_batch
from b2t.engine.concurrent_compiles import CompileAhead, CompiledPiece, HostMemory
from b2t.engine.device_state import preserved_state
from b2t.engine.step import Stepper
from b2t.train.warmup_progress import Piece, WarmUpReport

EVERY_BUCKET = "steps of every bucket"
"""The last piece after graphs compiled side by side: each bucket's steps run, as without them."""


def warm_up_pieces(buckets: Sequence[BucketShape], *, train: bool, ahead: bool = False) -> list[Piece]:
    """The warm-up's pieces in the order `warm_up` runs them (numbered for the progress lines):
    per bucket its train and eval step; then its eval step again, or, `ahead` (the graphs
    compiled side by side), one piece that runs the steps of every bucket."""
    kinds = [(kind, b.T, b.B) for b in buckets for kind in (("train step", "eval step") if train else ("eval step",))]
    kinds += [(EVERY_BUCKET, 0, 0)] if ahead else [("eval step again", b.T, b.B) for b in buckets]
    return [Piece(kind, T, B, i, len(kinds)) for i, (kind, T, B) in enumerate(kinds, start=1)]


def warm_up(stepper: Stepper, buckets: Sequence[BucketShape], report: WarmUpReport | None = None, *,
            log_probs: bool = False, jobs: int = 0) -> HostMemory | None:
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

    `jobs` > 0 on a backend whose graphs compile on their own (openxla: `compiles_ahead`):
    first every bucket's dynamo graphs are traced, and compiled side by side, up to `jobs` at
    once, while the next are traced (`_compile_ahead`); the steps then find them compiled and
    compile only what stays lazy (the update; on a mesh the backward too). `report`'s pieces
    (`warm_up_pieces`) then overlap; otherwise each starts as the one before ends. Returns the
    host memory the side-by-side compiles took (None without them). `log_probs`: warm the
    word-decoding eval step instead of the greedy one.
    """
    report = report if report is not None else WarmUpReport.quiet(stepper.backend)
    evaluate = stepper.log_probs_step if log_probs else stepper.eval_step
    train = stepper.optimizer is not None
    batches = [Batch(i, empty_batch(shape), {}) for i, shape in enumerate(buckets)]
    ahead = jobs > 0 and stepper.backend.compiles_ahead
    pieces = warm_up_pieces(buckets, train=train, ahead=ahead)
    memory = None
    if ahead:
        memory = _compile_ahead(stepper, batches, pieces[:-1], report, jobs, log_probs)
        report(pieces[-1])  # one piece for every step below
    rest = iter(pieces)

    def next_piece() -> None:
        if not ahead:
            report(next(rest))

    with preserved_state(stepper.model, stepper.optimizer, stepper.backend) as restore:
        for i, batch in enumerate(batches):
            if i:
                restore()  # every bucket from the run's initial state
            if train:
                next_piece()
                for step in (1, 2):  # seeds of later steps: a seed of 0 is traced as a constant
                    stepper.train_step([batch] * stepper.cfg.train.grad_accum, step)
            next_piece()
            evaluate(batch)
    for batch in batches:
        next_piece()
        evaluate(batch)
    report(None)
    if train:
        stepper.take_losses()  # warm-up losses are not the run's
    return memory


def _compile_ahead(stepper: Stepper, batches: list[Batch], pieces: list[Piece], report: WarmUpReport,
                   jobs: int, log_probs: bool) -> HostMemory:
    """Trace each bucket's train and eval graphs (`Stepper.trace_graphs`), running none, while
    up to `jobs` of them compile; each piece is reported as its compiles end. The first compile
    that failed is raised, its piece named to `report.on_piece` first (an out-of-memory message
    names where it happened)."""
    backend = stepper.backend
    kinds = (True, False) if stepper.optimizer is not None else (False,)
    work = [(batch, train) for batch in batches for train in kinds]

    def reported(done: Iterable[CompiledPiece]) -> None:
        for c in done:
            if c.error is not None:
                report.on_piece(c.piece)
                raise c.error
            report.finished(c.piece, c.graphs, c.end)

    with CompileAhead(jobs, backend.device, real_outputs=backend.dynamo_backward) as ahead:
        for piece, (batch, train) in zip(pieces, work):
            report.started(piece)
            with ahead.tracing(piece):
                stepper.trace_graphs(batch, train=train, log_probs=log_probs)
            reported(ahead.pieces_done())
        reported(ahead.wait())
    memory = ahead.memory()
    report.side_by_side = (f"graphs compiled up to {memory.most_at_once} at once, --compile-jobs {jobs}; host memory "
                           f"rose {memory.per_compile / 2**30:.1f} GiB per compile running at once")
    return memory
