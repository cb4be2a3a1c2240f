"""Shared fixtures: the locally built tiny model and a helper to run the trainer CLI for real; how make test-slow's
two heavy runs share the ``cpu_heavy_late`` tests."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
# make test-slow's two heavy runs (Makefile, .ci/run) share a directory of claims here: the first takes the
# cpu_heavy_late tests last, the second (started once the lighter slow tests have ended) only those, and each test runs
# in the run that reaches it first, on whichever machine's run is the shorter
HEAVY_CLAIMS = "VERL_HPO_HEAVY_CLAIMS"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(HEAVY_CLAIMS):  # stable: every other test keeps its place
        items.sort(key=lambda item: item.get_closest_marker("cpu_heavy_late") is not None)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    claims = os.environ.get(HEAVY_CLAIMS)
    if claims and item.get_closest_marker("cpu_heavy_late") is not None:
        claim = Path(claims) / hashlib.sha256(item.nodeid.encode()).hexdigest()[:24]
        try:
            os.close(os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            pytest.skip("the other heavy run of make test-slow took it")


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
