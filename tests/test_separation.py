"""b2t.separation: the report's figures on cases with a known answer."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from b2t.config import AugmentConfig, GRUConfig, ModelConfig, NoiseSeparatingConfig
from b2t.errors import DatasetError, MissingInput
from b2t.model.noise_separating import NoiseSeparatingDecoder
from b2t.separation import Checkpointed, Tally, clean_space, separation_report
from preprocess.synth import preset_spec, write_dataset

SESSIONS = 2


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("separation") / "synth"
    write_dataset(preset_spec("realistic", sessions=SESSIONS, train_trials=1, val_trials=1, test_trials=0, words=(1, 2),
                              corpus_sentences=0, ground_truth=True), out)
    return out


def tiny_model(**separating: object) -> NoiseSeparatingDecoder:
    small = GRUConfig(n_units=8, n_layers=1, rnn_dropout=0.0)
    cfg = ModelConfig(family="noise_separating",
                      noise_separating=NoiseSeparatingConfig(noise=small, clean=small, noisy=small, **separating))
    torch.manual_seed(0)
    return NoiseSeparatingDecoder(SESSIONS, cfg).eval()


def test_tally_figures_on_known_estimates() -> None:
    g = torch.Generator().manual_seed(0)
    speech, nonspeech = torch.zeros(2, 30, 40), torch.zeros(2, 30, 40)
    speech[..., :20] = torch.randn(2, 30, 20, generator=g)  # disjoint channels: exactly orthogonal
    nonspeech[..., 20:] = torch.randn(2, 30, 20, generator=g)
    cases = {  # estimate -> (r2, leakage)
        "truth": (nonspeech, 1.0, 0.0),
        "zero": (torch.zeros_like(nonspeech), 0.0, 0.0),
        "half the truth": (0.5 * nonspeech, 0.75, 0.0),
        "truth + half the speech": (nonspeech + 0.5 * speech, 1.0 - 0.25 * (speech**2).sum() / (nonspeech**2).sum(), 0.5),
        "the speech": (speech, 1.0 - ((speech**2).sum() + (nonspeech**2).sum()) / (nonspeech**2).sum(), 1.0),
    }
    for name, (estimate, r2, leakage) in cases.items():
        tally = Tally()
        tally.add_parts(estimate, nonspeech, speech)
        got = tally.result()
        assert got.r2 == pytest.approx(float(r2), abs=1e-6), name
        assert got.leakage == pytest.approx(leakage, abs=1e-6), name
        if name != "zero":
            assert got.r2 == pytest.approx(2 * got.cosine * got.energy**0.5 - got.energy, abs=1e-6), name
    tally = Tally()
    tally.add_parts(0.5 * nonspeech, nonspeech, speech)
    assert (tally.result().energy, tally.result().cosine) == (pytest.approx(0.25), pytest.approx(1.0))


def test_tally_per_of_each_head() -> None:
    """Greedy decodes: frames 0 3 3 0 5 -> [3, 5]; against reference [3, 5, 7] one edit, all blank three."""
    frames = torch.tensor([0, 3, 3, 0, 5])
    tally = Tally()
    tally.add_decodes({"clean": torch.nn.functional.one_hot(frames, 41).float(), "noisy": torch.zeros(5, 41)}, [3, 5, 7])
    got = tally.result()
    assert (got.clean_per, got.noisy_per, got.trials) == (1 / 3, 1.0, 1)


def test_the_truth_is_mapped_into_the_clean_path_by_its_day_layer_and_patches() -> None:
    """Q(x) - Q(x - n) against numpy: softsign(x W + b) windows, flattened time-major."""
    model = tiny_model()
    with torch.no_grad():
        model.clean.day.weight[1] = 0.5 * torch.eye(512) + 0.01 * torch.randn(512, 512)
        model.clean.day.bias[1] = 0.1
    rng = np.random.default_rng(0)
    x, n = rng.standard_normal((30, 512), dtype=np.float32), rng.standard_normal((30, 512), dtype=np.float32)
    day = torch.tensor([1], dtype=torch.int32)
    got = clean_space(model, torch.from_numpy(x)[None], day) - clean_space(model, torch.from_numpy(x - n)[None], day)
    w, b = model.clean.day.weight[1].detach().numpy(), model.clean.day.bias[1].detach().numpy()

    def q(v: np.ndarray) -> np.ndarray:
        y = v @ w + b
        y = y / (1 + np.abs(y))
        size, stride = model.cfg.patch_size, model.cfg.patch_stride
        return np.stack([y[p * stride : p * stride + size].reshape(-1) for p in range((30 - size) // stride + 1)])

    np.testing.assert_allclose(got[0].detach().numpy(), q(x) - q(x - n), atol=1e-5)


def _smoothed(x: torch.Tensor, n_bins: int) -> torch.Tensor:
    from b2t.engine.augment import augment

    return augment(x, torch.tensor([n_bins]), AugmentConfig(), train=False)[0]


def test_report_on_a_zero_estimate_and_on_the_true_one(data: Path) -> None:
    """A fresh model's estimate is exactly 0 (its output layer starts at 0): R^2 0, no
    leakage. An estimator that returns the true non-speech part's change gives R^2 1."""
    ckpt = Checkpointed(tiny_model(), [p.name for p in sorted(data.glob("t15.*"))], AugmentConfig())
    zero = separation_report(ckpt, data)
    assert set(zero) == {*ckpt.sessions, "all"} and zero["all"].trials == SESSIONS
    assert all(r.r2 == 0.0 and r.leakage == 0.0 for r in zero.values())
    assert all(0.0 < r.clean_per and 0.0 < r.noisy_per for r in zero.values())

    with h5py.File(data / "ground_truth.hdf5") as truth:
        nonspeech = [truth[f"{s}/val/trial_0000/nonspeech"][()] for s in ckpt.sessions]
    queue = iter(nonspeech)  # the report visits sessions in order, then the file's trials in order

    def oracle(model: NoiseSeparatingDecoder, x: torch.Tensor, day: torch.Tensor) -> torch.Tensor:
        n = torch.from_numpy(next(queue))[None]
        return clean_space(model, x, day) - clean_space(model, x - _smoothed(n, n.shape[1]), day)

    truth_report = separation_report(ckpt, data, estimate=oracle)
    for session, r in truth_report.items():
        assert r.r2 == pytest.approx(1.0, abs=1e-4)
        assert r.leakage == pytest.approx(r.truth_leakage) == pytest.approx(zero[session].truth_leakage)


