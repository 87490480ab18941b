"""Checkpoint ensembles (b2t.ensemble): log-probabilities averaged frame by frame, members that
cannot be averaged refused by name before any model runs, each member compiled once per
bucket on XLA, and `b2t-eval CKPT CKPT DATASET` end to end."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from b2t.data.dataset import Dataset
from b2t.data.manifest import Manifest
from b2t.decoding import summarize
from b2t.ensemble import check_members, combine, evaluate_checkpoints
from b2t.model.ctc import ctc_loss
from tests.test_eval_cli import read_lines, run_eval
from tests.test_evaluate import S1, result

if TYPE_CHECKING:
    from tests.fixtures import TrainedRun

pytest_plugins = ["tests.fixtures"]  # `trained_run`, `second_checkpoint`


def edited_copy(path: Path, out: Path, edit) -> Path:
    """`path` with its b2t metadata changed by `edit(meta)` (the tensors unchanged)."""
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["b2t"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    edit(meta)
    save_file(tensors, str(out), metadata={"b2t": json.dumps(meta)})
    return out


def log_softmax(x: np.ndarray) -> np.ndarray:
    return (x - np.logaddexp.reduce(x, axis=-1, keepdims=True)).astype(np.float32)


def test_combine_is_the_normalised_geometric_mean_of_the_members():
    rng = np.random.default_rng(0)
    a, b = log_softmax(rng.normal(0, 3, (6, 41))), log_softmax(rng.normal(0, 3, (6, 41)))
    ref = [3, 40, 5]
    (trial,) = combine([[replace(result(S1, "trial_0000", reference=ref), log_probs=lp)] for lp in (a, b)])
    want = log_softmax((a + b) / 2)
    np.testing.assert_allclose(trial.log_probs, want, atol=1e-5)
    argmax = want.argmax(-1)
    greedy = [int(k) for i, k in enumerate(argmax) if k != 0 and (i == 0 or k != argmax[i - 1])]
    assert trial.decoded_phonemes == greedy
    nll = ctc_loss(torch.from_numpy(want)[None], torch.tensor([ref], dtype=torch.int32),
                   torch.tensor([6], dtype=torch.int32), torch.tensor([3], dtype=torch.int32))
    assert trial.loss == pytest.approx(float(nll[0]), rel=1e-5)


def test_members_that_cannot_be_averaged_are_refused_by_name(trained_run: TrainedRun, tmp_path: Path):
    ckpt = trained_run.checkpoint

    def other_day(meta):
        meta["state"]["sessions"][-1] = "t15.2099.01.01"

    def other_stride(meta):
        meta["state"]["config"]["model"]["patch_stride"] = 2

    days = edited_copy(ckpt, tmp_path / "days.safetensors", other_day)
    with pytest.raises(ValueError, match=rf"{days}.* other sessions than {ckpt}"):
        check_members([ckpt, days])
    stride = edited_copy(ckpt, tmp_path / "stride.safetensors", other_stride)
    with pytest.raises(ValueError, match=rf"{stride} patches with size/stride 14/2, {ckpt} with 14/4"):
        check_members([ckpt, stride])
    with pytest.raises(ValueError, match="listed twice"):
        check_members([ckpt, ckpt])
    code, output = run_eval(ckpt, stride, trained_run.shards, "--split", "val", "--no-progress")
    assert code == 2 and "stride.safetensors patches with size/stride 14/2" in output and "PER" not in output


def test_each_member_compiles_once_per_bucket_on_xla_and_the_ensemble_decodes_as_on_eager(
        trained_run: TrainedRun, second_checkpoint: Path):
    n_buckets = len(Manifest.load(trained_run.shards).buckets)
    members = [trained_run.checkpoint, second_checkpoint]
    results, runs = evaluate_checkpoints(members, Dataset.open(trained_run.shards), "val", backend="xla", device=None,
                                         log_probs=False, progress=False)
    for run in runs:
        count = run.compiles.to_dict()
        print(f"{run.checkpoint}: {count['warm_up']} XLA compilations warming {n_buckets} buckets, "
              f"{count['during_split']} during the split")
        assert count["warm_up"] <= n_buckets and count["during_split"] == 0 and count["fallbacks"] == {}
    assert runs[0].compiles.to_dict()["warm_up"] >= 1  # the first member compiled its graphs (the second may reuse)
    assert all(r.log_probs is None for r in results)
    eager, _ = evaluate_checkpoints(members, Dataset.open(trained_run.shards), "val", backend="eager", device=None,
                                    log_probs=False, progress=False)
    assert [(r.session, r.group) for r in results] == [(r.session, r.group) for r in eager]
    assert abs(summarize(results).per.rate() - summarize(eager).per.rate()) <= 0.03  # bf16 argmax ties


def test_b2t_eval_of_two_checkpoints_reports_the_ensemble_and_its_members(trained_run: TrainedRun,
                                                                        second_checkpoint: Path, tmp_path: Path):
    code, output = run_eval(trained_run.checkpoint, second_checkpoint, trained_run.shards, "--split", "val",
                            "--backend", "eager", "--lexicon", trained_run.lexicon, "--lm", trained_run.lm,
                            "--out", tmp_path, "--no-progress")
    assert code == 0, output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [m["checkpoint"] for m in summary["members"]] == [str(trained_run.checkpoint), str(second_checkpoint)]
    assert f"{trained_run.checkpoint} PER {summary['members'][0]['per']:.4f}" in output
    print(f"val PER: members {[m['per'] for m in summary['members']]}, ensemble {summary['per']}; WER {summary['wer']}")
    assert summary["per"] < 0.5 and summary["wer"] is not None
    trials = read_lines(tmp_path / "trials.jsonl")
    assert len(trials) == summary["n_trials"] and all(t["loss"] > 0 and t["decoded_words"] for t in trials)
