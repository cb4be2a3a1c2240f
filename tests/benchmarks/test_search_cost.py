"""``python -m benchmarks.search_cost --smoke`` (kl_lr, one seed, 3 trials of 4 steps): both methods run through the
real CLI and the rows come out, so the benchmark does not rot. ~90 s on 2 cores: slow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


# make test-bench, not CI (200-330 s there): racing, confirmation and baseline reuse are tested in tests/hpo/study
@pytest.mark.slow
@pytest.mark.bench_smoke
def test_search_cost_smoke_runs_both_methods(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.search_cost", "--smoke", "--space", "kl_lr",
                           "--workdir", str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = {r["name"]: r for r in doc["rows"]}
    cost = rows["search cost: full-run equivalents to a confirmed pick (search + confirmation), kl_lr"]
    assert cost["ours"] > 0 and cost["baseline"] > 0
    today, racing = doc["details"]["kl_lr/today/0"], doc["details"]["kl_lr/racing/0"]
    assert today["race"] is None and racing["race"] is not None and racing["race"]["end"] is not None
    assert racing["baseline_steps_run"] == 0  # today's study kept the baseline's runs for this host
    assert today["confirm_runs"] == 3 * 2 + 2  # top 3 x 2 seeds + the baseline (smoke)
    assert "confirmed pick's held-out test value, racing vs today, kl_lr" in rows
    assert (tmp_path / "studies" / ".baselines").is_dir()
