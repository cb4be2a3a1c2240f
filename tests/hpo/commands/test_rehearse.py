"""``verl-hpo rehearse``'s limits (issue 53 items 8 and 11): its numeric flags (verl's rehearsal's own) are checked
after the quick load and before any corner is composed (minutes on a busy host), one line, exit 2; composing verl's
configs that runs out of its time on a slow host is "not finished here" (exit 3) with the limit and how to raise it
(``VERL_HPO_COMPOSE_TIMEOUT_S``), never a failure that blames the experiment or the install.

The slow host is an interpreter that never answers (``trial.python`` a script that sleeps) under a limit of one
second: no verl is needed, and every test here takes a second or two. The rehearsal itself:
``tests/hpo/backends/verl/test_rehearse*.py``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.hpo.conftest import ROOT, cli_env

SHIPPED = ROOT / "search_spaces" / "verl_grpo_cpu.yaml"


def _rehearse(tmp_path: Path, space: Path | str, *extra: str, timeout: float = 120,
              **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpo", "rehearse", "--space", str(space), *extra,
                           "--studies-dir", str(tmp_path / "studies")], cwd=tmp_path, env=cli_env(**env),
                          capture_output=True, text=True, timeout=timeout)


def _slow_interpreter(tmp_path: Path) -> Path:
    """The shipped CPU experiment with a ``trial.python`` that never answers (a host too busy to compose in time)."""
    python = tmp_path / "slow-python"
    python.write_text("#!/bin/sh\nexec sleep 60\n")
    python.chmod(0o755)
    raw = yaml.safe_load(SHIPPED.read_text())
    raw["trial"]["python"] = str(python)
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.parametrize(("flags", "line"), [
    (["--gpus", "99999"], "error: --gpus 99999: must be from 1 to 4096 (GPUs per trial of the real study)"),
    (["--gpus", "0"], "error: --gpus 0: must be from 1 to 4096 (GPUs per trial of the real study)"),
    (["--parallel", "100"], "error: --parallel 100: at most 16 (corners run at once; a rehearsal has three)"),
    (["--corner-timeout", "1e300"], "error: --corner-timeout 1e+300: must be a positive number of seconds, at most "
                                    "604800 (a week)"),
    (["--reward-timeout", "nan"], "error: --reward-timeout nan: must be a positive number of seconds, at most "
                                  "604800 (a week)"),
])
def test_numeric_flags_are_checked_before_any_corner_is_composed(tmp_path: Path, flags: list[str], line: str) -> None:
    """The flags are the trainer's (verl's rehearsal), so the quick load (a second) comes first; the slow interpreter
    shows that no corner was composed (that would take its whole limit of 60 s)."""
    proc = _rehearse(tmp_path, _slow_interpreter(tmp_path), *flags, timeout=50)
    assert (proc.returncode, proc.stdout, proc.stderr.strip().splitlines()) == (2, "", [line])
    assert not (tmp_path / "studies").exists()


def test_a_400_digit_gpu_size_is_one_line_before_any_corner_is_composed(tmp_path: Path) -> None:
    """The size is the trainer's to read (``--gpu-memory``), so the quick load (a second) comes first; the slow
    interpreter shows that no corner was composed (that would take its whole limit of 60 s)."""
    proc = _rehearse(tmp_path, _slow_interpreter(tmp_path), "--gpu-memory", "9" * 400, timeout=50)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: --gpu-memory '9999999999999999999... (402 characters): not a GPU size from 1 GiB to 4 TiB (e.g. "
        "80GiB, 141G, 24576MiB)"]
    assert not (tmp_path / "studies").exists()


def test_a_compose_that_runs_out_of_time_on_a_busy_host_is_not_finished_here(tmp_path: Path) -> None:
    proc = _rehearse(tmp_path, _slow_interpreter(tmp_path), timeout=50, VERL_HPO_COMPOSE_TIMEOUT_S="1")
    assert proc.returncode == 3, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line == (f"NOT FINISHED HERE: {tmp_path / 'slow.yaml'}: composing 4 verl configs in "
                    f"{tmp_path / 'slow-python'} took over 1 s on this machine (a busy or slow host; "
                    "VERL_HPO_COMPOSE_TIMEOUT_S=SECONDS raises the limit); not rehearsed, not failed"), line
    assert "install-verl" not in line and "FAIL" not in line


def test_a_bad_compose_limit_is_one_line(tmp_path: Path) -> None:
    proc = _rehearse(tmp_path, _slow_interpreter(tmp_path), timeout=50, VERL_HPO_COMPOSE_TIMEOUT_S="1e400")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: VERL_HPO_COMPOSE_TIMEOUT_S='1e400': must be a number of seconds above 0 and at most 86400 (how long "
        "composing verl's configs may take)"], proc.stderr


def test_rehearse_refuses_a_space_of_another_backend(tmp_path: Path) -> None:
    proc = _rehearse(tmp_path, "kl_lr")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.strip().splitlines() == [
        f"error: {ROOT / 'search_spaces' / 'kl_lr.yaml'}: trial.backend is 'verl_core': rehearse runs verl "
        "experiments (trial.backend: verl)"]


def test_rehearse_refuses_no_corners_at_once(tmp_path: Path) -> None:
    proc = _rehearse(tmp_path, "verl_grpo_cpu", "--parallel", "0")
    assert (proc.returncode, proc.stdout, proc.stderr.strip().splitlines()) == (
        2, "", ["error: --parallel 0: must be 1 or more (corners run at once)"])
    assert not (tmp_path / "studies").exists()
