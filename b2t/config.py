"""The one config schema: frozen, keyword-only sections, validated up front.

A YAML file in `configs/` fills these sections; unknown keys are errors that suggest the
nearest known key, and `--set section.key=value` overrides are parsed as YAML scalars.
The same file drives `b2t-preprocess` (sections `data` and `model`, since the bucket
lengths must fit the model's patching) and `b2t-train`.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from b2t.errors import B2tError

BACKENDS = ("openxla", "xla", "inductor", "eager")
"""How the step is compiled: the names of `b2t.engine.backend`'s classes (torch.compile on XLA,
lazy whole-step XLA tracing, torch.compile with inductor on CUDA or CPU, plain PyTorch), which
own everything else about them."""
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
"""The repository's configs/: baseline.yaml (the reference recipe) and tiny.yaml (tests, tools, the demo)."""
BASELINE_CONFIG = CONFIG_DIR / "baseline.yaml"
TINY_CONFIG = CONFIG_DIR / "tiny.yaml"

COMPUTE_DTYPES = ("auto", "bf16", "f32")
"""`train.compute_dtype`: the forward's matmuls under bf16 autocast, or in f32; auto: bf16
except on a CPU without bf16 matmuls (`b2t.engine.backend.Backend.compute_dtype`)."""


class ConfigError(B2tError, ValueError):
    """A config value or key that cannot be used; the message says how to fix it."""


