"""Greedy CTC decoding and error rates, shared by training validation and evaluation.

The argmax over classes runs on the device; what reaches the host is a small (B, P) int
array of frame ids plus lengths. Error rates aggregate as the competition scores them:
total edits over total reference length (not a mean of per-trial rates), per group
(session) and overall. WER reuses the same accumulator on word lists (`b2t.text.words_of`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from rapidfuzz.distance import Levenshtein

from b2t.phonemes import BLANK_ID


def _host_ints(x: torch.Tensor | np.ndarray | Sequence[int]) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.int64)


def greedy_decode(frame_ids: torch.Tensor | np.ndarray,
                  lengths: torch.Tensor | np.ndarray | Sequence[int]) -> list[list[int]]:
    """Per row b of (B, P) argmax ids: the first lengths[b] frames, repeats merged, blanks dropped.

    Merging happens before blank removal, so a blank between two equal ids keeps both.
    """
    ids, lens = _host_ints(frame_ids), _host_ints(lengths)
    if ids.ndim != 2 or lens.shape != (ids.shape[0],):
        raise ValueError(f"expected frame ids (B, P) and lengths (B,), got {ids.shape} and {lens.shape}")
    out = []
    for row, n in zip(ids, lens):
        frames = row[: max(int(n), 0)]
        starts = np.ones(len(frames), dtype=bool)
        starts[1:] = frames[1:] != frames[:-1]  # first frame of each run
        kept = frames[starts]
        out.append(kept[kept != BLANK_ID].tolist())
    return out


def edit_distance(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    """Levenshtein distance (insertions, deletions, substitutions, each costing 1)."""
    return int(Levenshtein.distance(list(a), list(b)))


@dataclass
class _Tally:
    edits: int = 0
    ref_len: int = 0
    count: int = 0

    def rate(self) -> float:
        return self.edits / self.ref_len if self.ref_len else float("nan")


class ErrorRate:
    """Accumulates edit distances per group; rates are total edits / total reference length."""

    def __init__(self) -> None:
        self._groups: dict[str, _Tally] = {}

    def add(self, group: str, hyp: Sequence[Hashable], ref: Sequence[Hashable]) -> int:
        """Score one hypothesis against its reference; returns its edit distance."""
        d = edit_distance(hyp, ref)
        t = self._groups.setdefault(group, _Tally())
        t.edits += d
        t.ref_len += len(ref)
        t.count += 1
        return d

    def _total(self) -> _Tally:
        t = _Tally()
        for g in self._groups.values():
            t.edits, t.ref_len, t.count = t.edits + g.edits, t.ref_len + g.ref_len, t.count + g.count
        return t

    def rate(self, group: str | None = None) -> float:
        """Rate of one group, or the aggregate over all groups (NaN with no reference symbols)."""
        if group is None:
            return self._total().rate()
        if group not in self._groups:
            raise KeyError(f"no results for group {group!r}; groups: {sorted(self._groups)}")
        return self._groups[group].rate()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: aggregate and per-group rate (None without reference symbols), edits,
        reference length and trial count."""
        def row(t: _Tally) -> dict[str, Any]:
            rate = t.rate() if t.ref_len else None  # JSON has no NaN
            return {"rate": rate, "edits": t.edits, "ref_len": t.ref_len, "count": t.count}
        return {"all": row(self._total()), "groups": {g: row(t) for g, t in sorted(self._groups.items())}}

    def table(self, name: str = "rate") -> str:
        """A fixed-width text table: one line per group (sorted), then the aggregate."""
        d = self.to_dict()
        width = max([len("all"), len("group"), *map(len, d["groups"])])
        lines = [f"{'group':<{width}}  {name:>8}  {'edits':>8}  {'ref_len':>8}  {'count':>6}"]
        for g, r in [*d["groups"].items(), ("all", d["all"])]:
            rate = "n/a" if r["rate"] is None else f"{r['rate']:.4f}"
            lines.append(f"{g:<{width}}  {rate:>8}  {r['edits']:>8d}  {r['ref_len']:>8d}  {r['count']:>6d}")
        return "\n".join(lines)
