"""What the preprocessor knows about one trial before it reads the features again to write.

Scanning validates every trial (features included) and keeps only this small record, so
batching 10k+ trials needs megabytes, not the ~13 GB the f32 features would take; the
writer re-reads each batch's features from HDF5 when it writes that batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from b2t.errors import B2tError


class DataError(B2tError, ValueError):
    """Bad input data; the message names the file, the trial group and the problem."""

    def __init__(self, file: str, trial: str | None, problem: str):
        self.file, self.trial, self.problem = str(file), trial, problem
        where = f"{self.file}: {trial}" if trial else self.file
        super().__init__(f"{where}: {problem}")

    def __reduce__(self):  # rebuilt intact when raised in a worker process
        return (DataError, (self.file, self.trial, self.problem))


@dataclass(frozen=True)
class TrialRef:
    file: str  # path of the HDF5 file the trial lives in
    group: str  # its group name, e.g. "trial_0007"
    split: str  # train | val | test
    session: str  # e.g. "t15.2023.08.13"
    day_index: int  # position of the session in the sorted session list
    block: int
    trial: int
    n_time_steps: int
    labels: tuple[int, ...]  # phoneme ids 1..40 (empty for test trials)
    sentence: str | None  # the sentence label (None for test trials)
