"""``verl-hpo resume`` (``hpo/commands/_resume.py``) through the real CLI: a stored study run on to its target with its
stored experiment (``--n-trials`` raises the target), nothing to do once the target is reached, and a study that is
not there is one line."""

from __future__ import annotations

from pathlib import Path

from optuna.trial import TrialState

from tests.hpo.conftest import load, run_cli


def test_resume_runs_a_stored_study_on_to_its_raised_target_and_then_has_nothing_to_do(searched_copy: Path) -> None:
    res = run_cli(["resume", "--study", "fake", "--n-trials", "4"], searched_copy)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("study fake: 3/4 finished trials")
    trials = load(searched_copy, "fake").trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    assert (searched_copy / "fake" / "trials" / "3" / "metrics.jsonl").is_file()  # the stored experiment's trainer
    again = run_cli(["resume", "--study", "fake"], searched_copy)
    assert again.returncode == 0 and "study fake already has 4 finished trials (target 4)" in again.stdout


def test_a_study_that_is_not_there_is_one_line(tmp_path: Path) -> None:
    res = run_cli(["resume", "--study", "nope"], tmp_path / "studies")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "no study 'nope'" in res.stderr and not (tmp_path / "studies").exists()
