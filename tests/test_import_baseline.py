"""`b2t-import-baseline`: a checkpoint in the public baseline's exact format -> our checkpoint.

The reference model is written here from docs/reference-baseline.md (per-day
ParameterList, `Tensor.unfold` patching, torch's GRU, learnable h0, linear output), wrapped
in torch.compile as the baseline is (keys gain `_orig_mod.`) and saved as its trainer does
(torch.save of a dict with optimizer and scheduler state, val_PER and an np.float64 val_loss).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from click.testing import CliRunner
from torch import nn
from torch.nn.modules.rnn import GRU as TorchGRU  # `import torch_xla` rebinds nn.GRU to a CPU-less class

from b2t.cli.import_baseline import import_main
from b2t.config import Config, config_from_dict
from b2t.data.manifest import Manifest
from b2t.engine.checkpoint import load_checkpoint
from b2t.import_baseline import BaselineError, config_from_args, import_baseline
from b2t.model.decoder import CTC_HEAD, GRUDecoder
from b2t.model.registry import build_model

CPU = torch.device("cpu")
SESSIONS = ["t15.2023.08.11", "t15.2023.08.13", "t15.2023.08.18"]
PATCHING = {"model": {"patch_size": 14, "patch_stride": 4}}  # a manifest's model section: what its buckets fit
SIZES = {"n_units": 24, "n_layers": 2, "patch_size": 6, "patch_stride": 3}


class ReferenceDecoder(nn.Module):
    """The baseline's GRU decoder as documented: one day layer per session, unfold patching."""

    def __init__(self, n_days: int, n_units: int, n_layers: int, patch_size: int, patch_stride: int) -> None:
        super().__init__()
        self.n_layers, self.n_units = n_layers, n_units
        self.patch_size, self.patch_stride = patch_size, patch_stride
        self.day_weights = nn.ParameterList([nn.Parameter(torch.eye(512, dtype=torch.float32, device=CPU))
                                             for _ in range(n_days)])
        self.day_biases = nn.ParameterList([nn.Parameter(torch.zeros(1, 512, dtype=torch.float32, device=CPU))
                                            for _ in range(n_days)])
        self.day_layer_dropout = nn.Dropout(0.2)
        self.gru = TorchGRU(512 * patch_size, n_units, n_layers, dropout=0.4, batch_first=True,
                            dtype=torch.float32, device=CPU)
        for name, p in self.gru.named_parameters():
            if "weight_hh" in name:
                nn.init.orthogonal_(p)
            if "weight_ih" in name:
                nn.init.xavier_uniform_(p)
        self.out = nn.Linear(n_units, 41, dtype=torch.float32, device=CPU)
        nn.init.xavier_uniform_(self.out.weight)
        self.h0 = nn.Parameter(nn.init.xavier_uniform_(torch.zeros(1, 1, n_units, dtype=torch.float32, device=CPU)))

    def forward(self, x: torch.Tensor, day_idx: torch.Tensor) -> torch.Tensor:
        w = torch.stack([self.day_weights[i] for i in day_idx], dim=0)  # (B, 512, 512)
        b = torch.cat([self.day_biases[i] for i in day_idx], dim=0).unsqueeze(1)  # (B, 1, 512)
        x = self.day_layer_dropout(F.softsign(torch.einsum("btd,bdk->btk", x, w) + b))
        x = x.unsqueeze(1).permute(0, 3, 1, 2)  # (B, 512, 1, T)
        x = x.unfold(3, self.patch_size, self.patch_stride)  # (B, 512, 1, P, size)
        x = x.squeeze(2).permute(0, 2, 3, 1)  # (B, P, size, 512)
        x = x.reshape(x.shape[0], x.shape[1], -1)  # (B, P, size*512)
        h0 = self.h0.expand(self.n_layers, x.shape[0], self.n_units).contiguous()
        y, _ = self.gru(x, h0)
        return self.out(y)


def reference_model(seed: int = 0) -> ReferenceDecoder:
    """A freshly initialised reference model with distinct day layers (as after training)."""
    torch.manual_seed(seed)
    model = ReferenceDecoder(len(SESSIONS), **SIZES)
    with torch.no_grad():
        for w, b in zip(model.day_weights, model.day_biases):
            w.add_(0.05 * torch.randn(w.shape, dtype=torch.float32, device=CPU))
            b.add_(0.1 * torch.randn(b.shape, dtype=torch.float32, device=CPU))
    return model.eval()


