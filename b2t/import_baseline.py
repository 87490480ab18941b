"""The public baseline's pretrained checkpoint -> a b2t checkpoint (evaluate it, compare, fine-tune).

The release (docs/reference-baseline.md) is `checkpoint/best_checkpoint`, a
`torch.save` of {model_state_dict, optimizer_state_dict, scheduler_state_dict, val_PER,
val_loss} whose weights carry torch.compile's `_orig_mod.` prefix and one
`day_weights.<d>` / `day_biases.<d>` per day, with `args.yaml` beside it (model sizes under
`model`, the session list under `dataset.sessions`, the recipe at the top level).

That file is a pickle. It is read with `torch.load(weights_only=True)`, which rebuilds
only tensors, plain containers and the numpy scalars the baseline stores (its val_loss is
an np.float64) and refuses any other object, so a tampered file cannot run code here.

Day indices: the baseline's day d is position d of its session list; ours is the position
in the target list (the dataset the model will run on). Each target session takes the day
layer of the same session in the baseline, so a dataset with fewer or reordered sessions
still gets the right day layers.
"""

from __future__ import annotations

import math
import re
import warnings
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from b2t.config import Config, ConfigError, config_from_dict, parse_yaml
from b2t.data.manifest import MANIFEST_NAME, Manifest
from b2t.engine.checkpoint import TrainState, save_checkpoint
from b2t.errors import B2tError
from b2t.model.reference import from_reference_state_dict, reference_shapes, strip_compile_prefix
from b2t.model.registry import build_model

CHECKPOINT_NAME = "best_checkpoint"
ARGS_NAME = "args.yaml"


class BaselineError(B2tError, ValueError):
    """The baseline checkpoint or its args cannot be converted; the message names the key or file."""


def _numpy_scalar_globals() -> list[Any]:
    """What unpickling numpy number scalars needs (under numpy 2's and numpy 1's module names)."""
    core = getattr(np, "_core", None) or np.core
    scalar = core.multiarray.scalar
    dtype_classes = [type(np.dtype(t)) for t in (np.float64, np.float32, np.int64, np.int32)]  # numpy.dtypes.*
    return [np.dtype, *dtype_classes, scalar,
            (scalar, "numpy.core.multiarray.scalar"), (scalar, "numpy._core.multiarray.scalar")]


def find_checkpoint(path: str | Path) -> Path:
    """`path` itself, or the release's checkpoint file inside the directory `path`."""
    path = Path(path)
    if path.is_file():
        return path
    for candidate in (path / "checkpoint" / CHECKPOINT_NAME, path / CHECKPOINT_NAME):
        if candidate.is_file():
            return candidate
    raise BaselineError(f"{path}: no baseline checkpoint (expected a file, or a directory holding "
                        f"checkpoint/{CHECKPOINT_NAME} or {CHECKPOINT_NAME})")


def refusal_reason(error: BaseException) -> str:
    """What torch.load(weights_only=True) objected to, in a few words, without torch's advice
    (which suggests `weights_only=False`: running the pickle's code, the one thing not to do)."""
    text = str(error)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1]
    line = next((x.strip() for x in text.splitlines() if x.strip()), "")
    found = re.search(r"Unsupported global: GLOBAL (\S+)", line)
    if found:
        return f"it holds a {found.group(1)} object"
    line = line.split(" Please ")[0].split(" Re-running ")[0]
    if not line or "weights_only" in line:
        return type(error).__name__
    return f"{type(error).__name__}: {line[:120]}"


def _what_else(path: Path) -> str | None:
    """What a file torch.load refused is, when it is a known other thing: a b2t checkpoint
    (safetensors: an 8-byte header length, then its JSON), or a zip that is no torch save
    (the release as downloaded)."""
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < path.stat().st_size:
        return "it is a safetensors file, e.g. a b2t checkpoint already: pass it to b2t-eval or --init-from as it is"
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            if not any(n.endswith("data.pkl") for n in z.namelist()):
                return "it is a zip archive, not a torch save: unzip the release and pass the folder it holds"
    return None


def load_baseline(path: Path) -> dict[str, Any]:
    """The checkpoint dict, unpickled with `weights_only=True` (tensors and plain data only)."""
    if (other := _what_else(path)) is not None:
        raise BaselineError(f"{path}: not a baseline checkpoint: {other}")
    try:
        with torch.serialization.safe_globals(_numpy_scalar_globals()), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's pickle-protocol notes ask to file torch issues
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises UnpicklingError, RuntimeError or EOFError by cause
        raise BaselineError(f"{path}: not a baseline checkpoint: torch.load(weights_only=True), which rebuilds "
                            f"only tensors and plain data, cannot read it ({refusal_reason(e)}); b2t never runs "
                            "other code from a pickle, so this file cannot be imported") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("model_state_dict"), Mapping):
        raise BaselineError(f"{path}: not a baseline checkpoint (expected a dict with 'model_state_dict')")
    return ckpt


