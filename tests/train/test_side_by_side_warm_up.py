"""openxla's warm-up with its graphs compiled side by side (`b2t-train --compile-jobs`,
b2t.engine.concurrent_compiles): the graphs it compiles at once are exactly the ones the steps
then run. Each run is a fresh process: torch_xla's compilation cache is per process, and a
graph an earlier test compiled would not be compiled, nor counted, again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TIMING = {"time", "elapsed_s", "seconds", "steps_per_s"}


def _train(shards: Path, run: Path, jobs: int, steps: int) -> list[dict]:
    b2t_train = str(Path(sys.executable).parent / "b2t-train")
    out = subprocess.run([b2t_train, str(shards), str(run), "--config", "configs/tiny.yaml", "--backend", "openxla",
                          "--set", f"train.steps={steps}", "--set", f"train.val_every={steps}",
                          "--set", f"train.log_every={steps // 2}", "--compile-jobs", str(jobs), "--no-progress"],
                         cwd=REPO, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _kind(records: list[dict], kind: str) -> list[dict]:
    return [r for r in records if r["kind"] == kind]


def test_graphs_compiled_side_by_side_are_the_ones_the_steps_run(tiny_dataset, tmp_path):
    """Per bucket the train forward, its backward and the eval graph compile two at a time; the
    steps of every bucket then compile the one update graph, and no step after the warm-up
    compiles anything: 3 graphs a bucket and 1 more, as one after another (test_loop)."""
    _, shards = tiny_dataset
    records = _train(shards, tmp_path / "run", jobs=2, steps=6)
    (warm,) = _kind(records, "compile")
    pieces = sorted(_kind(records, "compiled"), key=lambda p: p["index"])  # logged as their compiles end
    assert [p["piece"].split(",")[0] for p in pieces if p["piece"] != "steps of every bucket"] == \
        ["train step", "eval step"] * 3, "each bucket's train and eval piece, numbered in the order traced"
    assert [p["index"] for p in pieces] == list(range(1, 8)) and {p["of"] for p in pieces} == {7}
    assert sorted(p["graphs"] for p in pieces) == [1, 1, 1, 1, 2, 2, 2]
    assert [p["graphs"] for p in pieces if p["piece"] == "steps of every bucket"] == [1], "the update, once"
    assert warm["compilations"] == 3 * 3 + 1
    assert warm["compiles_at_once"] == 2, "two graphs were compiling at the same time"
    assert [r["compilations"] for r in _kind(records, "train")] == [warm["compilations"]] * 2, "none after"
    (summary,) = _kind(records, "summary")
    assert summary["final"]["compilations"] == warm["compilations"]


@pytest.mark.slow
def test_side_by_side_compiles_train_to_the_same_numbers_as_one_after_another(tiny_dataset, tmp_path):
    """The executables compiled side by side are the ones compiled in turn: every train and val
    record the same to the last digit (a stand-in that gave two graph inputs one buffer once made
    every gradient NaN: `private_api.bridge_compiles_handed_off`)."""
    _, shards = tiny_dataset

    def results(jobs: int) -> list[dict]:
        records = _train(shards, tmp_path / f"jobs{jobs}", jobs=jobs, steps=12)
        return [{k: v for k, v in r.items() if k not in TIMING} for r in records if r["kind"] in ("train", "val")]

    ahead, in_turn = results(2), results(0)
    assert len(ahead) == 3 and ahead == in_turn


def test_a_compile_that_fails_beside_the_trace_names_its_piece(tiny_dataset, tmp_path, monkeypatch):
    """A TPU compile that runs out of memory fails in its job's thread; the run stops with the
    trainer's out-of-memory line naming the piece whose graph it was, before any step."""
    import torch_xla

    from b2t.config import TINY_CONFIG, load_config
    from b2t.train.loop import RunOptions, TrainingError, train

    def out_of_memory(tensors, devices):
        raise RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm")

    monkeypatch.setattr(torch_xla._XLAC, "_xla_warm_up_cache", out_of_memory)
    _, shards = tiny_dataset
    # graphs of their own (n_units): a graph another test of this process compiled is found in XLA's
    # cache and never reaches the compile that fails
    cfg = load_config(TINY_CONFIG, ["train.backend=openxla", "train.steps=2", "model.gru.n_units=24"])
    with pytest.raises(TrainingError, match=r"^out of memory in the warm-up's train step, bucket T=\d+ B=\d+ "
                                            r"\(RESOURCE_EXHAUSTED: Ran out of memory"):
        train(shards, tmp_path / "run", cfg, RunOptions(progress=False, compile_jobs=2))
    assert not (tmp_path / "run" / "last.safetensors").exists()