def _require(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    n_buckets: int = 4  # distinct time lengths T (one XLA compilation each)
    batch_size: int = 64  # rows per batch (the most, when token_budget caps long buckets)
    token_budget: int | None = None  # cap on B x T per batch; None = batch_size everywhere
    row_multiple: int = 1  # B is a multiple of this (devices a batch is split over)
    label_multiple: int = 8  # label width L is rounded up to this
    days_per_batch: int = 4  # a train batch mixes at most this many sessions
    epochs: int = 4  # train compositions written (each a differently shuffled batch membership; disk grows with it)
    batches_per_shard: int = 16  # batches in one shard file
    seed: int = 0  # seeds batch composition and shuffling

    def __post_init__(self) -> None:
        for name in ("n_buckets", "batch_size", "row_multiple", "label_multiple",
                     "days_per_batch", "epochs", "batches_per_shard"):
            _require(getattr(self, name) >= 1, f"data.{name} must be >= 1, got {getattr(self, name)}")
        _require(self.batch_size % self.row_multiple == 0,
                 f"data.batch_size={self.batch_size} must be a multiple of data.row_multiple={self.row_multiple}")
        _require(self.token_budget is None or self.token_budget >= 1, "data.token_budget must be >= 1 or null")
        _require(self.seed >= 0, f"data.seed must be >= 0, got {self.seed}")


MAX_UNITS, MAX_LAYERS, MAX_PATCH = 2**16, 64, 1024
"""Bounds far above any real model (the 687M's widest GRU has 4608 units, its patches 14 bins):
a larger value is a typo, which otherwise reached the allocator (exit 70) or the compiler."""


@dataclass(frozen=True, kw_only=True)
class GRUConfig:
    """A GRU stack's sizes: `model.gru` (the reference decoder, family `gru`) and each part of
    `model.noise_separating`."""

    n_units: int = 768  # GRU hidden size
    n_layers: int = 5  # GRU layers
    rnn_dropout: float = 0.4  # between GRU layers

    def __post_init__(self) -> None:
        _require(1 <= self.n_units <= MAX_UNITS and 1 <= self.n_layers <= MAX_LAYERS,
                 f"n_units and n_layers must be in 1..{MAX_UNITS} and 1..{MAX_LAYERS}, got {self.n_units} and "
                 f"{self.n_layers}")
        _require(0.0 <= self.rnn_dropout < 1.0, "rnn_dropout must be in [0, 1)")


@dataclass(frozen=True, kw_only=True)
class NoiseSeparatingConfig:
    """`model.noise_separating`: three GRU stacks (family `noise_separating`, b2t.model.noise_separating).

    The objective is CTC(clean) + w * CTC(noisy); w and the gradient-reversal scale r each
    ramp linearly from 0 to their value over their warm-up steps (the noisy reader is
    useless before the noise estimate means anything, and a full reversal from step 0
    pushes the noise model around before the clean path has learned).
    """

    noise: GRUConfig = field(default_factory=GRUConfig)  # NoiseModel: estimates each patch's non-speech part
    clean: GRUConfig = field(default_factory=GRUConfig)  # CleanSpeechModel: phonemes from patches - noise estimate
    noisy: GRUConfig = field(default_factory=GRUConfig)  # NoisySpeechModel: phonemes from the noise estimate
    noisy_loss_weight: float = 0.5  # w, after its warm-up
    noisy_loss_warmup_steps: int = 1000  # steps for w to ramp from 0
    reversal_scale: float = 1.0  # r: the noisy loss's gradient reaches the noise model times -r
    reversal_warmup_steps: int = 1000  # steps for r to ramp from 0
    zero_noise_estimate: bool = False  # ablation: the estimate is held at 0 (the NoiseModel gets no gradient)

    def __post_init__(self) -> None:
        _require(self.noisy_loss_weight >= 0 and self.reversal_scale >= 0,
                 "noisy_loss_weight and reversal_scale must be >= 0")
        _require(self.noisy_loss_warmup_steps >= 0 and self.reversal_warmup_steps >= 0,
                 "noisy_loss_warmup_steps and reversal_warmup_steps must be >= 0")


MODEL_FAMILIES = ("gru", "noise_separating")
"""Model families (`b2t.model.registry` builds each); `model.<family>` holds its sizes."""


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    family: str = "gru"  # which model (b2t.model.registry); its sizes are in model.<family>
    patch_size: int = 14  # time bins per patch (every family patches; the buckets are aligned to it)
    patch_stride: int = 4  # bins between patch starts
    input_dropout: float = 0.2  # after the day layer
    gru: GRUConfig = field(default_factory=GRUConfig)
    noise_separating: NoiseSeparatingConfig = field(default_factory=NoiseSeparatingConfig)

    def __post_init__(self) -> None:
        _require(self.family in MODEL_FAMILIES,
                 f"model.family={self.family!r}: choose one of {', '.join(MODEL_FAMILIES)}")
        _require(1 <= self.patch_stride <= self.patch_size <= MAX_PATCH,
                 f"model.patch_stride={self.patch_stride} must be in 1..patch_size={self.patch_size}, and patch_size "
                 f"at most {MAX_PATCH} bins")
        _require(0.0 <= self.input_dropout < 1.0, "model.input_dropout must be in [0, 1)")


MAX_SMOOTH_STD = 39.8
"""Above this (39.897) every tap of the normalised smoothing kernel is at or below 0.01, the
reference's threshold (`b2t.engine.augment.gaussian_kernel`), and the kernel is empty."""


@dataclass(frozen=True, kw_only=True)
class AugmentConfig:
    white_noise_std: float = 1.0  # per bin and channel, training only
    constant_offset_std: float = 0.2  # per trial and channel, training only
    max_start_cut: int = 2  # drop 0..max bins from the start (a shift within T), training only
    smooth_std: float = 2.0  # Gaussian smoothing along time (bins), train and eval; 0 = off

    def __post_init__(self) -> None:
        _require(min(self.white_noise_std, self.constant_offset_std, self.smooth_std) >= 0,
                 "augment stds must be >= 0")
        _require(self.max_start_cut >= 0, "augment.max_start_cut must be >= 0")
        _require(self.smooth_std <= MAX_SMOOTH_STD,
                 f"augment.smooth_std={self.smooth_std} must be at most {MAX_SMOOTH_STD} bins: a wider Gaussian "
                 "has no kernel tap above 0.01, the reference's threshold (0 turns smoothing off)")


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    lr: float = 0.005  # peak learning rate of the main group
    lr_min: float = 0.0001  # end of the cosine decay
    lr_day: float = 0.005  # peak learning rate of the day layers
    lr_day_min: float = 0.0001
    warmup_steps: int = 1000  # linear warm-up from 0
    decay_steps: int = 120_000  # step at which the cosine reaches its minimum
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 0.1
    weight_decay: float = 0.001  # not applied to biases
    weight_decay_day: float = 0.0
    grad_clip: float = 10.0  # max global gradient norm; 0 = off

    def __post_init__(self) -> None:
        _require(self.lr > 0 and self.lr_day > 0, "optim.lr and optim.lr_day must be > 0")
        _require(0 <= self.lr_min <= self.lr and 0 <= self.lr_day_min <= self.lr_day,
                 f"optim.lr_min={self.lr_min} and optim.lr_day_min={self.lr_day_min} must be in 0..their peak "
                 f"(lr={self.lr}, lr_day={self.lr_day})")
        for name in ("beta1", "beta2"):
            _require(0 <= getattr(self, name) < 1, f"optim.{name}={getattr(self, name)} must be in [0, 1) (AdamW)")
        for name in ("eps", "weight_decay", "weight_decay_day", "grad_clip"):
            _require(getattr(self, name) >= 0, f"optim.{name}={getattr(self, name)} must be >= 0")
        _require(0 <= self.warmup_steps <= self.decay_steps,
                 f"optim.warmup_steps={self.warmup_steps} must be in 0..decay_steps={self.decay_steps}")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    backend: str = "openxla"  # openxla | xla (lazy whole-step tracing) | inductor | eager
    compute_dtype: str = "auto"  # the forward's matmuls: bf16 (autocast) | f32 | auto (f32 only on CPUs without bf16)
    steps: int = 120_000  # optimizer steps
    grad_accum: int = 1  # fixed-shape micro-batches per optimizer step
    val_every: int = 2000  # steps between validations (and best-checkpoint checks)
    log_every: int = 100  # steps between loss read-backs (each one is a host sync)
    checkpoint_every: int = 2000  # steps between "last" checkpoints
    shuffle_buffer: int = 64  # batches held for shuffling
    num_workers: int = 1  # loader worker processes
    seed: int = 0

    def __post_init__(self) -> None:
        _require(self.backend in BACKENDS, f"train.backend={self.backend!r}: choose one of {', '.join(BACKENDS)}")
        _require(self.compute_dtype in COMPUTE_DTYPES,
                 f"train.compute_dtype={self.compute_dtype!r}: choose one of {', '.join(COMPUTE_DTYPES)}")
        for name in ("steps", "grad_accum", "val_every", "log_every", "checkpoint_every", "shuffle_buffer"):
            _require(getattr(self, name) >= 1, f"train.{name} must be >= 1")
        _require(self.num_workers >= 0, "train.num_workers must be >= 0")
        _require(self.seed >= 0, f"train.seed must be >= 0, got {self.seed}")


@dataclass(frozen=True, kw_only=True)
class MeshConfig:
    """How one process spreads a run over XLA devices (SPMD); recorded in checkpoints."""

    data: int = 1  # devices each batch is split over along its rows; -1 = every device (over fsdp); 1 = one
    fsdp: int = 1  # devices weights, gradients and AdamW moments are sharded over (the batch is split over these too)

    def __post_init__(self) -> None:
        _require(self.data >= 1 or self.data == -1, f"mesh.data must be >= 1 or -1 (all devices), got {self.data}")
        _require(self.fsdp >= 1, f"mesh.fsdp must be >= 1, got {self.fsdp}")

    @property
    def spmd(self) -> bool:
        """Whether the run spans an SPMD mesh (anything but one device)."""
        return (self.data, self.fsdp) != (1, 1)


@dataclass(frozen=True, kw_only=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def shard_shaping(self) -> dict[str, dict[str, Any]]:
        """The keys a dataset's shards depend on: all of `data`, and the model's patching (bucket
        lengths are aligned to whole patches). b2t-preprocess records them in the manifest and
        refuses to continue an output made with others; b2t-train refuses shards whose patching
        is not its model's. Any other key may differ between the two."""
        return {"data": dataclasses.asdict(self.data),
                "model": {k: getattr(self.model, k) for k in SHARD_SHAPING_MODEL_KEYS}}


SHARD_SHAPING_MODEL_KEYS = ("patch_size", "patch_stride")


def _unknown(kind: str, key: str, known: Iterable[str]) -> ConfigError:
    near = difflib.get_close_matches(str(key), list(known), n=1)  # a YAML key may be a number
    hint = f"; did you mean {near[0]!r}?" if near else f"; known: {', '.join(sorted(known))}"
    return ConfigError(f"unknown {kind} {key!r}{hint}")


def _section_fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _is_section(f: dataclasses.Field) -> bool:
    """A field that is itself a section (e.g. `model.gru`): its default is a config dataclass."""
    return f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory)


def _fits(value: Any, tp: Any) -> bool:
    """Whether a YAML value fits a declared field type: bool is not an int, an int is a float,
    `X | None` takes null, `Literal[...]` its listed values, a section type a mapping."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in typing.get_args(tp))
    if origin is typing.Literal:
        return value in typing.get_args(tp)
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp in (int, str, bool):
        return isinstance(value, tp) and (tp is bool or not isinstance(value, bool))
    if dataclasses.is_dataclass(tp):
        return isinstance(value, (tp, Mapping))
    raise TypeError(f"the config schema declares {tp!r}, which has no type check")


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in typing.get_args(tp))
    if typing.get_origin(tp) is typing.Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(tp)))
    names = {type(None): "null", int: "an integer", float: "a number", str: "a string", bool: "true/false"}
    return names.get(tp, f"a {getattr(tp, '__name__', tp)} mapping")


INT_LIMIT = 2**63
"""Integers are int64 everywhere they go (numpy, torch's seeds and shapes): larger ones are refused."""


def check_value(key: str, value: Any, tp: Any) -> Any:
    """`value` for the field `key` declared as `tp` (an int given for a float field becomes a
    float); a value of another type, an integer beyond int64 or a NaN/Inf raises ConfigError
    naming the key, the value and the type."""
    if not _fits(value, tp):
        raise ConfigError(f"{key}={value!r} ({type(value).__name__}): expected {_type_name(tp)}")
    if isinstance(value, int) and not isinstance(value, bool) and not -INT_LIMIT <= value < INT_LIMIT:
        raise ConfigError(f"{key}={value}: out of range (integers are at most 2**63 - 1 in magnitude)")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}={value}: expected a finite number")
    accepted = typing.get_args(tp) or (tp,)
    if isinstance(value, int) and not isinstance(value, bool) and float in accepted and int not in accepted:
        return float(value)
    return value


def _build(cls: type, values: Mapping[str, Any] | None, where: str) -> Any:
    """`cls` from a mapping, sub-sections built recursively; unknown keys raise ConfigError."""
    if values is None:
        values = {}
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where or 'the config'} must be a mapping of keys, got {values!r}")
    fields = _section_fields(cls)
    hints = typing.get_type_hints(cls)  # the declared field types (the annotations are strings)
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            nested = [f"{n}.{key}" for n, f in fields.items() if _is_section(f) and key in _section_fields(f.default_factory)]
            if nested:
                raise ConfigError(f"unknown key in section {where!r} {key!r}: it belongs to a sub-section, "
                                  f"write {where}.{nested[0]}")
            kind = f"key in section {where!r}" if where else "config section"
            raise _unknown(kind, key, fields)
        f = fields[key]
        name = f"{where}.{key}".lstrip(".")
        kwargs[key] = _build(f.default_factory, value, name) if _is_section(f) else check_value(name, value, hints[key])
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ConfigError(f"section {where!r}: {e}") from e
    except ConfigError as e:  # a shared section type (GRUConfig) does not know where it sits
        raise ConfigError(str(e) if str(e).startswith(where) else f"{where}: {e}") from None


