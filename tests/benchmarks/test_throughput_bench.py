"""``python -m benchmarks.throughput --smoke --only verl_core`` (throughput_cpu, 2 trials of 3 steps, 1 re-measurement):
the search and the confirmation run through the real CLI and the row comes out,
so the benchmark does not rot. ~2-4 min on 2 cores: slow. How much faster the pick is, is ``make bench``'s to say
(benchmarks/RESULTS.md): a speed ratio is not asserted here (a busy host measured 0.4x on one pair)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.bench_smoke  # make test-bench, not CI: a throughput study's path is tests/hpo/reporting/test_speed.py's
def test_throughput_smoke_compares_the_pick_with_both_configs(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.throughput", "--smoke", "--only", "verl_core",
                           "--workdir", str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(proc.stdout.strip().splitlines()[-1])["rows"]}
    (poor,) = rows.values()  # --smoke: the pick against the poor start only
    assert poor["name"] == ("throughput study's pick vs a deliberately poor start (the experiment's study.baseline), "
                            "verl_core (tiny_arith)")
    report = poor["raw"]["report"]  # a ratio measured from real pairs, and the pick does the same math as the start
    assert poor["ours"] > 0 and report["pairs"] and report["same_math"] is True and report["search_trials"] == 2, poor
    assert "same math: agrees" in poor["note"] and "interleaved pair(s)" in poor["note"], poor["note"]
    assert (tmp_path / "studies" / "throughput_cpu.db").is_file()