def test_report_refuses_data_without_ground_truth(tmp_path: Path) -> None:
    ckpt = Checkpointed(tiny_model(), ["t15.2023.08.11"], AugmentConfig())
    with pytest.raises(MissingInput, match="--ground-truth"):
        separation_report(ckpt, tmp_path)
    with pytest.raises(ValueError, match="no reference phonemes"):
        separation_report(ckpt, tmp_path, "test")


def _damaged(data: Path, tmp_path: Path, damage) -> Path:  # noqa: ANN001  # a function of the truth file
    import shutil

    copy = tmp_path / "synth"
    shutil.copytree(data, copy)
    damage(copy / "ground_truth.hdf5")
    return copy


def _drop_session(truth: Path) -> None:
    with h5py.File(truth, "a") as f:
        del f[sorted(f)[1]]


def _wrong_shape(truth: Path) -> None:
    with h5py.File(truth, "a") as f:
        g = f[f"{sorted(f)[0]}/val/trial_0000"]
        del g["speech"]
        g["speech"] = np.zeros((3, 512), np.float32)


def _folder(truth: Path) -> None:
    truth.unlink()
    truth.mkdir()


def _cut_short(truth: Path) -> None:
    truth.write_bytes(truth.read_bytes()[:1000])


@pytest.mark.parametrize("damage, message", [
    (_drop_session, r"ground_truth.hdf5 has no session t15\.\S+, which .*data_val.hdf5 holds"),  # was skipped
    (_wrong_shape, r"ground_truth.hdf5: t15\.\S+/val/trial_0000/speech is shape \[3, 512\], expected the "
                   r"features' shape \[\d+, 512\]"),  # a broadcast traceback, rc 70
    (_folder, r"ground_truth.hdf5 is a folder, not an HDF5 file"),  # "does not exist"
    (_cut_short, r"ground_truth.hdf5: cannot be read as HDF5"),  # "a file:", no path
])
def test_a_ground_truth_that_is_not_this_datasets_is_named(data: Path, tmp_path: Path, damage, message) -> None:  # noqa: ANN001
    copy = _damaged(data, tmp_path, damage)
    ckpt = Checkpointed(tiny_model(), [p.name for p in sorted(copy.glob("t15.*"))], AugmentConfig())
    with pytest.raises(DatasetError, match=message):
        separation_report(ckpt, copy)


