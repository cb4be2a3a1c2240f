"""Helpers for the driver tests: run the CLI in a subprocess, write experiment files, read studies."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `hpo` and `tests.hpo.conftest` importable however pytest is started
    sys.path.insert(0, str(ROOT))
FAKE_TRAINER = Path(__file__).with_name("fake_trainer.py")
PY = sys.executable


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def run_cli(args: list[str], studies: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m hpo ARGS --studies-dir STUDIES`` from the repo root."""
    return subprocess.run([PY, "-m", "hpo", *args, "--studies-dir", str(studies)], cwd=ROOT, env=cli_env(**env),
                          capture_output=True, text=True, timeout=timeout)


def fake_space(tmp_path: Path, name: str = "fake", **sections: Any) -> Path:
    """An experiment file driving tests/hpo/fake_trainer.py; ``sections`` replace/extend the defaults."""
    space: dict[str, Any] = {
        "config": "tiny_arith",
        "overrides": {"trainer.total_training_steps": 10, "trainer.test_freq": 2, "fake.step_s": 0.02},
        "params": {"x": {"key": "fake.x", "type": "float", "low": 0.0, "high": 1.0}},
        "objective": {"metric": "eval/reward_mean", "direction": "maximize"},
        "early_stopping": {"enabled": False},
        "study": {"n_trials": 3, "pruner": {"type": "none"}, "heartbeat_interval": 1, "grace_period": 3},
        "trial": {"command": [PY, str(FAKE_TRAINER), "train"]},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(space.get(key), dict):
            space[key] = {**space[key], **value}
        else:
            space[key] = value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def load(studies: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{studies / (name + '.db')}")


@pytest.fixture
def studies(tmp_path: Path) -> Path:
    return tmp_path / "studies"
