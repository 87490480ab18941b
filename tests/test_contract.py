"""The batch contract (b2t.contract): fields, shapes and dtypes, meta rows, trial order."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from b2t.contract import (
    FEATURE_DTYPE,
    FIELDS,
    INDEX_DTYPE,
    ROW_META_KEYS,
    Batch,
    BucketShape,
    RowMeta,
    check_batch,
    check_rows,
    empty_batch,
    trial_number,
)


@given(T=st.integers(1, 64), B=st.integers(1, 8), L=st.integers(1, 16))
def test_empty_batch_is_all_padding_in_the_contract_dtypes(T, B, L):
    shape = BucketShape(T=T, B=B, L=L)
    batch = empty_batch(shape)
    check_batch(batch, shape)
    assert batch["features"].dtype == FEATURE_DTYPE and batch["features"].shape == (B, T, 512)
    assert {batch[k].dtype for k in ("n_time_steps", "seq_class_ids", "phone_seq_lens", "day_indices")} == {INDEX_DTYPE}
    assert not batch["valid"].any()
    assert BucketShape.from_dict(shape.to_dict()) == shape


def test_check_batch_names_the_field_and_both_specs():
    shape = BucketShape(T=20, B=2, L=8)
    batch = empty_batch(shape)
    batch["day_indices"] = batch["day_indices"].long()
    with pytest.raises(ValueError, match=r"'day_indices' is torch.int64 \(2,\), the contract .* torch.int32 \(2,\)"):
        check_batch(batch, shape)
    with pytest.raises(ValueError, match=r"missing \['valid'\], extra \['x'\]"):
        check_batch({**{k: v for k, v in empty_batch(shape).items() if k != "valid"}, "x": torch.zeros(1)}, shape)
    assert set(FIELDS) == set(empty_batch(shape))


def test_meta_rows_follow_the_valid_mask_and_carry_every_key():
    row = RowMeta(session="t15.2023.08.11", block=1, trial=3, group="trial_0003", file="f.hdf5", sentence=None)
    assert set(row) == ROW_META_KEYS
    check_rows([row, None], torch.tensor([True, False]))
    with pytest.raises(ValueError, match="disagree with the valid mask"):
        check_rows([row, None], torch.tensor([True, True]))
    with pytest.raises(ValueError, match=r"meta row 0 has keys \['group'\]"):
        check_rows([{"group": "trial_0003"}], torch.tensor([True]))


def test_trial_number_orders_groups_numerically():
    names = ["trial_10000", "trial_0002", "trial_9999", "trial_0000"]
    assert sorted(names, key=trial_number) == ["trial_0000", "trial_0002", "trial_9999", "trial_10000"]
    with pytest.raises(ValueError, match="not a trial group name"):
        trial_number("block_1")


def test_batch_moves_its_tensors_and_keeps_bucket_and_meta():
    batch = Batch(2, empty_batch(BucketShape(T=16, B=1, L=8)), {"rows": [None]})
    moved = batch.to(torch.device("meta"))
    assert moved.bucket == 2 and moved.meta is batch.meta
    assert {t.device.type for t in moved.tensors.values()} == {"meta"}
