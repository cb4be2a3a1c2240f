"""``worker --n-jobs`` and ``trial.n_jobs`` have a cap (issue 53 item 8): ``worker --n-jobs 100000`` started as many
trials as the host allowed and then died of ``can't start new thread``; now it is one line, exit 2, before the study
is opened (so before any trial starts), and an experiment asking for more is refused when it is read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpo.experiment import MAX_N_JOBS
from tests.hpo.conftest import cli_env, fake_space


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpo", *args, "--studies-dir", str(tmp_path / "studies")],
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("n", ["100000", str(MAX_N_JOBS + 1), "9" * 60])
def test_too_many_jobs_are_refused_before_the_study_is_opened(tmp_path: Path, n: str) -> None:
    """No study ``nope`` exists: the cap is what is refused, so the storage was never opened."""
    proc = _cli(tmp_path, "worker", "--study", "nope", "--n-jobs", n)
    shown = n if len(n) <= 20 else f"{n[:12]}... ({len(n)} digits)"
    assert (proc.returncode, proc.stdout, proc.stderr.strip().splitlines()) == (2, "", [
        f"error: --n-jobs {shown}: at most {MAX_N_JOBS} trials at once per worker (each is a thread of this process "
        "beside its trial's own); run more workers, on this host or others, for more"])
    assert not (tmp_path / "studies").exists()


def test_the_cap_itself_is_accepted(tmp_path: Path) -> None:
    proc = _cli(tmp_path, "worker", "--study", "nope", "--n-jobs", str(MAX_N_JOBS))
    assert proc.returncode == 2 and "no study 'nope'" in proc.stderr and "--n-jobs" not in proc.stderr, proc.stderr


def test_an_experiment_asking_for_too_many_jobs_is_refused_when_read(tmp_path: Path) -> None:
    space = fake_space(tmp_path, trial={"n_jobs": 100000})
    proc = _cli(tmp_path, "search", "--space", str(space))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: {space}: trial.n_jobs: at most {MAX_N_JOBS}, got 100000"], proc.stderr
    assert not list(tmp_path.glob("studies/*.db"))  # no study was created
