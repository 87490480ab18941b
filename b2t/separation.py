"""Does a noise-separating model separate? Its noise estimate against synthetic data's ground truth.

`b2t-synth --ground-truth` keeps each trial's speech and non-speech parts
(`ground_truth.hdf5`, docs/data-format.md). The model subtracts its estimate E from the
clean path's input, the patches of the clean day layer's output after evaluation
augmentation (smoothing): Q(x) = patches(clean.day(smooth(x))). A part p of the features
is mapped into that space as the change it makes there, Q(x) - Q(x - p): were E the
non-speech part's change N, the clean path would read exactly the features without it.
With S the speech part's change, per session and pooled over its valid patches:

- `r2` = 1 - sum |E - N|^2 / sum |N|^2: the share of the non-speech part the estimate
  explains (1: E = N; 0: E = 0; below 0: it adds more than it removes);
- `leakage` = sum <E, S> / sum |S|^2: the share of the speech part the subtraction takes
  with it, along the speech part itself (0: E orthogonal to speech; 1: E = S);
- `energy` = sum |E|^2 / sum |N|^2 and `cosine` = sum <E, N> / sqrt(sum |E|^2 sum |N|^2):
  how large the estimate is, and how far it points along the non-speech part (R^2 =
  2 cosine sqrt(energy) - energy, so a negative R^2 tells one of them apart from the other);
- `truth_leakage`: the same for E = N, the reference: the softsign makes the two parts'
  changes interact (where they push a channel the same way it saturates), so even the
  exact non-speech change is not orthogonal to the speech change;
- `clean_per`, `noisy_per`: greedy PER of the clean head and of the noisy head, which reads
  phonemes from E (near chance: no speech left in it to read).

Computed trial by trial in f32 on the CPU (training computes in bf16), features rounded to
bf16 first as the shards store them. Shape legend: T bins, F features, P patches, D = patch width.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
import torch

from b2t.config import AugmentConfig
from b2t.contract import FEATURE_DTYPE
from b2t.engine.augment import augment
from b2t.engine.checkpoint import load_checkpoint, trained_config
from b2t.errors import DatasetError, MissingInput, UsageError
from b2t.metrics import edit_distance, greedy_decode
from b2t.model.layers import patches
from b2t.model.noise_separating import NoiseSeparatingDecoder
from b2t.model.noise_separating.decoder import CLEAN_HEAD, NOISY_HEAD
from b2t.model.registry import build_model
from b2t.paths import file_kind

GROUND_TRUTH_NAME = "ground_truth.hdf5"  # as preprocess.synth writes it (b2t does not import preprocess)


@dataclass(frozen=True)
class Separation:
    r2: float
    energy: float
    cosine: float
    leakage: float
    truth_leakage: float
    clean_per: float
    noisy_per: float
    trials: int


@dataclass
class Tally:
    """Sums over patches (and trials) behind `Separation`."""

    err: float = 0.0  # sum |E - N|^2
    nonspeech: float = 0.0  # sum |N|^2
    estimate: float = 0.0  # sum |E|^2
    along_nonspeech: float = 0.0  # sum <E, N>
    along_speech: float = 0.0  # sum <E, S>
    truth_along_speech: float = 0.0  # sum <N, S>
    speech: float = 0.0  # sum |S|^2
    edits: dict[str, int] = field(default_factory=lambda: {CLEAN_HEAD: 0, NOISY_HEAD: 0})
    phonemes: int = 0
    trials: int = 0

    def add_parts(self, estimate: torch.Tensor, nonspeech: torch.Tensor, speech: torch.Tensor) -> None:
        """One trial's E, N, S: same shape, f32."""
        self.err += float(((estimate - nonspeech) ** 2).sum())
        self.nonspeech += float((nonspeech**2).sum())
        self.estimate += float((estimate**2).sum())
        self.along_nonspeech += float((estimate * nonspeech).sum())
        self.along_speech += float((estimate * speech).sum())
        self.truth_along_speech += float((nonspeech * speech).sum())
        self.speech += float((speech**2).sum())

    def add_decodes(self, logits: dict[str, torch.Tensor], reference: list[int]) -> None:
        """One trial's (P, C) logits per head against its reference phonemes."""
        for head, x in logits.items():
            (ids,) = greedy_decode(x.argmax(-1)[None], [len(x)])
            self.edits[head] += edit_distance(ids, reference)
        self.phonemes += len(reference)
        self.trials += 1

    def __iadd__(self, other: Tally) -> Tally:
        for name in ("err", "nonspeech", "estimate", "along_nonspeech", "along_speech", "truth_along_speech", "speech",
                     "phonemes", "trials"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.edits = {h: self.edits[h] + other.edits[h] for h in self.edits}
        return self

    def result(self) -> Separation:
        nan = float("nan")
        return Separation(
            r2=1.0 - self.err / self.nonspeech if self.nonspeech else nan,
            energy=self.estimate / self.nonspeech if self.nonspeech else nan,
            cosine=self.along_nonspeech / math.sqrt(self.estimate * self.nonspeech) if self.estimate * self.nonspeech else nan,
            leakage=self.along_speech / self.speech if self.speech else nan,
            truth_leakage=self.truth_along_speech / self.speech if self.speech else nan,
            clean_per=self.edits[CLEAN_HEAD] / self.phonemes if self.phonemes else nan,
            noisy_per=self.edits[NOISY_HEAD] / self.phonemes if self.phonemes else nan,
            trials=self.trials,
        )


@dataclass(frozen=True)
class Checkpointed:
    """A noise-separating checkpoint's model (CPU, f32, eval mode), session list and augmentation."""

    model: NoiseSeparatingDecoder
    sessions: list[str]
    augment: AugmentConfig


def load_model(checkpoint: Path) -> Checkpointed:
    state, cfg = trained_config(checkpoint)
    if cfg.model.family != "noise_separating":
        raise UsageError(f"{checkpoint} is a {cfg.model.family!r} model: only a noise_separating one has an estimate")
    model = build_model(cfg.model, len(state.sessions))
    load_checkpoint(checkpoint, model)
    return Checkpointed(model.eval(), list(state.sessions), cfg.augment)


def clean_space(model: NoiseSeparatingDecoder, x: torch.Tensor, day: torch.Tensor) -> torch.Tensor:
    """Q: (1, P, D) clean-path patches of augmented features (1, T, F), day index (1,)."""
    return patches(model.clean.day(x, day), model.cfg.patch_size, model.cfg.patch_stride)


def noise_estimate(model: NoiseSeparatingDecoder, x: torch.Tensor, day: torch.Tensor) -> torch.Tensor:
    """E: (1, P, D), the NoiseModel's estimate for augmented features (1, T, F), as the forward forms it."""
    noise = model.noise.estimate(patches(model.noise.day(x, day), model.cfg.patch_size, model.cfg.patch_stride))
    return torch.zeros_like(noise) if model.cfg.noise_separating.zero_noise_estimate else noise


Estimator = Callable[[NoiseSeparatingDecoder, torch.Tensor, torch.Tensor], torch.Tensor]


@torch.no_grad()
def trial_tally(ckpt: Checkpointed, day: int, features: np.ndarray, parts: dict[str, np.ndarray],
                reference: list[int], estimate: Estimator = noise_estimate) -> Tally:
    """One trial: features (T, F) as written, its ground-truth parts, its reference phonemes.

    `estimate`: how E is formed (the model's NoiseModel; tests pass known answers).
    """
    model, d = ckpt.model, torch.tensor([day], dtype=torch.int32)

    def smoothed(x: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(x, np.float32))[None]
        return augment(t, torch.tensor([t.shape[1]]), ckpt.augment, train=False)[0]  # (1, T, F)

    x = torch.from_numpy(features).to(FEATURE_DTYPE).to(torch.float32).numpy()  # as the shards store it
    q = clean_space(model, smoothed(x), d)
    e = estimate(model, smoothed(x), d)
    tally = Tally()
    tally.add_parts(e, q - clean_space(model, smoothed(x - parts["nonspeech"]), d),
                    q - clean_space(model, smoothed(x - parts["speech"]), d))
    clean_h = model.clean.hidden(q, e)
    logits = {CLEAN_HEAD: model.clean.out(clean_h)[0], NOISY_HEAD: model.noisy.out(model.noisy.hidden(e, None))[0]}
    tally.add_decodes(logits, reference)
    return tally


def _hdf5(path: Path) -> h5py.File:
    """`path` open for reading; DatasetError naming it where it is no HDF5 file (a folder, cut short)."""
    if not path.is_file():
        raise DatasetError(f"{path} is {file_kind(path)}, not an HDF5 file: pass a b2t-synth --ground-truth folder")
    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise DatasetError(f"{path}: cannot be read as HDF5 ({e}): write it again with b2t-synth --ground-truth") from None


def _trial(g: h5py.Group | h5py.Dataset, path: Path, name: str) -> tuple[np.ndarray, list[int]]:
    """A b2t-synth trial's features (T, F) and its reference phonemes; DatasetError naming the
    file and trial where it is not one (a KeyError's traceback, or a seq_len beyond its labels
    that counted padding as reference)."""
    def bad(problem: str) -> DatasetError:
        return DatasetError(f"{path}: {name} {problem}: write the dataset again with b2t-synth --ground-truth")

    if not isinstance(g, h5py.Group):
        raise bad("is not a trial group")
    x, ids, n = g.get("input_features"), g.get("seq_class_ids"), g.attrs.get("seq_len")
    if not (isinstance(x, h5py.Dataset) and x.ndim == 2 and isinstance(ids, h5py.Dataset) and ids.ndim == 1):
        raise bad("lacks input_features (T, F) or seq_class_ids (L,)")
    if not (isinstance(n, (int, np.integer)) and 0 <= n <= ids.shape[0]):
        raise bad(f"has seq_len {n.item() if isinstance(n, np.generic) else n!r}, not a count of its "
                  f"{ids.shape[0]} label slots")
    return x[()], ids[: int(n)].tolist()


def _parts(truth: h5py.File, key: str, shape: tuple[int, ...], truth_path: Path) -> dict[str, np.ndarray]:
    """The trial `key`'s ground-truth parts (speech, nonspeech), each of the features' `shape`."""
    if key not in truth:
        raise DatasetError(f"{truth_path} has no {key}: it is not the ground truth of this dataset; "
                           "write both with one b2t-synth --ground-truth")
    parts = {}
    for part in ("speech", "nonspeech"):
        value = truth[key].get(part)
        if not isinstance(value, h5py.Dataset) or value.shape != shape:
            found = ("nothing" if value is None else
                     f"shape {list(value.shape)}" if isinstance(value, h5py.Dataset) else "a group")
            raise DatasetError(f"{truth_path}: {key}/{part} is {found}, expected the features' shape {list(shape)}: "
                               "it is not the ground truth of this dataset")
        parts[part] = value[()]
    return parts


def separation_report(ckpt: Checkpointed, data: Path, split: str = "val",
                      estimate: Estimator = noise_estimate) -> dict[str, Separation]:
    """Per session of the checkpoint found in `data` (a b2t-synth folder written with
    --ground-truth), and "all" pooled: the `Separation` of `split`'s trials."""
    if split not in ("train", "val"):
        raise UsageError(f"split {split!r} has no reference phonemes: choose train or val")
    truth_path = data / GROUND_TRUTH_NAME
    if not truth_path.exists():
        raise MissingInput(f"{truth_path} does not exist: write the dataset with b2t-synth --ground-truth")
    total, out = Tally(), {}
    with _hdf5(truth_path) as truth:
        for day, session in enumerate(ckpt.sessions):
            path = data / session / f"data_{split}.hdf5"
            if not path.is_file():
                continue  # a session without this split has nothing to measure
            if session not in truth:
                raise DatasetError(f"{truth_path} has no session {session}, which {path} holds: it is not the "
                                   "ground truth of this dataset; write both with one b2t-synth --ground-truth")
            tally = Tally()
            with _hdf5(path) as f:
                for name, g in f.items():
                    features, reference = _trial(g, path, name)
                    tally += trial_tally(ckpt, day, features, _parts(truth, f"{session}/{split}/{name}",
                                                                     features.shape, truth_path), reference, estimate)
            out[session] = tally.result()
            total += tally
    if not out:
        raise UsageError(f"no session of the checkpoint ({', '.join(ckpt.sessions[:3])}, ...) has {split} "
                         f"trials with ground truth in {data}")
    return {**out, "all": total.result()}
