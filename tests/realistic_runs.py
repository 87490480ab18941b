"""The realistic synthetic datasets and the tiny runs trained on them, shared by the slow
learning tests (`tests/train/test_loop.py`) and the benchmarks that compare the families
(`tools/compare_families.py`, `tools/bench_words.py`): both train exactly these runs."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from b2t.config import CONFIG_DIR, TINY_CONFIG, load_config

NOISE_TINY = CONFIG_DIR / "noise_tiny.yaml"
VARIANTS: dict[str, tuple[Path, list[str]]] = {
    "gru": (TINY_CONFIG, []),
    "noise_separating": (NOISE_TINY, []),
    "no_reversal": (NOISE_TINY, ["model.noise_separating.reversal_scale=0"]),
    "noisy_weight_0": (NOISE_TINY, ["model.noise_separating.noisy_loss_weight=0"]),
    "estimate_at_0": (NOISE_TINY, ["model.noise_separating.zero_noise_estimate=true"]),
}
"""Name -> (config, --set overrides). no_reversal: the noisy head still learns, its gradient
stops at the estimate; noisy_weight_0: no noisy loss at all; estimate_at_0: no NoiseModel."""
CONDITIONS = {"structured": 4, "no_structured": 0}
"""Dataset name -> --structured-noise-rank."""


def make_dataset(work: Path, name: str, rank: int, **overrides: Any) -> tuple[Path, Path]:
    """The realistic preset (seed 0, 5 sessions, ground truth kept; `overrides`: other SynthSpec
    fields, e.g. val_trials) and its shards under `work/name`; reused when present."""
    from preprocess.synth import SynthSpec, preset_spec, read_spec, write_dataset
    from preprocess.writer import prepare_dataset

    spec: SynthSpec = replace(preset_spec("realistic"), structured_noise_rank=rank, ground_truth=True, **overrides)
    hdf5, shards = work / name / "hdf5", work / name / "shards"
    if read_spec(hdf5) != spec:
        shutil.rmtree(work / name, ignore_errors=True)
        write_dataset(spec, hdf5)
    prepare_dataset(hdf5, shards, load_config(TINY_CONFIG), workers=1, progress=False)
    return hdf5, shards


def run_settings(variant: str, seed: int, steps: int, val_every: int, compute_dtype: str,
                 backend: str = "eager") -> tuple[Path, list[str]]:
    """A variant's config and --set overrides for a run of `steps` (the cosine decays to its
    last step, one checkpoint at the end)."""
    config, sets = VARIANTS[variant]
    return config, [*sets, f"train.backend={backend}", f"train.steps={steps}", f"optim.decay_steps={steps}",
                    f"train.val_every={val_every}", "train.log_every=10", f"train.checkpoint_every={steps}",
                    f"train.seed={seed}", f"train.compute_dtype={compute_dtype}"]
