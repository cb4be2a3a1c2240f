"""End to end with the real trainer (``python -m verl_core train``): a small study, early stopping,
failures (memory cap, timeout, bad value reaching the trainer), and SIGKILL of the driver + resume."""

from __future__ import annotations

import math
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from optuna.trial import TrialState

from tests.hpo.conftest import PY, ROOT, cli_env, load, run_cli

# The model is built (once per machine) by the session fixture, in-process, before any driver runs under a
# subprocess timeout; the driver's own `prepare` step then finds it cached.
pytestmark = pytest.mark.usefixtures("tiny_model_dir")

PARAMS = {
    "kl_coef": {"key": "algorithm.kl_ctrl.kl_coef", "type": "float", "low": 0.01, "high": 0.2},
    # Below the learning rates that blow the KL up within 4 steps (~1e-3, where the diagnosis stops the trial): these
    # tests follow every trial to its last step. The Latin-hypercube start puts one trial in each half of the range.
    "actor_lr": {"key": "actor_rollout_ref.actor.optim.lr", "type": "float", "low": 1e-5, "high": 2e-4, "log": True},
}


def real_space(tmp_path: Path, steps: int = 4, name: str = "real", **sections: Any) -> Path:
    space: dict[str, Any] = {
        "config": "tiny_arith",
        "overrides": {"trainer.total_training_steps": steps, "trainer.test_freq": 2, "trainer.cpu_threads": 1},
        "params": dict(PARAMS),
        "early_stopping": {"enabled": False},
        "study": {"n_trials": 2, "pruner": {"type": "none"}, "heartbeat_interval": 1, "grace_period": 5},
        "trial": {"n_jobs": 2, "timeout_s": 300},
    }
    for key, value in sections.items():
        space[key] = {**space[key], **value} if isinstance(space.get(key), dict) else value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def trainer_procs(trials_dir: Path) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if str(trials_dir) in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return out


def test_small_study_with_real_values(tmp_path: Path, studies: Path) -> None:
    res = run_cli(["search", "--space", str(real_space(tmp_path))], studies)
    assert res.returncode == 0, res.stderr
    trials = load(studies, "real").trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
    for t in trials:
        assert 0.0 <= t.value <= 1.0 and t.user_attrs["exit_code"] == 0
        assert sorted(t.intermediate_values) == [0, 2, 4]
        assert t.value == t.intermediate_values[4]
        assert 0.1 < t.user_attrs["peak_memory_gb"] < 3
        assert t.user_attrs["first_metric_s"] < t.user_attrs["wall_time_s"]
        cfg = yaml.safe_load((studies / "real" / "trials" / str(t.number) / "config.yaml").read_text())
        assert cfg["algorithm"]["kl_ctrl"]["kl_coef"] == pytest.approx(t.params["kl_coef"])
        assert cfg["trainer"]["default_local_dir"].startswith(str(studies / "real" / "trials"))
    best = run_cli(["best", "--study", "real"], studies)
    assert best.returncode == 0 and "actor_rollout_ref.actor.optim.lr=" in best.stdout


def test_early_stopping_with_the_real_trainer(tmp_path: Path, studies: Path) -> None:
    """Built to stop: a threshold above any reward std means a stop after `patience` evaluations; a floor of 0
    makes it 'converged' (test_driver.py covers 'collapsed'). One trial: each trial stops the same way."""
    space = real_space(tmp_path, steps=40, early_stopping={"enabled": True, "threshold": 1.0, "patience": 2,
                                                                     "min_value": 0.0}, study={"n_trials": 1})
    assert run_cli(["search", "--space", str(space)], studies).returncode == 0
    trials = load(studies, "real").trials
    assert len(trials) == 1
    for t in trials:
        assert t.state == TrialState.COMPLETE and t.user_attrs["stop_reason"] == "converged"
        assert t.user_attrs["last_step"] == 2 and t.value == t.intermediate_values[2]
        assert t.user_attrs["compute_saved_s"] > 0


FAILURES = {
    "oom": ({"memory_limit_gb": 0.15, "preflight": False}, {}, None),  # the cap itself (pre-flight: below)
    "timeout": ({"timeout_s": 3}, {"trainer.total_training_steps": 500}, None),
    "crash": ({}, {}, "no such file"),
}


@pytest.mark.parametrize("reason", list(FAILURES))
def test_failures_with_the_real_trainer(tmp_path: Path, studies: Path, reason: str) -> None:
    trial, overrides, needle = FAILURES[reason]
    params = dict(PARAMS)
    if reason == "crash":  # a value the config accepts but the trainer cannot use
        params["val_file"] = {"key": "data.val_files", "type": "categorical", "choices": ["/nonexistent/val.parquet"]}
    space = real_space(tmp_path, trial=trial, overrides=overrides, params=params)
    res = run_cli(["search", "--space", str(space)], studies)
    assert res.returncode == 0, res.stderr
    trials = load(studies, "real").trials
    assert len(trials) == 2  # the study went on after the first failure
    for t in trials:
        assert t.state == TrialState.COMPLETE and t.value == -math.inf
        assert t.user_attrs["fail_reason"] == reason
        if needle:
            assert needle in t.user_attrs["stderr_tail"]
    assert trainer_procs(studies / "real" / "trials") == []