def config_from_dict(raw: Mapping[str, Any]) -> Config:
    """Build a Config from nested dicts; unknown sections or keys raise ConfigError."""
    return _build(Config, raw, "")


class _NumberLoader(yaml.SafeLoader):
    """YAML 1.1 with the number spellings every ML config uses: PyYAML reads `1e-3`, `1e6`
    and `-1E-4` as strings (its float pattern wants a dot and a signed exponent); and a key
    given twice in one mapping is an error (PyYAML keeps the last one and says nothing)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:  # before merges (`<<`), whose keys may be overridden
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue  # the base class refuses it by name
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


_NumberLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def parse_yaml(text: str, where: str) -> Any:
    """`text` as YAML (numbers in every common spelling); ConfigError naming `where` and the line."""
    try:
        return yaml.load(text, Loader=_NumberLoader)  # a SafeLoader: builds plain data only
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = " ".join(str(p) for p in (getattr(e, "context", None), getattr(e, "problem", None)) if p) or str(e)
        raise ConfigError(f"{where}{line}: not valid YAML ({problem})") from None


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply `section.key=value` strings (also `section.sub.key=value`; values parsed as YAML)
    to a raw dict. A mapping value (`model.gru={n_units: 32}`) merges into the section key by
    key, as a config file's `base:` does, rather than dropping the section's other keys."""
    out = copy.deepcopy(raw)
    for item in overrides:
        path, sep, value = item.partition("=")
        keys = [k.strip() for k in path.split(".")]
        if not sep or len(keys) < 2 or not all(keys):
            raise ConfigError(f"override {item!r} is not of the form section.key=value")
        node = out
        for k in keys[:-1]:
            child = node.get(k)
            if child is None:
                child = node[k] = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {k!r} is a value, not a section")
            node = child
        value = parse_yaml(value, f"override {item!r}")
        both = isinstance(value, dict) and isinstance(node.get(keys[-1]), dict)
        node[keys[-1]] = _merged(node[keys[-1]], value) if both else value
    return out


