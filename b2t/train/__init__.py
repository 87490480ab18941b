"""Training: augmentations, optimizer and schedules, the compiled step, the loop and checkpoints.

Modules: `augment` (fixed-shape on-device augmentations), `optim` (AdamW groups and
learning-rate schedules), `backend` (how a step is compiled: openxla, inductor, eager),
`step` (the one step function), `checkpoint` (atomic, pickle-free checkpoints) and
`loop` (the `b2t-train` run).
"""