def _data_file(data: Path, tmp_path: Path, edit) -> tuple[Path, Path]:  # noqa: ANN001  # edit(h5py.File)
    import shutil

    copy = tmp_path / "synth"
    shutil.copytree(data, copy)
    path = sorted(copy.glob("t15.*"))[0] / "data_val.hdf5"
    with h5py.File(path, "a") as f:
        edit(f)
    return copy, path


@pytest.mark.parametrize("edit, message", [
    (lambda f: f["trial_0000"].attrs.modify("seq_len", 10**6), r"trial_0000 has seq_len 1000000, not a count of its"),
    (lambda f: f["trial_0000"].attrs.__delitem__("seq_len"), r"trial_0000 has seq_len None"),  # a KeyError, exit 70
    (lambda f: f["trial_0000"].__delitem__("input_features"), r"trial_0000 lacks input_features"),
])
def test_a_data_file_that_is_not_b2t_synths_is_named_with_its_trial(data: Path, tmp_path: Path, edit, message) -> None:  # noqa: ANN001
    """seq_len 10**6 counted the padding as reference (exit 0, a wrong PER); the others were tracebacks."""
    copy, path = _data_file(data, tmp_path, edit)
    ckpt = Checkpointed(tiny_model(), [p.name for p in sorted(copy.glob("t15.*"))], AugmentConfig())
    with pytest.raises(DatasetError, match=rf"{path}: {message}"):
        separation_report(ckpt, copy)


def test_zero_estimate_ablation_holds_the_estimate_at_zero() -> None:
    model = tiny_model(zero_noise_estimate=True)
    with torch.no_grad():
        model.noise.out.bias.fill_(1.0)  # a NoiseModel that would estimate something
    x = torch.randn(1, 40, 512)
    day = torch.zeros(1, dtype=torch.int32)
    from b2t.separation import noise_estimate

    assert torch.equal(noise_estimate(model, x, day), torch.zeros(1, 7, 14 * 512))
    plain = tiny_model()
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        plain.noise.out.bias.zero_()
    torch.testing.assert_close(model(x, day)["clean"], plain(x, day)["clean"])


def test_a_report_of_data_without_non_speech_says_why_its_figures_are_nan(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """b2t-synth's defaults write no non-speech part: the table printed nan without a word."""
    from click.testing import CliRunner

    import b2t.separation as separation
    from b2t.cli.separation import separation_main
    from b2t.separation import Tally

    monkeypatch.setattr(separation, "load_model", lambda path: None)
    monkeypatch.setattr(separation, "separation_report", lambda ckpt, data, split: {"all": Tally().result()})
    (tmp_path / "c.safetensors").write_bytes(b"")
    result = CliRunner().invoke(separation_main, [str(tmp_path / "c.safetensors"), str(tmp_path)])
    assert result.exit_code == 0 and "| all | 0 | nan |" in result.output, result.output
    assert "non-speech part is zero in every trial" in result.output and "--structured-noise-rank" in result.output