BASE_KEY = "base"
"""A config's optional top-level `base: other.yaml` (relative to the config's own folder): the
file's sections are merged over that file's, key by key, so a config states only what differs."""


def read_config_file(path: str | Path, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The raw sections of a YAML config, with its `base:` chain resolved (`BASE_KEY`)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text at byte {e.start} (expected a YAML config)") from None
    raw = parse_yaml(text, str(path))
    if raw is None:
        raise ConfigError(f"{path}: the file is empty (expected sections such as data:, model:, train:); "
                          "to train with the defaults, pass no --config")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}:1: expected a mapping of sections at the top level, got {type(raw).__name__}")
    base = raw.pop(BASE_KEY, None)
    if base is None:
        return raw
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{path}: base={base!r}: expected a file name, e.g. base: baseline.yaml")
    chain = (*_chain, Path(path).resolve())
    base_path = (Path(path).parent / base).resolve()
    if base_path in chain:
        cycle = " -> ".join(str(p) for p in (*chain[chain.index(base_path):], base_path))
        raise ConfigError(f"{path}: base: {base} makes a cycle ({cycle}): one of these files must not name a base")
    if not base_path.is_file():
        raise ConfigError(f"{path}: base: {base}: {base_path} is not a file (the base is found relative to "
                          f"{Path(path).parent})")
    return _merged(read_config_file(base_path, chain), raw)


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`: mappings merge key by key, any other value replaces."""
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merged(out[key], value) if both else value
    return out


def load_config(path: str | Path | None, overrides: Iterable[str] = ()) -> Config:
    """Read a YAML config (None = all defaults; `base:` resolved), apply overrides, validate.

    An error is blamed where it is: on the file when the file alone is invalid, else on the
    first `--set` that breaks the config on its own, else on the overrides together (some
    are only valid together, such as a batch size and its row multiple)."""
    raw = read_config_file(path) if path is not None else {}
    overrides = list(overrides)
    try:
        return config_from_dict(apply_overrides(raw, overrides))
    except ConfigError as e:
        error = e
    try:
        config_from_dict(raw)
    except ConfigError as e:
        raise ConfigError(f"{path or 'defaults'}: {e}") from None
    for item in overrides:
        try:
            config_from_dict(apply_overrides(raw, [item]))
        except ConfigError as e:
            raise ConfigError(f"--set {item}: {e}") from None
    raise ConfigError(f"--set {' --set '.join(overrides)} (together): {error}") from None