def read_args(path: Path) -> dict[str, Any]:
    try:
        args = parse_yaml(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError) as e:
        raise BaselineError(f"{path}: cannot read the baseline's args ({e})") from None
    except ConfigError as e:  # names the file and line
        raise BaselineError(f"{e}: expected the baseline's args.yaml") from None
    if not isinstance(args, dict):
        raise BaselineError(f"{path}: expected the baseline's args.yaml (a mapping)")
    return args


def _get(args: Mapping[str, Any], path: str) -> Any:
    node: Any = args
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


_ARGS_TO_CONFIG: tuple[tuple[str, str], ...] = (
    # (args.yaml path, our section.key): the value as it is, checked against the key's type by the config
    ("model.n_units", "model.gru.n_units"),
    ("model.n_layers", "model.gru.n_layers"),
    ("model.patch_size", "model.patch_size"),
    ("model.patch_stride", "model.patch_stride"),
    ("model.rnn_dropout", "model.gru.rnn_dropout"),
    ("model.input_network.input_layer_dropout", "model.input_dropout"),
    ("dataset.data_transforms.white_noise_std", "augment.white_noise_std"),
    ("dataset.data_transforms.constant_offset_std", "augment.constant_offset_std"),
    ("dataset.data_transforms.smooth_kernel_std", "augment.smooth_std"),
    ("dataset.batch_size", "data.batch_size"),
    ("dataset.days_per_batch", "data.days_per_batch"),
    ("lr_max", "optim.lr"),
    ("lr_min", "optim.lr_min"),
    ("lr_max_day", "optim.lr_day"),
    ("lr_min_day", "optim.lr_day_min"),
    ("lr_warmup_steps", "optim.warmup_steps"),
    ("lr_decay_steps", "optim.decay_steps"),
    ("beta0", "optim.beta1"),
    ("beta1", "optim.beta2"),
    ("epsilon", "optim.eps"),
    ("weight_decay", "optim.weight_decay"),
    ("weight_decay_day", "optim.weight_decay_day"),
    ("grad_norm_clip_value", "optim.grad_clip"),
    ("num_training_batches", "train.steps"),
    ("batches_per_val_step", "train.val_every"),
    ("seed", "train.seed"),
)
"""The baseline's args that have a b2t config key; everything else keeps b2t's default."""


def config_from_args(args: Mapping[str, Any], base: Config, where: str | Path = ARGS_NAME) -> Config:
    """`base` with every value the baseline's args.yaml (at `where`, named in errors) sets (model
    sizes, augmentation, recipe); BaselineError naming the key where a value does not fit."""
    for path, want in (("model.n_input_features", 512), ("dataset.n_classes", 41)):
        if _get(args, path) not in (None, want):
            raise BaselineError(f"{where}: {path}={_get(args, path)}, b2t's data contract has {want}")
    raw = base.to_dict()
    for path, target in _ARGS_TO_CONFIG:
        value = _get(args, path)
        if value is not None:
            *sections, key = target.split(".")
            node = raw
            for section in sections:
                node = node[section]
            node[key] = value
    cut = _get(args, "dataset.data_transforms.random_cut")
    if cut is not None:  # the baseline draws randint(0, cut); a value that is no integer is refused below
        raw["augment"]["max_start_cut"] = max(cut - 1, 0) if type(cut) is int else cut
    if _get(args, "dataset.data_transforms.smooth_data") is False:
        raw["augment"]["smooth_std"] = 0.0
    try:
        return config_from_dict(raw)
    except ConfigError as e:
        raise BaselineError(f"{where}: a value does not fit b2t's config ({e}): correct it in the file") from None


def _number_or_none(value: Any, where: Path) -> float | None:
    """The checkpoint's val_PER (None when absent); BaselineError where it is no number, which
    the baseline's trainer never writes (float() of a string or a list was a traceback)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return None if value is None else float(value)
    raise BaselineError(f"{where}: val_PER is {type(value).__name__} {str(value)[:40]!r}, not a number: this is not "
                        "a checkpoint the baseline's trainer wrote")


def sessions_from(path: str | Path) -> list[str]:
    """The session list of a preprocessed dataset (its manifest) or of a baseline args.yaml."""
    path = Path(path)
    if path.is_dir():
        if not (path / MANIFEST_NAME).exists():
            raise BaselineError(f"{path}: no {MANIFEST_NAME}; pass a b2t-preprocess output or an args.yaml")
        return list(Manifest.load(path).sessions)
    sessions = args_sessions(read_args(path), path)
    if sessions is None:
        raise BaselineError(f"{path}: no session list under dataset.sessions")
    return sessions


def args_sessions(args: Mapping[str, Any], where: str | Path) -> list[str] | None:
    """The baseline's session list (its day index order) from its args, None when absent."""
    sessions = _get(args, "dataset.sessions")
    if sessions is None:
        return None
    if not isinstance(sessions, list) or not sessions:
        raise BaselineError(f"{where}: dataset.sessions must be a non-empty list of session names")
    names = [str(s) for s in sessions]
    twice = [s for i, s in enumerate(names) if s in names[:i]]
    if twice:  # day_mapping kept the last day layer of the name, the other one silently dropped
        raise BaselineError(f"{where}: dataset.sessions lists {twice[0]} twice: each session has one day layer")
    return names


