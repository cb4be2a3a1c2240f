"""``benchmarks/gpu_check.py --dry-run``: the GPU plan on CPU with the tiny model prints its one table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
def test_dry_run_prints_the_table(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--dry-run", "--json", str(out)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=880)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(out.read_text())}
    names = ["device", "train (grad checkpointing, fp32)", "memory estimate", "rollout vLLM vs HF",
             "checkpoint resume", "4-bit reward model"]
    assert list(rows) == names
    for name in ("device", "train (grad checkpointing, fp32)", "memory estimate", "checkpoint resume"):
        assert rows[name]["status"] == "ok", rows[name]
    assert rows["4-bit reward model"]["status"] == "skipped" and "CUDA" in rows["4-bit reward model"]["detail"]
    assert rows["rollout vLLM vs HF"]["status"] in ("ok", "skipped")
    assert "ratio" in rows["memory estimate"]["detail"] and "resumed at step 2" in rows["checkpoint resume"]["detail"]
    table = proc.stdout
    assert "gpu-check: DRY RUN on CPU" in table and all(n in table for n in names)


def test_steps_below_two_is_an_error() -> None:
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--dry-run", "--steps", "1"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == "error: --steps 1: the resume check needs at least 2"