@pytest.mark.slow  # make test-slow (CI runs it); kept out of make test's 15-minute budget
def test_sigkill_driver_then_resume(tmp_path: Path, studies: Path) -> None:
    space = real_space(tmp_path, steps=10, study={"n_trials": 3}, trial={"n_jobs": 1})
    trials_dir = studies / "real" / "trials"
    driver = subprocess.Popen([PY, "-m", "hpo", "search", "--space", str(space), "--studies-dir", str(studies)],
                              cwd=ROOT, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (trials_dir / "1" / "metrics.jsonl").exists():
        assert time.monotonic() < deadline and driver.poll() is None
        time.sleep(0.1)
    before = {t.number: t for t in load(studies, "real").trials}
    assert before[0].state == TrialState.COMPLETE and before[1].state == TrialState.RUNNING
    driver.kill()
    driver.wait()
    assert psutil.wait_procs(trainer_procs(trials_dir), timeout=30)[1] == [], "a trial survived its driver"

    res = run_cli(["resume", "--study", "real"], studies)
    assert res.returncode == 0, res.stderr
    trials = load(studies, "real").trials
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(done) == 3  # exactly n_trials finished
    assert trials[0].value == before[0].value and trials[0].datetime_complete == before[0].datetime_complete
    retry = [t for t in trials if t.user_attrs.get("retry_of") == 1]
    assert len(retry) == 1 and retry[0].params == before[1].params and retry[0].state == TrialState.COMPLETE
    assert trials[1].state == TrialState.FAIL


@pytest.mark.slow  # ~30-100 s on 2 busy cores: make test-slow (CI runs it)
def test_pareto_study_with_the_real_trainer(tmp_path: Path, studies: Path) -> None:
    """Reward, toxicity and latency measured by the trainer's evaluators; a non-empty Pareto front."""
    objective = {"mode": "pareto", "objectives": [
        {"name": "reward", "metric": "eval/reward_mean", "direction": "maximize"},
        {"name": "toxicity", "metric": "eval/toxicity_mean", "direction": "minimize"},
        {"name": "latency", "metric": "eval/latency_p95", "direction": "minimize"}]}
    path = real_space(tmp_path, name="mo", objective=objective, study={"n_trials": 3})
    res = run_cli(["search", "--space", str(path)], studies)
    assert res.returncode == 0, res.stderr
    study = load(studies, "mo")
    assert study.metric_names == ["reward", "toxicity", "latency"]
    front = [t for t in study.best_trials if all(math.isfinite(v) for v in t.values)]
    assert front
    for t in study.trials:
        reward, toxicity, latency = t.values
        assert 0.0 <= reward <= 1.0 and 0.0 <= toxicity <= 1.0 and 0.0 < latency < 60.0
        assert sorted(int(k) for k in t.user_attrs["curve"]) == [0, 2, 4]
    best = run_cli(["best", "--study", "mo"], studies)
    assert best.returncode == 0, best.stderr
    assert "latency (min)" in best.stdout and len(best.stdout.strip().splitlines()) == len(front) + 1


# ----------------------------------------------------------------------------- pre-flight memory check
def test_preflight_skips_a_trial_predicted_not_to_fit(tmp_path: Path, studies: Path) -> None:
    """Estimates (tiny_arith, 0.6 GB cap, 10% margin): response length 4 -> 0.51 GB fits, 512 -> 0.70 GB does not."""
    params = {"response_length": {"key": "data.max_response_length", "type": "categorical", "choices": [4, 512]}}
    space = real_space(tmp_path, steps=2, params=params, trial={"memory_limit_gb": 0.6, "n_jobs": 1},
                       study={"n_trials": 4, "sampler": {"type": "random", "seed": 3}})
    res = run_cli(["search", "--space", str(space)], studies)
    assert res.returncode == 0, res.stderr
    trials = load(studies, "real").trials
    doomed = [t for t in trials if t.params["response_length"] == 512]
    assert doomed and len(doomed) < len(trials), [t.params for t in trials]
    for t in doomed:
        assert t.user_attrs["fail_reason"] == "predicted_oom" and t.value == float("-inf")
        assert t.user_attrs["predicted_memory_gb"] > 0.6 >= t.user_attrs["memory_budget_gb"]
        assert "exit_code" not in t.user_attrs  # never launched
        trial_dir = studies / "real" / "trials" / str(t.number)
        never = {"command.json", "config.yaml", "stdout.log", "stderr.log", "metrics.jsonl"}
        assert not never & {p.name for p in trial_dir.iterdir()}  # no command, config, log or metrics file
        assert "update_actor" in (trial_dir / "memory_estimate.txt").read_text()
    for t in trials:
        if t.params["response_length"] == 4:
            assert t.state == TrialState.COMPLETE and "fail_reason" not in t.user_attrs


def test_a_space_where_nothing_fits_is_refused_before_the_study(tmp_path: Path, studies: Path) -> None:
    space = real_space(tmp_path, trial={"memory_limit_gb": 0.3})
    res = run_cli(["search", "--space", str(space)], studies)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "every corner of the space is predicted not to fit" in res.stderr and "framework baseline" in res.stderr
    assert not (studies / "real.db").exists()


def validate(space: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "hpo", "validate", "--space", str(space)], cwd=ROOT, env=cli_env(),
                          capture_output=True, text=True, timeout=120)


def test_validate_space(tmp_path: Path, studies: Path) -> None:
    ok = validate(real_space(tmp_path))
    assert ok.returncode == 0 and ok.stdout.strip().endswith("All checks passed"), ok.stderr
    assert ok.stdout.count("corner ") >= 4 and "TOTAL (peak)" in ok.stdout
    bad = validate(real_space(tmp_path, trial={"memory_limit_gb": 0.3}))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "predicted not to fit" in bad.stderr
    broken = validate(real_space(tmp_path, overrides={"data.train_batch_size": 7}))
    assert broken.returncode == 2 and broken.stderr.count("\n") == 1 and "train_batch_size" in broken.stderr
    assert not studies.exists()
