"""A killed driver's verl trials leave their private scratch (``/tmp/vhpo-<uid>-<hash>-<attempt>``: Ray's session
files, hundreds of MB); the next driver of the study on the host removes it (issue 44 item 1): only that of finished
trials of this study, never a running trial's, never a directory outside the study's trials directory."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.trial import TrialState

from hpo.backends.verl._backend import VerlBackend
from hpo.backends.verl._launch import scratch_dir
from hpo.study._recovery import sweep_scratch


def _trial(study: optuna.Study, state: TrialState, trial_dir: Path, history: list[int] | None = None) -> None:
    study.add_trial(optuna.trial.create_trial(
        state=state, value=1.0 if state == TrialState.COMPLETE else None, params={}, distributions={},
        user_attrs={"trial_dir": str(trial_dir)}, system_attrs={"retry_history": history} if history else {}))


def test_the_scratch_of_finished_trials_goes_and_a_running_one_s_stays(tmp_path: Path) -> None:
    trials = tmp_path / "a-studies-directory-with-a-long-name" / "mine" / "trials"
    dirs = {n: trials / str(n) for n in range(4)}
    for d in dirs.values():
        d.mkdir(parents=True)
    outside = tmp_path / "elsewhere" / "7"
    outside.mkdir(parents=True)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'mine.db'}", study_name="mine")
    _trial(study, TrialState.FAIL, dirs[0])  # killed with its driver, recovered as FAIL
    _trial(study, TrialState.COMPLETE, dirs[1], history=[0])  # its retry (attempt 1)
    running = study.ask()  # a live trial of another driver
    study._storage.set_trial_user_attr(running._trial_id, "trial_dir", str(dirs[2]))
    _trial(study, TrialState.FAIL, outside)  # a trial_dir from the storage outside this trials dir
    scratches = {"killed": scratch_dir(dirs[0], 0), "retry": scratch_dir(dirs[1], 1),
                 "running": scratch_dir(dirs[2], 0), "outside": scratch_dir(outside, 0)}
    assert str(scratches["killed"]).startswith("/tmp/vhpo-")  # the long path: outside the trial directory
    try:
        for s in scratches.values():
            (s / "ray" / "session_latest" / "logs").mkdir(parents=True, exist_ok=True)
        assert sweep_scratch(study, trials, VerlBackend().cleanup) == 2
        assert not scratches["killed"].exists() and not scratches["retry"].exists()
        assert scratches["running"].is_dir() and scratches["outside"].is_dir()
        assert (dirs[0] / "ray_logs").is_dir()  # Ray's logs of the killed attempt kept beside it
    finally:
        import shutil

        for s in scratches.values():
            shutil.rmtree(s, ignore_errors=True)
