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


def test_the_launcher_reads_a_secret_from_its_environment() -> None:
    """``hub_token=${oc.env:VERL_HPO_SECRET_HUB_TOKEN}`` in argv (hpo.experiment._secrets): the launcher takes the
    value from its environment as a YAML string, and names the key when the variable is missing."""
    import yaml

    from hpo.backends.trl._keys import resolve_env_refs

    env = {"VERL_HPO_SECRET_HUB_TOKEN": "123'45"}
    out = resolve_env_refs(["max_steps=4", "hub_token=${oc.env:VERL_HPO_SECRET_HUB_TOKEN}"], env)
    assert out[0] == "max_steps=4" and yaml.safe_load(out[1].partition("=")[2]) == "123'45"
    with pytest.raises(ValueError, match="hub_token: .*VERL_HPO_SECRET_HUB_TOKEN.* is not set"):
        resolve_env_refs(["hub_token=${oc.env:VERL_HPO_SECRET_HUB_TOKEN}"], {})


def test_a_model_path_that_is_not_a_model_is_refused_before_the_study(tmp_path: Path) -> None:
    """It was found by the prepare step, after the study existed (issue 44 item 6)."""
    _one_line(_search(tmp_path, f"model.path={tmp_path}"), tmp_path, "overrides.model.path",
              "not a local Hugging Face model directory (no config.json)")
