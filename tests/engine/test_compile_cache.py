"""--compile-cache: torch_xla's persistent compilation cache writes an entry per compiled graph
(the CPU runtime cannot load them back, so there a second run compiles again, to the same
numbers; TPU and GPU runtimes load them)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

_ONE_GRAPH = """
import sys, torch, torch_xla
from b2t.engine.devices import use_compile_cache
use_compile_cache(sys.argv[1])
x = torch.arange(12.0).reshape(3, 4).to(torch_xla.device())
print(float((x @ x.T).sum().cpu()))
"""


def test_the_cache_directory_gets_an_entry_per_compiled_graph(tmp_path):
    cache = tmp_path / "cache"
    out = subprocess.run([sys.executable, "-c", _ONE_GRAPH, str(cache)], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "PJRT_DEVICE": "CPU", "PYTHONPATH": str(REPO)}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "1134.0"
    entries = [p for p in cache.rglob("*") if p.is_file()]
    assert len(entries) == 1 and entries[0].stat().st_size > 0


def _train(shards: Path, run: Path, cache: Path) -> dict:
    b2t_train = str(Path(sys.executable).parent / "b2t-train")
    out = subprocess.run([b2t_train, str(shards), str(run), "--config", "configs/tiny.yaml",
                          "--backend", "xla", "--set", "train.steps=4", "--set", "train.val_every=4",
                          "--set", "train.log_every=2", "--compile-cache", str(cache), "--no-progress"],
                         cwd=REPO, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PJRT_DEVICE": "CPU", "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in records if r.get("kind") == "summary")


@pytest.mark.slow
def test_a_second_run_with_the_cache_trains_identically(tiny_dataset, tmp_path):
    _, shards = tiny_dataset
    first = _train(shards, tmp_path / "a", tmp_path / "cache")
    entries = len([p for p in (tmp_path / "cache").rglob("*") if p.is_file()])
    assert entries >= first["warm_up"]["compilations"] > 0
    second = _train(shards, tmp_path / "b", tmp_path / "cache")
    assert second["weights_sha256"] == first["weights_sha256"]
