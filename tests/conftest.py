"""Shared fixtures: the locally built tiny model and a helper to run the trainer CLI for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The built-in tiny_arith model (built once per machine, then cached)."""
    from verl_core.tiny_model import ensure_tiny_arith

    return ensure_tiny_arith(log=False)


def run_trainer(args: list[str], tmp: Path, timeout: float = 600, env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "verl_core", *args], cwd=tmp, capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def eval_curve(rows: list[dict[str, Any]], key: str = "eval/reward_mean") -> dict[int, float]:
    return {r["step"]: r["data"][key] for r in rows if key in r["data"]}
