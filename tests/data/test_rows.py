"""The reader's row checks: the fast check of a batch agrees with the detailed one on every batch.

`row_problems` runs the compiled fast check first and the detailed, message-building
look only when it fails; a disagreement would either pass a bad row (fast says fine) or
refuse a good batch with no message (fast says bad, the detail finds nothing).
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from b2t.contract import BucketShape
from b2t.data.rows import _described, _fine, row_problems

FIELDS = ("valid", "n_time_steps", "phone_seq_lens", "seq_class_ids", "day_indices")


@st.composite
def batches(draw):
    """Rows near the contract's edges: mostly good, with values just past each limit."""
    B, L, T = draw(st.integers(1, 5)), draw(st.integers(1, 6)), draw(st.integers(1, 24))
    n_sessions = draw(st.integers(1, 3))
    patching = draw(st.sampled_from([None, (1, 1), (3, 2), (5, 3)]))
    valid = draw(st.lists(st.sampled_from([0, 1, 1, 1, 2]), min_size=B, max_size=B))
    rows = []
    for v in valid:
        k = draw(st.integers(0, L)) if v else 0
        ids = draw(st.lists(st.integers(1, 3), min_size=k, max_size=k)) + [0] * (L - k)  # repeats likely
        n = draw(st.integers(1, T)) if v else 0
        rows.append([n, k, draw(st.integers(0, n_sessions - 1)), ids])
    for _ in range(draw(st.integers(0, 2))):  # a few values off the contract
        r, field = draw(st.integers(0, B - 1)), draw(st.integers(0, 3))
        if field == 3:
            rows[r][3][draw(st.integers(0, L - 1))] = draw(st.sampled_from([-1, 0, 41, 2**31 - 1]))
        else:
            limit = (T, L, n_sessions - 1)[field]
            rows[r][field] = draw(st.sampled_from([-(2**31), -1, 0, limit, limit + 1]))
    tensors = {
        "valid": torch.tensor(valid, dtype=torch.uint8).view(torch.bool),
        "n_time_steps": torch.tensor([r[0] for r in rows], dtype=torch.int32),
        "phone_seq_lens": torch.tensor([r[1] for r in rows], dtype=torch.int32),
        "day_indices": torch.tensor([r[2] for r in rows], dtype=torch.int32),
        "seq_class_ids": torch.tensor([r[3] for r in rows], dtype=torch.int32),
    }
    return tensors, BucketShape(T=T, B=B, L=L), n_sessions, patching


@settings(max_examples=400)
@given(batches())
def test_the_fast_check_agrees_with_the_detailed_one(batch):
    tensors, shape, n_sessions, patching = batch
    arrays = [tensors[name].numpy() for name in FIELDS]
    fine = _fine(*arrays, shape, n_sessions, patching)
    problems = _described(*arrays, shape, n_sessions, patching)
    assert fine == (problems == []), problems


def test_a_valid_flag_byte_that_is_not_a_bool_is_refused():
    """torch reads a bool byte 2 as True on the CPU; what other devices make of it is undefined."""
    shape = BucketShape(T=20, B=2, L=3)
    tensors = {"valid": torch.tensor([1, 2], dtype=torch.uint8).view(torch.bool),
               "n_time_steps": torch.tensor([20, 20], dtype=torch.int32),
               "phone_seq_lens": torch.tensor([2, 2], dtype=torch.int32),
               "day_indices": torch.tensor([0, 0], dtype=torch.int32),
               "seq_class_ids": torch.tensor([[4, 5, 0], [4, 5, 0]], dtype=torch.int32)}
    assert row_problems(tensors, shape, 1, (5, 3)) == ["row 1: valid flag byte 2 is not a bool (0 or 1)"]
    tensors["valid"].view(torch.uint8)[1] = 1
    assert row_problems(tensors, shape, 1, (5, 3)) == []


def test_ctc_counts_repeats_exactly_at_the_bound():
    """3 labels with 1 repeat need 4 frames: 4 are enough, 3 are not (a full row, k = L, included)."""
    shape = BucketShape(T=20, B=1, L=3)
    tensors = {"valid": torch.tensor([True]), "phone_seq_lens": torch.tensor([3], dtype=torch.int32),
               "day_indices": torch.tensor([0], dtype=torch.int32),
               "seq_class_ids": torch.tensor([[7, 7, 9]], dtype=torch.int32)}
    assert row_problems({**tensors, "n_time_steps": torch.tensor([4], dtype=torch.int32)}, shape, 1, (1, 1)) == []
    assert row_problems({**tensors, "n_time_steps": torch.tensor([3], dtype=torch.int32)}, shape, 1, (1, 1)) == [
        "row 0: 3 labels (1 repeats) need 4 CTC frames, its 3 bins make 3 (patches 1/1)"]
