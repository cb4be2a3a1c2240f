"""How a trial or the driver stops early (``hpo/study/_errors.py``), as a user meets each through ``verl-hpo search``:
a trial the driver cannot run (``DriverError``: a runtime problem, not bad input) is exit 1 with one line, the trial
queued again for ``resume``; a failing trial with ``on_failure: fail`` (``TrialFailed``) is recorded FAIL with its
reason and counts towards the target, and the study goes on. ``TrialInterrupted``: ``test_trial.py``."""

from __future__ import annotations

from pathlib import Path

from optuna.trial import TrialState

from tests.hpo.conftest import ROOT, fake_space, load, run_cli


def test_a_trial_the_driver_cannot_launch_is_exit_1_and_queued_again(tmp_path: Path, studies: Path) -> None:
    missing = ROOT / "tests" / "hpo" / "no_such_trainer"
    space = fake_space(tmp_path, study={"n_trials": 2}, trial={"command": [str(missing), "train"]})
    res = run_cli(["search", "--space", str(space)], studies)
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert res.stderr.strip().splitlines() == [
        f"error: trial 0 could not be run: FileNotFoundError: No such file or directory: {missing}"]
    first, again = load(studies, "fake").trials
    assert first.state == TrialState.FAIL and first.user_attrs["stop_reason"] == "driver_error"
    assert again.state == TrialState.WAITING and again.params == first.params  # resume runs it first


def test_on_failure_fail_records_each_failed_trial_and_the_study_goes_on(tmp_path: Path, studies: Path) -> None:
    space = fake_space(tmp_path, study={"n_trials": 2}, trial={"on_failure": "fail"},
                       overrides={"trainer.total_training_steps": 4, "trainer.test_freq": 2, "fake.crash_at": 2,
                                  "fake.step_s": 0.01})
    res = run_cli(["search", "--space", str(space)], studies)
    assert res.returncode == 0, res.stderr
    trials = load(studies, "fake").trials
    assert [(t.state, t.user_attrs["fail_reason"]) for t in trials] == [(TrialState.FAIL, "crash")] * 2
    assert "trials: 2 crash" in res.stdout
