"""Trials of dead drivers (``hpo/study/_recovery.py``), on a real SQLite study: a running trial whose driver is gone
(its pid on this host, else a heartbeat older than the grace period) is finished with the result its driver recorded,
else failed with exactly one retry of its parameters (never its outcome); and a killed driver's verl trials leave
their private scratch (``/tmp/vhpo-<uid>-<hash>-<attempt>``: Ray's session files, hundreds of MB), which the next
driver of the study on the host removes (issue 44 item 1): only that of finished trials of this study, never a running
trial's, never a directory outside the study's trials directory."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from hpo.backends.verl._backend import VerlBackend
from hpo.backends.verl._launch import scratch_dir
from hpo.execution._identity import driver_identity
from hpo.record import ATTR_HEARTBEAT, ATTR_RETRY_HISTORY, ATTR_RETRY_OF
from hpo.study._recovery import record_result, recover_stale_trials, sweep_scratch


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


def _dead_pid() -> int:
    """A pid of this host that has just ended (the driver that was killed)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_dead_driver_s_trials_get_their_recorded_result_or_exactly_one_retry(tmp_path: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    dead = {**driver_identity(), "pid": _dead_pid()}
    trials = [study.ask({"x": FloatDistribution(0, 1)}) for _ in range(4)]
    for t in trials[:2]:
        t.set_user_attr("worker", dead)  # its driver is gone (this host: its pid says so)
        t.set_user_attr("fail_reason", "crash")  # an outcome: never copied to the retry
    record_result(study, trials[1]._trial_id, TrialState.COMPLETE, [float("-inf")])  # told just before its death
    trials[2].set_user_attr("worker", driver_identity())  # this very process: alive
    trials[3].set_user_attr("worker", {"host": "elsewhere", "pid": 1})  # another host: its heartbeat decides
    study._storage.set_trial_system_attr(trials[3]._trial_id, ATTR_HEARTBEAT, time.time())
    assert recover_stale_trials(study, grace_period=60, max_retry=None) == [(0, "retry queued"),
                                                                            (1, "recorded complete")]
    assert recover_stale_trials(optuna.load_study(study_name="s", storage=storage), 60, None) == []  # once only
    after = optuna.load_study(study_name="s", storage=storage).trials
    assert [t.state for t in after] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.RUNNING, TrialState.RUNNING,
                                        TrialState.WAITING]
    assert after[1].value == float("-inf")
    retry = after[4]
    assert retry.params == after[0].params and retry.user_attrs == {}
    assert (retry.system_attrs[ATTR_RETRY_OF], retry.system_attrs[ATTR_RETRY_HISTORY]) == (0, [0])
    study._storage.set_trial_system_attr(trials[3]._trial_id, ATTR_HEARTBEAT, time.time() - 600)  # its beat stopped
    assert recover_stale_trials(study, grace_period=60, max_retry=0) == [(3, "max_retry reached, not retried")]
