"""The Optuna loop against the fake trainer: outcomes, failure mapping, early stopping, pruning, interrupts,
crash + resume, ``best``. (The same contract with the real trainer: test_hpo_e2e.py.)"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import time
import uuid
from pathlib import Path

import optuna
import psutil
import pytest
import yaml
from optuna.trial import TrialState

from tests.hpo.conftest import PY, ROOT, cli_env, fake_space, load, run_cli


def finished(study_trials: list) -> list:  # type: ignore[type-arg]
    return [t for t in study_trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
            or (t.state == TrialState.FAIL and "fail_reason" in t.user_attrs)]


def test_study_completes_with_values_attrs_and_trial_files(tmp_path: Path, studies: Path) -> None:
    space = fake_space(tmp_path)
    res = run_cli(["search", "--space", str(space)], studies)
    assert res.returncode == 0, res.stderr
    study = load(studies, "fake")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
    for t in study.trials:
        assert t.value == pytest.approx(1 - (t.params["x"] - 0.3) ** 2)
        assert sorted(t.intermediate_values) == [0, 2, 4, 6, 8, 10]
        for key in ("peak_memory_gb", "wall_time_s", "exit_code", "first_metric_s", "worker", "trial_dir"):
            assert key in t.user_attrs, key
        assert t.user_attrs["exit_code"] == 0
        tdir = studies / "fake" / "trials" / str(t.number)
        for f in ("command.json", "config.yaml", "stdout.log", "stderr.log", "metrics.jsonl", "params.json"):
            assert (tdir / f).is_file(), f
        argv = json.loads((tdir / "command.json").read_text())["argv"]
        assert f"fake.x={t.params['x']!r}" in argv
    # progress, the final table, where things are
    assert "3/3" in res.stdout and "best" in res.stdout
    assert "trial logs in" in res.stdout and str(studies / "fake.db") in res.stdout


@pytest.mark.parametrize(("min_value", "reason"), [(0.05, "converged"), (0.5, "collapsed")])
def test_early_stopping_converged_or_collapsed(tmp_path: Path, studies: Path, min_value: float, reason: str) -> None:
    """A small spread at step 4 (objective ~0.1 there): converged above the floor, collapsed below it. The 36 steps
    after the stop take 9 s, the driver's time to act on step 4's evaluation (at 0.02 s a step, under load 17-45 the
    trial once ran to its end first: value 0.97)."""
    step_s = 0.25
    space = fake_space(tmp_path, overrides={"trainer.total_training_steps": 40, "trainer.test_freq": 2,
                                            "fake.step_s": step_s, "fake.std": 0.01},
                       early_stopping={"enabled": True, "threshold": 0.05, "patience": 3, "min_value": min_value},
                       study={"n_trials": 2})
    res = run_cli(["search", "--space", str(space)], studies)
    assert res.returncode == 0
    assert reason in res.stdout
    for t in load(studies, "fake").trials:
        assert t.state == TrialState.COMPLETE
        assert 0.05 < t.value < 0.5
        assert t.user_attrs["stop_reason"] == reason
        assert t.user_attrs["last_step"] == 4  # evaluations at 0, 2, 4
        assert t.value == pytest.approx(t.intermediate_values[4])
        assert t.user_attrs["compute_saved_s"] == pytest.approx(36 * step_s, rel=0.01)


def test_median_pruning(tmp_path: Path, studies: Path) -> None:
    space = fake_space(tmp_path, overrides={"trainer.total_training_steps": 20, "trainer.test_freq": 2,
                                            "fake.step_s": 0.15},
                       study={"n_trials": 6, "pruner": {"type": "median", "n_startup_trials": 1}})
    assert run_cli(["search", "--space", str(space)], studies).returncode == 0
    trials = load(studies, "fake").trials
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert pruned, [(t.number, t.state) for t in trials]
    for t in pruned:
        assert t.user_attrs["stop_reason"] == "pruned" and t.user_attrs["compute_saved_s"] > 0
        assert t.user_attrs["last_step"] < 20


FAILURES = [
    ("crash", {"fake.crash_at": 2}, {}, "RuntimeError"),
    ("oom", {"fake.oom_at": 2}, {}, "MemoryError"),
    ("killed", {"fake.sigkill_at": 2}, {}, None),  # a SIGKILL nobody confirms as OOM
    ("oom", {"fake.alloc_mb": 30, "fake.step_s": 0.05, "trainer.total_training_steps": 100},
     {"memory_limit_gb": 0.2}, None),
    ("timeout", {"fake.hang_at": 1}, {"timeout_s": 1}, None),
    ("crash", {"fake.bad": 1}, {}, "error: fake.bad"),
]


@pytest.mark.parametrize(("reason", "overrides", "trial", "needle"), FAILURES,
                         ids=["crash", "MemoryError", "killed", "memory_cap", "timeout", "exit2"])
def test_failures_get_worst_value_and_the_study_goes_on(tmp_path: Path, studies: Path, reason: str,
                                                        overrides: dict, trial: dict, needle: str | None) -> None:
    space = fake_space(tmp_path, overrides=overrides, trial=trial, study={"n_trials": 2})
    res = run_cli(["search", "--space", str(space)], studies)
    assert res.returncode == 0, res.stderr
    trials = load(studies, "fake").trials
    assert len(trials) == 2
    for t in trials:
        assert t.state == TrialState.COMPLETE and t.value == -math.inf
        assert t.user_attrs["fail_reason"] == reason
        assert "peak_memory_gb" in t.user_attrs and "wall_time_s" in t.user_attrs and "exit_code" in t.user_attrs
        if needle:
            assert needle in t.user_attrs["stderr_tail"]


def test_on_failure_fail_and_minimize(tmp_path: Path, studies: Path) -> None:
    space = fake_space(tmp_path, overrides={"fake.crash_at": 2}, trial={"on_failure": "fail"},
                       objective={"direction": "minimize"}, study={"n_trials": 2})
    assert run_cli(["search", "--space", str(space)], studies).returncode == 0
    trials = load(studies, "fake").trials
    assert [t.state for t in trials] == [TrialState.FAIL] * 2
    assert all(t.user_attrs["fail_reason"] == "crash" for t in trials)


def test_best_formats(tmp_path: Path, studies: Path) -> None:
    space = fake_space(tmp_path, study={"n_trials": 1})  # one finished trial is a best to print in each format
    assert run_cli(["search", "--space", str(space)], studies).returncode == 0
    best = load(studies, "fake").best_trial
    res = run_cli(["best", "--study", "fake"], studies)
    assert res.returncode == 0 and res.stdout.strip() == f"fake.x={best.params['x']!r}"
    res = run_cli(["best", "--study", "fake", "--format", "yaml"], studies)
    assert yaml.safe_load(res.stdout) == {"fake": {"x": best.params["x"]}}
    res = run_cli(["best", "--study", "fake", "--format", "command"], studies)
    assert "--config tiny_arith" in res.stdout and "trainer.total_training_steps=10" in res.stdout


def test_search_again_continues_or_refuses_another_space(tmp_path: Path, studies: Path) -> None:
    space = fake_space(tmp_path, study={"n_trials": 1})
    assert run_cli(["search", "--space", str(space)], studies).returncode == 0
    res = run_cli(["search", "--space", str(space), "--n-trials", "2"], studies)  # the same study, one trial more
    assert res.returncode == 0 and len(load(studies, "fake").trials) == 2
    other = fake_space(tmp_path, params={"x": {"key": "fake.x", "type": "float", "low": 0.0, "high": 0.5}})
    res = run_cli(["search", "--space", str(other)], studies)
    assert res.returncode == 2 and "different space" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def _wait_for(pred, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _trial_procs(tag: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            env = p.environ()
            if env.get("TEST_TAG") == tag and "VERL_HPO_TRIAL" in env and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return out


@pytest.mark.parametrize(("sig", "code"), [pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow),  # ~17 s each:
                                           (signal.SIGTERM, 143)])  # SIGINT in make test-slow (CI runs it)
def test_signal_stops_trials_and_resume_retries_them(tmp_path: Path, studies: Path, sig: int, code: int) -> None:
    space = fake_space(tmp_path, overrides={"trainer.total_training_steps": 10, "fake.step_s": 0.3},
                       study={"n_trials": 2})
    tag = uuid.uuid4().hex
    driver = subprocess.Popen([PY, "-m", "hpo", "search", "--space", str(space), "--studies-dir", str(studies)],
                              cwd=ROOT, env=cli_env(TEST_TAG=tag), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    _wait_for(lambda: (studies / "fake" / "trials" / "0" / "metrics.jsonl").exists())
    time.sleep(0.5)
    driver.send_signal(sig)
    out, err = driver.communicate(timeout=90)  # a bound, not a wait: a busy machine is slow to stop
    assert driver.returncode == code, err
    assert "Traceback" not in err and "resume" in err
    assert _trial_procs(tag) == []
    trials = load(studies, "fake").trials
    assert trials[0].state == TrialState.FAIL and trials[0].user_attrs["interrupted"] is True
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    assert [t.params for t in waiting] == [trials[0].params]

    res = run_cli(["resume", "--study", "fake"], studies)
    assert res.returncode == 0, res.stderr
    trials = load(studies, "fake").trials
    assert len(finished(trials)) == 2
    retry = trials[1]
    assert retry.state == TrialState.COMPLETE and retry.params == trials[0].params
    assert retry.user_attrs["retry_of"] == 0


def test_sigkilled_driver_leaves_no_trial_and_resume_retries_it(tmp_path: Path, studies: Path) -> None:
    space = fake_space(tmp_path, overrides={"trainer.total_training_steps": 10, "fake.step_s": 0.3,
                                            "fake.child": "group"}, study={"n_trials": 3})
    tag = uuid.uuid4().hex
    driver = subprocess.Popen([PY, "-m", "hpo", "search", "--space", str(space), "--studies-dir", str(studies)],
                              cwd=ROOT, env=cli_env(TEST_TAG=tag), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    _wait_for(lambda: (studies / "fake" / "trials" / "1" / "metrics.jsonl").exists())
    time.sleep(0.3)
    before = {t.number: t for t in load(studies, "fake").trials}
    assert before[0].state == TrialState.COMPLETE and before[1].state == TrialState.RUNNING
    driver.kill()
    driver.wait()
    trainer = [p for p in _trial_procs(tag) if "fake_trainer" in " ".join(p.cmdline())]
    assert psutil.wait_procs(trainer, timeout=30)[1] == [], "trainer survived the driver's SIGKILL"

    res = run_cli(["resume", "--study", "fake"], studies, TEST_TAG=tag)
    assert res.returncode == 0, res.stderr
    assert _trial_procs(tag) == []  # the orphaned grandchild was swept too
    trials = load(studies, "fake").trials
    assert len(finished(trials)) == 3
    assert trials[0].value == before[0].value and trials[0].datetime_complete == before[0].datetime_complete
    assert trials[1].state == TrialState.FAIL
    retries = [t for t in trials if t.user_attrs.get("retry_of") == 1]
    assert len(retries) == 1 and retries[0].params == before[1].params and retries[0].state == TrialState.COMPLETE
    assert "trial 1: its driver is gone" in res.stdout and "retry queued" in res.stdout


def test_resume_reseeds_the_sampler(tmp_path: Path, studies: Path) -> None:
    """Same base seed, but resume adds the number of existing trials: no replay of earlier suggestions."""
    space = fake_space(tmp_path, study={"n_trials": 1, "sampler": {"type": "random", "seed": 0}})
    assert run_cli(["search", "--space", str(space)], studies).returncode == 0
    assert run_cli(["resume", "--study", "fake", "--n-trials", "2"], studies).returncode == 0
    xs = [t.params["x"] for t in load(studies, "fake").trials]  # a replay would ask trial 0's x again
    assert len(xs) == 2 and len(set(xs)) == 2


def test_stale_trial_of_another_host_is_retried_by_heartbeat(tmp_path: Path, studies: Path) -> None:
    """A RUNNING trial whose driver ran elsewhere is only known dead by its heartbeat (grace_period)."""
    from hpo.experiment._space import StudySpec
    from hpo.storages._storage import open_storage

    space = fake_space(tmp_path, study={"n_trials": 1, "heartbeat_interval": 1, "grace_period": 2})
    assert run_cli(["search", "--space", str(space)], studies).returncode == 0
    storage = open_storage(f"sqlite:///{studies / 'fake.db'}", StudySpec(heartbeat_interval=1, grace_period=2))
    study = optuna.load_study(study_name="fake", storage=storage)
    ghost = study.ask({"x": optuna.distributions.FloatDistribution(0.0, 1.0)})
    ghost.set_user_attr("worker", {"host": "elsewhere", "pid": 1, "started": 0.0})
    storage.set_trial_system_attr(ghost._trial_id, "hpo:heartbeat", time.time() - 60)  # its last beat: long ago
    res = run_cli(["resume", "--study", "fake", "--n-trials", "2"], studies)
    assert res.returncode == 0, res.stderr
    trials = load(studies, "fake").trials
    assert trials[ghost.number].state == TrialState.FAIL
    retry = [t for t in trials if t.user_attrs.get("retry_of") == ghost.number]
    assert len(retry) == 1 and retry[0].params == ghost.params and retry[0].state == TrialState.COMPLETE
    assert len(finished(trials)) == 2


@pytest.mark.slow  # ~30-100 s on 2 busy cores: make test-slow (CI runs it)
def test_one_driver_with_parallel_jobs_never_asks_for_a_surplus_trial(tmp_path: Path, studies: Path) -> None:
    """Its jobs ask one at a time and only while the target has room, so the study holds exactly n_trials trials,
    none of them a surplus FAIL, and the summary counts no interrupted trial (issue 20, item 10)."""
    for run in range(2):
        space = fake_space(tmp_path, name=f"jobs{run}", overrides={"trainer.total_training_steps": 4,
                                                                    "trainer.test_freq": 2, "fake.step_s": 0.01},
                           study={"n_trials": 5, "pruner": {"type": "none"}},
                           trial={"command": [PY, "tests/hpo/fake_trainer.py", "train"], "n_jobs": 4})
        res = run_cli(["search", "--space", str(space)], studies)
        assert res.returncode == 0, res.stderr
        trials = load(studies, f"jobs{run}").trials
        assert [t.state for t in trials] == [TrialState.COMPLETE] * 5
        assert "interrupted" not in res.stdout and "surplus" not in res.stdout


@pytest.mark.parametrize("finished_elsewhere", [False, True])
def test_a_trial_the_driver_cannot_go_on_with_is_queued_once_unless_it_finished(tmp_path: Path,
                                                                               finished_elsewhere: bool) -> None:
    """A driver error after the trial ran (a broken pipe, a full disk): the trial ends FAIL with one retry queued;
    but a trial another driver has told meanwhile keeps its result and gets no retry (a resumed Ray-job study counted
    a third finished trial of two when both happened)."""
    from optuna.distributions import FloatDistribution

    from hpo.backends import load_space
    from hpo.study import DriverError
    from hpo.study._trial import TrialRunner

    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask({"x": FloatDistribution(0, 1)})
    if finished_elsewhere:
        optuna.load_study(study_name="s", storage=storage).tell(trial.number, 0.5)
    runner = TrialRunner.__new__(TrialRunner)  # only what _abandon reads
    runner.study, runner.space = study, load_space("kl_lr", check=False)
    with pytest.raises(DriverError, match="Broken pipe"):
        runner._abandon(trial, BrokenPipeError(32, "Broken pipe"))
    states = [t.state for t in study.get_trials()]
    assert states == ([TrialState.COMPLETE] if finished_elsewhere else [TrialState.FAIL, TrialState.WAITING])
    if not finished_elsewhere:
        assert study.trials[0].user_attrs["stop_reason"] == "driver_error"
        assert study.trials[1].params == study.trials[0].params
