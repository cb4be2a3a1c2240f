"""A TRL experiment's mistakes named by their real cause (issue 44 item 10), from a directory of the user's own:
an interpreter that is not one, a key whose value breaks GRPOConfig, and the experiment's own config file found
beside it when the experiment is given by its absolute path. One line, exit 2, no study."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.hpo.conftest import cli_env

SPACE = Path(__file__).resolve().parents[4] / "search_spaces" / "trl_grpo_arith.yaml"


def _search(cwd: Path, *override: str) -> subprocess.CompletedProcess[str]:
    args = [a for o in override for a in ("--override", o)]
    return subprocess.run([sys.executable, "-m", "hpo", "search", "--space", str(SPACE), *args, "--studies-dir",
                           str(cwd / "studies")], cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=300)


def _one_line(proc: subprocess.CompletedProcess[str], cwd: Path, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for n in needles:
        assert n in proc.stderr, proc.stderr
    assert not (cwd / "studies").exists()


def test_the_experiment_finds_its_own_config_from_another_directory(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "hpo", "validate", "--space", str(SPACE)], cwd=tmp_path,
                          env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("python, needle", [("/etc/passwd", "cannot run /etc/passwd (Permission denied)"),
                                            ("/bin/true", "/bin/true is not a Python interpreter")])
def test_an_interpreter_that_is_not_one_is_named(tmp_path: Path, python: str, needle: str) -> None:
    _one_line(_search(tmp_path, f"trial.python={python}"), tmp_path, "trial.python", needle)


def test_a_value_that_breaks_grpoconfig_names_its_key(tmp_path: Path) -> None:
    _one_line(_search(tmp_path, "deepspeed=/etc/passwd"), tmp_path, "overrides.deepspeed", "rejected by TRL")
