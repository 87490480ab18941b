"""What `b2t-preprocess verify` checks beyond the contract (preprocess.verify.batch_problems)."""

from __future__ import annotations

import torch

from b2t.contract import BucketShape, RowMeta, empty_batch
from preprocess.verify import batch_problems


def test_batch_problems_catch_what_the_contract_cannot():
    shape = BucketShape(T=18, B=2, L=8)
    batch = empty_batch(shape)
    batch["valid"][0], batch["n_time_steps"][0], batch["phone_seq_lens"][0] = True, 10, 2
    batch["seq_class_ids"][0, :2] = torch.tensor([3, 40], dtype=torch.int32)
    row = RowMeta(session="t15.2023.08.11", block=1, trial=0, group="trial_0000",
                  file="t15.2023.08.11/data_train.hdf5", sentence="hi")
    meta = {"rows": [row, None]}
    assert batch_problems(batch, meta, shape, n_sessions=1) == []
    assert batch_problems(batch, {"rows": [{"group": "trial_0000"}, None]}, shape, n_sessions=1) == [
        "meta row 0 has keys ['group'], the contract says "
        "['block', 'file', 'group', 'sentence', 'session', 'trial']"]
    assert batch_problems(batch, {"rows": [None, row]}, shape, n_sessions=1) == [
        "meta rows disagree with the valid mask"]
    batch["features"][0, 12, 5] = 1.0  # beyond the row's 10 bins
    batch["day_indices"][1] = 3
    problems = batch_problems(batch, meta, shape, n_sessions=1)
    assert any("beyond a row's n_time_steps" in p for p in problems)
    assert any("row 1: day index 3 outside 0..0" in p for p in problems)


def test_batch_problems_catch_non_finite_features():
    shape = BucketShape(T=18, B=2, L=8)
    batch = empty_batch(shape)
    batch["valid"][0], batch["n_time_steps"][0], batch["phone_seq_lens"][0] = True, 10, 2
    batch["seq_class_ids"][0, :2] = torch.tensor([3, 40], dtype=torch.int32)
    batch["features"][0, 4, 7] = float("inf")
    row = RowMeta(session="t15.2023.08.11", block=1, trial=0, group="trial_0000",
                  file="t15.2023.08.11/data_train.hdf5", sentence="hi")
    assert batch_problems(batch, {"rows": [row, None]}, shape, n_sessions=1) == [
        "features are NaN/Inf at row 0, bin 4, channel 7"]
