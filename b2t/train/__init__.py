"""Training: from a device batch to checkpoints and metrics.

Modules: `process` (the process-wide settings, made once at start-up), `backend` (how a
step is compiled: openxla, xla, inductor, eager; uploads and device placement), `devices`
and `mesh` (which XLA device, SPMD meshes and fsdp sharding), `parallel` (torchrun DDP),
`augment` (fixed-shape on-device augmentations), `rng` (the step's random draws), `optim`
(AdamW groups and learning-rate schedules), `device_state` (gradients and AdamW state made
up front, the warm-up's snapshot), `step` (the one step function), `warmup` (every graph
compiled before the first step) and `warmup_progress` (its numbered lines and records), `rates`
(where a run's time goes), `summary` (the end's lines), `checkpoint` (atomic, pickle-free checkpoints),
`init_from` (fine-tuning from another run's weights), `metrics_log` (metrics.jsonl and
TensorBoard), `plan` (the memory planner of `b2t-plan`) and `loop` (the `b2t-train` run).
"""