def check_reference_keys(state: Mapping[str, torch.Tensor], expected: Mapping[str, tuple[int, ...]],
                         where: str) -> None:
    """Raise BaselineError naming every missing, extra or mis-shaped key of `state`."""
    problems = [f"missing key {k!r} (shape {expected[k]})" for k in expected if k not in state]
    problems += [f"unexpected key {k!r}" for k in state if k not in expected]
    problems += [f"key {k!r} has shape {tuple(v.shape)}, expected {expected[k]}"
                 for k, v in state.items() if k in expected and tuple(v.shape) != expected[k]]
    if problems:
        shown = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
        raise BaselineError(f"{where}: the weights do not fit the model: {shown}")


def day_mapping(baseline: Sequence[str], target: Sequence[str]) -> list[int]:
    """For each target session, its day index in the baseline's session list."""
    position = {s: d for d, s in enumerate(baseline)}
    unknown = [s for s in target if s not in position]
    if unknown:
        raise BaselineError(f"sessions {unknown[:5]} have no day layer in the baseline "
                            f"(it was trained on {len(baseline)} sessions, {baseline[0]} .. {baseline[-1]})")
    return [position[s] for s in target]


@dataclass(frozen=True)
class ImportReport:
    output: Path
    n_days: int  # day layers written (target sessions)
    baseline_days: int
    val_per: float | None  # the baseline's own validation PER, when stored
    config_source: str  # where the model sizes came from


def import_baseline(path: str | Path, output: str | Path, *, sessions_path: str | Path | None = None,
                    args_path: str | Path | None = None, base: Config | None = None) -> ImportReport:
    """Convert the baseline checkpoint at `path` into a b2t checkpoint at `output`.

    args_path: the baseline's args.yaml (default: the one beside the checkpoint, if any);
    it gives the model sizes and the baseline's session list. sessions_path: a dataset (or
    args.yaml) whose session list the output is numbered by (default: the baseline's own).
    base: the config for everything args.yaml does not set (default: b2t's defaults, the
    reference recipe); without args.yaml its model section must match the weights.
    """
    ckpt_file = find_checkpoint(path)
    args_file = Path(args_path) if args_path is not None else ckpt_file.parent / ARGS_NAME
    args = read_args(args_file) if args_path is not None or args_file.is_file() else None
    cfg = base or Config()
    if args is not None:
        cfg = config_from_args(args, cfg, args_file)
    baseline_sessions = args_sessions(args, args_file) if args is not None else None
    target = sessions_from(sessions_path) if sessions_path is not None else None
    if baseline_sessions is None and target is None:
        where = (f"{args_file} has no dataset.sessions" if args is not None
                 else f"put the baseline's {ARGS_NAME} beside {ckpt_file}")
        raise BaselineError(f"no session list: {where}, or pass --sessions-from with the dataset (or args.yaml) it "
                            "was trained on")
    baseline_sessions = baseline_sessions or target
    target = target or baseline_sessions

    ckpt = load_baseline(ckpt_file)
    state = strip_compile_prefix(ckpt["model_state_dict"])
    bad = [k for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point()
           and not bool(torch.isfinite(v).all())]
    if bad:  # refused at the save, as a run "diverged by step 0" told to lower optim.lr
        raise BaselineError(f"{ckpt_file}: the baseline's weights hold NaN/Inf ({', '.join(bad[:3])}"
                            f"{', ...' if len(bad) > 3 else ''}): the checkpoint of a run that diverged; import another")
    if cfg.model.family != "gru":
        raise BaselineError(f"the baseline is a GRU decoder: use model.family=gru, not {cfg.model.family!r}")
    model = build_model(cfg.model, len(target))
    source = str(args_file) if args is not None else "the b2t config"
    m, g = cfg.model, cfg.model.gru
    where = (f"{ckpt_file} (for a model of {g.n_layers} x {g.n_units} units, patches {m.patch_size}/{m.patch_stride}, "
             f"{len(baseline_sessions)} days; sizes from {source})")
    check_reference_keys(state, reference_shapes(model, len(baseline_sessions)), where)

    weights = from_reference_state_dict(state, day_mapping(baseline_sessions, target))  # target's day order
    model.load_state_dict({k: v.to(torch.float32) for k, v in weights.items()})

    val_per = _number_or_none(ckpt.get("val_PER"), ckpt_file)
    train_state = TrainState(best_per=val_per if val_per is not None and math.isfinite(val_per) else math.inf,
                             sessions=list(target), config=cfg.to_dict())
    out = save_checkpoint(Path(output), model, None, train_state)
    return ImportReport(out, len(target), len(baseline_sessions), val_per, source)
