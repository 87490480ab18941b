"""Planning a run before renting hardware (`b2t-plan`): the shape model's memory estimate
(`memory`) and the TPU compiler's own verdict (`targets`, the slices; `capture`, the trainer's
graphs traced on the CPU; `compiler`, libtpu compile-only; `side_by_side`, compiles at once;
`check`, the report)."""
