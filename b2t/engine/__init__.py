"""The engine: what steps a model on a device, shared by training, evaluation, the TPU check and the tools.

Modules: `process` (process-wide settings, made once), `backend` (how a step is compiled:
openxla, xla, inductor, eager; uploads, placement, donation), `devices` and `mesh` (which XLA
device; SPMD meshes and fsdp sharding), `parallel` (torchrun DDP), `augment` (fixed-shape
on-device augmentations), `rng` (the step's random draws), `optim` (AdamW groups and the
learning-rate schedule), `device_state` (AdamW state made up front, the warm-up's snapshot),
`step` (the one step function, and `make_stepper`, the one way to get one), `checkpoint` and
`checkpoint_checks` (atomic, pickle-free checkpoints and their checked reader).
"""
