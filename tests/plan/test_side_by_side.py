"""b2t.plan.side_by_side: `b2t-plan --target` compiles its graphs side by side, with the same verdicts
as one after the other, and says what each concurrent compile costs in host memory."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from b2t.cli.plan import plan_main
from b2t.cli.train import train_main
from b2t.engine.concurrent_compiles import HostMemory, default_jobs, resident_bytes
from b2t.plan.side_by_side import compile_all
from b2t.plan.targets import parse_target

REPO = Path(__file__).resolve().parents[2]
GiB = 1024**3


def test_the_memory_of_each_concurrent_compile_is_the_peak_over_the_start_per_compile():
    m = HostMemory(before=2 * GiB, peak=5 * GiB, most_at_once=3)
    assert m.per_compile == GiB
    assert HostMemory(before=2 * GiB, peak=GiB, most_at_once=0).per_compile == 0  # never negative, never / 0
    assert default_jobs() >= 1 and resident_bytes() > 0


def test_the_report_line_gives_wall_time_against_the_sum_and_memory_per_compile():
    from b2t.plan.check import format_side_by_side
    from tests.plan.test_compile import _checked

    results = [_checked("train", 254, 16, None), _checked("eval", 254, 16, None)]  # 12.5 s each
    line = format_side_by_side(results, HostMemory(before=GiB, peak=3 * GiB, most_at_once=2), 13.0, 8)
    assert line.startswith("side by side: 2 steps, up to 2 at once (--jobs 8): 13 s of wall time for 25 s of compiling")
    assert "host memory 1.0 GiB before, peak 3.0 GiB with 2 at once, about 1.00 GiB per concurrent compile" in line


def test_no_jobs_is_refused():
    with pytest.raises(ValueError, match="--jobs must be at least 1"):
        compile_all(parse_target("v5e-1"), [], 0, print)


def test_jobs_is_a_target_option_of_b2t_plan_and_at_least_one(tmp_path):
    r = CliRunner().invoke(plan_main, ["--jobs", "2"])
    assert r.exit_code == 2 and "--fit and --jobs go with --target SLICE" in r.output
    r = CliRunner().invoke(train_main, [str(tmp_path), str(tmp_path / "run"), "--jobs", "2"])
    assert r.exit_code == 2 and "No such option '--jobs'" in r.output, "planning is b2t-plan's"
    r = CliRunner().invoke(plan_main, ["--target", "v5e-1", "--jobs", "0"])
    assert r.exit_code == 2 and "--jobs" in r.output and "0" in r.output


def test_graphs_compiled_side_by_side_get_the_verdicts_they_get_one_after_the_other():
    out = subprocess.run([sys.executable, str(REPO / "tests/plan/_side_by_side_probe.py")], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["fits"] == [True, True] and r["together"] == r["alone"]
    assert r["most_at_once"] == 2 and r["peak"] >= r["before"] > 0
    assert r["lines"][0] == "compiling 2 steps for v5e-1, 2 at a time"
    done = sorted(line.split(":")[0] for line in r["lines"][1:] if line.startswith("compiled "))
    assert done == ["compiled the eval step of bucket T=64 B=4", "compiled the train step of bucket T=64 B=4"]
    assert sorted(line for line in r["lines"][1:] if line.startswith("compiling ")) == [
        "compiling 1/2: the train step of bucket T=64 B=4", "compiling 2/2: the eval step of bucket T=64 B=4"]
