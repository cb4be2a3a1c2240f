"""``python -m benchmarks.run --smoke`` for the parts that need only the main venv, so the benchmark code does not
rot: our trainer rows (TRL side skipped), the driver-overhead rows and the decode-loop rollout row (vLLM skipped) at
tiny sizes; checks results.json's schema.

About 60 s on an idle 2-core machine (six short trainer processes); the timeout leaves room for a busy one."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROW_KEYS = {"name", "unit", "ours", "baseline", "ratio", "ours_min", "ours_max", "baseline_min", "baseline_max",
            "ratio_min", "ratio_max", "repetitions", "note", "group", "raw"}


@pytest.mark.timeout(420)
@pytest.mark.slow
@pytest.mark.bench_smoke  # make test-bench, not CI: the decode loop's equality with generate is tests/verl_core's
def test_smoke_run_writes_results_schema(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "benchmarks.run", "--smoke", "--skip-trl", "--skip-vllm", "--only", "trainer",
            "overhead", "rollout", "--out", str(tmp_path)]
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "results.json").read_text())
    assert not doc["meta"]["errors"]
    rows = doc["rows"]
    names = [r["name"] for r in rows]
    assert any(n.startswith("ppo_1x1: response tokens/s") for n in names), names
    assert any(n.startswith("grpo: response tokens/s") for n in names), names
    assert any(n.startswith("spawn -> first metric line") for n in names), names
    decode = next(r for r in rows if r["name"] == "rollout on CPU: our decode loop vs HF generate")
    assert decode["baseline"] > 0 and decode["raw"]["greedy_tokens_equal"] is True
    for r in rows:
        assert ROW_KEYS <= set(r), set(r) ^ ROW_KEYS
        if r["note"].startswith("skipped:"):  # vLLM (--skip-vllm) and GPU rows say why they did not run
            assert r["ours"] is None and r["ratio"] is None
            continue
        assert isinstance(r["ours"], float) and math.isfinite(r["ours"]) and r["ours"] > 0 or r["unit"] == "%", r
        assert r["ours_min"] <= r["ours"] <= r["ours_max"], r
        if r["baseline"] is None:
            assert r["ratio"] is None
        else:
            assert r["ratio"] is not None and r["ratio"] > 0
    trainer_rows = [r for r in rows if r["group"].startswith("trainer")]
    assert all(r["baseline"] is None and "TRL skipped" in r["note"] for r in trainer_rows)
    md = (tmp_path / "RESULTS.md").read_text()
    assert "| metric | unit | ours | baseline | ratio |" in md and "## versions" in md and "## commands" in md
    # the real results are never overwritten by a smoke run
    assert not (REPO / "benchmarks" / "results.json").exists() or \
        json.loads((REPO / "benchmarks" / "results.json").read_text())["meta"]["smoke"] is False