def baseline_args(sessions: list[str] = SESSIONS, **model: object) -> dict:
    """The parts of the baseline's args.yaml the importer reads, with unrelated keys around them."""
    return {
        "model": {"n_input_features": 512, **SIZES, **model, "rnn_dropout": 0.4, "rnn_trainable": True,
                  "input_network": {"n_input_layers": 1, "input_layer_dropout": 0.2}},
        "lr_max": 0.005, "lr_min": 0.0001, "beta0": 0.9, "beta1": 0.999, "epsilon": 0.1, "seed": 10,
        "grad_norm_clip_value": 10, "num_training_batches": 120000, "use_amp": True,
        "dataset": {"n_classes": 41, "batch_size": 64, "days_per_batch": 4, "sessions": list(sessions),
                    "data_transforms": {"white_noise_std": 1.0, "constant_offset_std": 0.2, "random_cut": 3,
                                        "smooth_data": True, "smooth_kernel_std": 2, "smooth_kernel_size": 100}},
    }


def save_release(root: Path, model: ReferenceDecoder, args: dict | None = None,
                 edit: dict | None = None) -> Path:
    """`root/checkpoint/best_checkpoint` (+ args.yaml) as the baseline's trainer writes them.

    edit: state-dict keys to replace (a tensor) or drop (None), to make a mismatched file.
    """
    compiled = torch.compile(model)  # the baseline trains the compiled module: keys gain `_orig_mod.`
    state = dict(compiled.state_dict())
    for key, value in (edit or {}).items():
        if value is None:
            del state[key]
        else:
            state[key] = value
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.005, eps=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    directory = root / "checkpoint"
    directory.mkdir(parents=True)
    torch.save({"model_state_dict": state, "optimizer_state_dict": optimizer.state_dict(),
                "scheduler_state_dict": scheduler.state_dict(), "val_PER": 0.101,
                "val_loss": np.mean(np.array([12.5, 13.5]))}, directory / "best_checkpoint")
    (directory / "args.yaml").write_text(yaml.safe_dump(args or baseline_args()))
    return directory / "best_checkpoint"


def load_ours(path: Path) -> tuple[GRUDecoder, list[str]]:
    from b2t.engine.checkpoint import read_checkpoint

    _, meta = read_checkpoint(path)
    cfg = meta["state"]["config"]["model"]
    model = build_model(config_from_dict({"model": cfg}).model, len(meta["state"]["sessions"]))
    load_checkpoint(path, model)
    return model.eval(), meta["state"]["sessions"]


