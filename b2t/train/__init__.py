"""Training: a run of the engine (`b2t.engine`) over a dataset, into a run directory.

Modules: `loop` (the `b2t-train` run), `resume` (when a run may start or continue in its
directory), `warmup` (every graph compiled before the first step) and `warmup_progress` (its
numbered lines and records), `init_from` (fine-tuning from another run's weights),
`metrics_log` (metrics.jsonl and TensorBoard), `rates` (where a run's time goes), `summary`
(the end's lines), `interruptions` (a stop by a signal, out of memory).
"""