def features(n_rows: int = 3, n_time: int = 41, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator(device=CPU).manual_seed(seed)
    return torch.randn(n_rows, n_time, 512, generator=gen, dtype=torch.float32, device=CPU)


def test_imported_baseline_gives_the_reference_logits(tmp_path):
    ref = reference_model()
    ckpt = save_release(tmp_path / "release", ref)
    report = import_baseline(tmp_path / "release", tmp_path / "ours.safetensors")
    assert report.output.exists() and report.val_per == pytest.approx(0.101)
    ours, sessions = load_ours(tmp_path / "ours.safetensors")
    assert sessions == SESSIONS and report.config_source == str(ckpt.parent / "args.yaml")
    x, days = features(), torch.tensor([2, 0, 1], dtype=torch.int64, device=CPU)
    with torch.no_grad():
        want = ref(x, days)
        got = ours(x, days.to(torch.int32))[CTC_HEAD]
    assert got.shape == want.shape == (3, (41 - 6) // 3 + 1, 41)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_day_layers_follow_the_target_dataset_session_list(tmp_path):
    ref = reference_model(seed=3)
    save_release(tmp_path / "release", ref)
    target = [SESSIONS[2], SESSIONS[0]]  # a dataset holding two of the three sessions
    Manifest(sessions=target, buckets=[], shards=[], splits={}, sources=[], config=PATCHING).save(tmp_path / "data")
    import_baseline(tmp_path / "release", tmp_path / "ours.safetensors", sessions_path=tmp_path / "data")
    ours, sessions = load_ours(tmp_path / "ours.safetensors")
    assert sessions == target
    x = features(n_rows=2)
    with torch.no_grad():
        want = ref(x, torch.tensor([2, 0], dtype=torch.int64, device=CPU))
        got = ours(x, torch.tensor([0, 1], dtype=torch.int32, device=CPU))[CTC_HEAD]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_target_session_the_baseline_never_saw_is_refused(tmp_path):
    save_release(tmp_path / "release", reference_model())
    Manifest(sessions=["t15.2099.01.01"], buckets=[], shards=[], splits={}, sources=[], config=PATCHING).save(tmp_path / "d")
    with pytest.raises(BaselineError, match=r"t15\.2099\.01\.01.*no day layer"):
        import_baseline(tmp_path / "release", tmp_path / "ours.safetensors", sessions_path=tmp_path / "d")


@pytest.mark.parametrize(("edit", "args", "message"), [
    ({"_orig_mod.gru.weight_hh_l1": None}, None, r"missing key 'gru\.weight_hh_l1'"),
    ({"_orig_mod.gru.weight_ih_l2": torch.zeros(72, 24)}, None, r"unexpected key 'gru\.weight_ih_l2'"),
    ({"_orig_mod.day_weights.1": torch.zeros(512, 500)}, None,
     r"key 'day_weights\.1' has shape \(512, 500\), expected \(512, 512\)"),
    ({}, baseline_args(n_units=32), r"key 'h0' has shape \(1, 1, 24\), expected \(1, 1, 32\)"),
    ({}, baseline_args(sessions=SESSIONS[:2]), r"unexpected key 'day_weights\.2'"),
], ids=["missing", "extra", "day-shape", "args-n_units", "fewer-sessions"])
def test_a_mismatched_checkpoint_is_refused_naming_the_key(tmp_path, edit, args, message):
    save_release(tmp_path / "release", reference_model(), args=args, edit=edit)
    with pytest.raises(BaselineError, match=message):
        import_baseline(tmp_path / "release", tmp_path / "ours.safetensors")
    assert not (tmp_path / "ours.safetensors").exists()


@dataclasses.dataclass
class Payload:
    note: str


def test_objects_beyond_tensors_and_plain_data_are_not_unpickled(tmp_path):
    directory = tmp_path / "release" / "checkpoint"
    directory.mkdir(parents=True)
    torch.save({"model_state_dict": {}, "extra": Payload("runs code on load")}, directory / "best_checkpoint")
    (directory / "args.yaml").write_text(yaml.safe_dump(baseline_args()))
    with pytest.raises(BaselineError, match=r"weights_only=True"):
        import_baseline(tmp_path / "release", tmp_path / "ours.safetensors")


def test_args_yaml_sets_model_augmentation_and_recipe():
    cfg = config_from_args(baseline_args(), Config())
    assert (cfg.model.gru.n_units, cfg.model.gru.n_layers, cfg.model.patch_size, cfg.model.patch_stride) == (24, 2, 6, 3)
    assert (cfg.model.gru.rnn_dropout, cfg.model.input_dropout) == (0.4, 0.2)
    assert (cfg.augment.max_start_cut, cfg.augment.smooth_std) == (2, 2.0)  # random_cut 3 draws 0..2
    assert (cfg.optim.eps, cfg.train.steps, cfg.train.seed, cfg.data.days_per_batch) == (0.1, 120000, 10, 4)
    with pytest.raises(BaselineError, match=r"dataset\.n_classes=40"):
        config_from_args({**baseline_args(), "dataset": {"n_classes": 40}}, Config())


@pytest.mark.parametrize("path, value, message", [
    ("model.n_layers", 2.7, r"model\.gru\.n_layers=2\.7 \(float\): expected an integer"),  # was cut to 2
    ("model.n_units", "big", r"model\.gru\.n_units='big' \(str\): expected an integer"),  # rc 70
    ("lr_max", [1], r"optim\.lr=\[1\] \(list\): expected a number"),  # rc 70
    ("beta0", 2, r"optim\.beta1=2\.0 must be in \[0, 1\)"),
    ("dataset.data_transforms.random_cut", 1.5, r"augment\.max_start_cut=1\.5 \(float\)"),
])
def test_a_bad_value_in_args_yaml_is_one_error_naming_the_file_and_key(path, value, message):
    args = baseline_args()
    *sections, key = path.split(".")
    node = args
    for section in sections:
        node = node[section]
    node[key] = value
    with pytest.raises(BaselineError, match=r"^elsewhere\.yaml: a value does not fit b2t's config \(" + message):
        config_from_args(args, Config(), "elsewhere.yaml")


@pytest.mark.parametrize("val_per", ["abc", [0.1]])
def test_a_val_per_that_is_no_number_is_refused_naming_the_file(tmp_path, val_per):
    """float() of it was a traceback (exit 70)."""
    ckpt = save_release(tmp_path / "release", reference_model())
    saved = torch.load(ckpt, weights_only=False)
    torch.save({**saved, "val_PER": val_per}, ckpt)
    with pytest.raises(BaselineError, match=rf"{ckpt}: val_PER is \w+ .*, not a number"):
        import_baseline(ckpt, tmp_path / "ours.safetensors")


def test_a_session_listed_twice_in_args_yaml_is_refused(tmp_path):
    """Its first day layer was dropped without a word."""
    ckpt = save_release(tmp_path / "release", reference_model(), args=baseline_args([SESSIONS[0], *SESSIONS[:-1]]))
    with pytest.raises(BaselineError, match=rf"dataset.sessions lists {SESSIONS[0]} twice"):
        import_baseline(ckpt, tmp_path / "ours.safetensors")


def test_without_args_yaml_the_sessions_and_sizes_must_be_given(tmp_path):
    ckpt = save_release(tmp_path / "release", reference_model())
    (ckpt.parent / "args.yaml").unlink()
    with pytest.raises(BaselineError, match=r"no session list.*--sessions-from"):
        import_baseline(ckpt, tmp_path / "ours.safetensors")
    with pytest.raises(BaselineError, match=r"5 x 768 units.*b2t config.*missing key 'gru\.weight_ih_l2'"):
        import_baseline(ckpt, tmp_path / "ours.safetensors", sessions_path=_args_file(tmp_path))
    small = config_from_dict({"model": {"patch_size": SIZES["patch_size"], "patch_stride": SIZES["patch_stride"],
                                        "gru": {"n_units": SIZES["n_units"], "n_layers": SIZES["n_layers"]}}})
    report = import_baseline(ckpt, tmp_path / "ours.safetensors", sessions_path=_args_file(tmp_path), base=small)
    assert report.n_days == 3 and report.config_source == "the b2t config"


def _args_file(tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere.yaml"
    path.write_text(yaml.safe_dump(baseline_args()))
    return path


def test_cli_converts_and_refuses_with_the_key(tmp_path):
    save_release(tmp_path / "good", reference_model())
    result = CliRunner().invoke(import_main, [str(tmp_path / "good"), "-o", str(tmp_path / "ours.safetensors")])
    assert result.exit_code == 0, result.output
    assert "weights_only=True" in result.output and "3 day layers" in result.output
    save_release(tmp_path / "bad", reference_model(), edit={"_orig_mod.out.bias": None})
    result = CliRunner().invoke(import_main, [str(tmp_path / "bad"), "-o", str(tmp_path / "x.safetensors")])
    assert result.exit_code == 2 and "missing key 'out.bias'" in result.output
    assert "Traceback" not in result.output


def test_a_b2t_checkpoint_or_a_zip_given_as_the_baseline_says_what_it_is(tmp_path):
    """Both were torch's words ("Unsupported operand 56", 'Expected hasRecord("version")')."""
    import zipfile

    from b2t.engine.checkpoint import TrainState, save_checkpoint

    ours = save_checkpoint(tmp_path / "ours.safetensors", reference_model(), None, TrainState())
    with pytest.raises(BaselineError, match=r"it is a safetensors file, e.g. a b2t checkpoint already"):
        import_baseline(ours, tmp_path / "out.safetensors", sessions_path=_args_file(tmp_path))
    with zipfile.ZipFile(tmp_path / "release.zip", "w") as z:
        z.writestr("release/checkpoint/args.yaml", "model: {}\n")
    with pytest.raises(BaselineError, match=r"it is a zip archive, not a torch save: unzip the release"):
        import_baseline(tmp_path / "release.zip", tmp_path / "out.safetensors", sessions_path=_args_file(tmp_path))


def test_an_args_file_without_sessions_is_named_as_given(tmp_path):
    """`--args other.yaml` without a session list was told to put an args.yaml beside the checkpoint."""
    ckpt = save_release(tmp_path / "release", reference_model())
    args = baseline_args()
    del args["dataset"]["sessions"]
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(args))
    with pytest.raises(BaselineError, match=rf"no session list: {tmp_path / 'mine.yaml'} has no dataset.sessions"):
        import_baseline(ckpt, tmp_path / "ours.safetensors", args_path=tmp_path / "mine.yaml")


def test_a_baseline_with_nan_weights_names_them(tmp_path):
    ckpt = save_release(tmp_path / "release", reference_model())
    saved = torch.load(ckpt, weights_only=False)
    state = dict(saved["model_state_dict"])
    key = next(k for k in state if k.endswith("gru.weight_ih_l0"))
    state[key] = torch.full_like(state[key], float("nan"))
    torch.save({**saved, "model_state_dict": state}, ckpt)
    with pytest.raises(BaselineError, match=r"the baseline's weights hold NaN/Inf \(gru.weight_ih_l0\): the checkpoint "
                                            r"of a run that diverged"):
        import_baseline(ckpt, tmp_path / "ours.safetensors")
