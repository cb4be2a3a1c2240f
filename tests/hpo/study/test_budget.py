"""A study's budget in full-run equivalents and the baseline runs kept per host, through the real CLI with the fake
trainer (one full run = 6 steps)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from optuna.trial import TrialState

from tests.hpo.conftest import fake_space, load, run_cli

OVERRIDES = {"trainer.total_training_steps": 6, "trainer.test_freq": 2, "fake.step_s": 0.01, "trainer.seed": 1000,
             "fake.seed_noise": 0.1}


def _space(tmp_path: Path, name: str = "fake", **study: object) -> Path:
    return fake_space(tmp_path, name=name, overrides=OVERRIDES, study={
        "n_trials": 3, "pruner": {"type": "none"}, "heartbeat_interval": 1, "grace_period": 3,
        "confirm": {"top_k": 1, "seeds": 2}, "baseline": {"fake.x": 1.0}, **study})


def _seeds_run(log: Path) -> list[int]:
    return [json.loads(line)["seed"] for line in log.read_text().splitlines()] if log.is_file() else []


def test_a_budget_stops_the_search_and_keeps_room_for_confirmation(tmp_path: Path, studies: Path) -> None:
    space = _space(tmp_path, n_trials=20)
    res = run_cli(["search", "--space", str(space), "--budget", "7"], studies)
    assert res.returncode == 0, res.stderr
    # confirmation's least: 1 candidate + the baseline on 2 seeds = 4 full runs; the search stops at 3
    assert "budget: 3.0 of 7 full-run equivalents spent and 4 kept for confirmation: no new search trial" \
        in res.stdout, res.stdout
    assert "spent 3.0/7 runs" in res.stdout
    study = load(studies, "fake")
    assert len([t for t in study.trials if t.state == TrialState.COMPLETE]) == 3
    assert "spent: 3.0 full-run equivalents (3.0 search + 0.0 confirmation; a full run = 6 steps)" in res.stdout
    conf = run_cli(["confirm", "--study", "fake"], studies)
    assert conf.returncode == 0, conf.stderr
    assert "spent: 7.0 full-run equivalents (3.0 search + 4.0 confirmation; a full run = 6 steps)" in conf.stdout
    assert run_cli(["search", "--space", str(space), "--budget", "0"], studies).returncode == 2


def test_a_budget_is_a_cap_a_running_trial_stops_at_the_evaluation_that_leaves_no_room(tmp_path: Path,
                                                                                      studies: Path) -> None:
    # the third run is held after its step-2 evaluation (for up to 120 s), so it ends early only if the driver stops
    # it there, however late the driver reads the evaluation on a busy machine
    gate, log = tmp_path / "gate", tmp_path / "runs.jsonl"
    gate.touch()
    space = fake_space(tmp_path, name="fake", overrides={
        **OVERRIDES, "fake.log_file": str(log), "fake.gate_at": 3, "fake.gate_file": str(gate),
        "fake.gate_from_run": 2, "fake.gate_max_s": 120}, study={
        "n_trials": 20, "pruner": {"type": "none"}, "heartbeat_interval": 1, "grace_period": 3,
        "confirm": {"top_k": 1, "seeds": 2}, "baseline": {"fake.x": 1.0}})
    res = run_cli(["search", "--space", str(space), "--budget", "6.5"], studies)
    assert res.returncode == 0, res.stderr
    gate.unlink()
    study = load(studies, "fake")
    search = [t for t in study.trials if t.state != TrialState.WAITING]
    # 2 full runs (12 steps) + 4 kept (24) + one 2-step interval for the running third: 38 <= 39, so it starts; at
    # its step-2 evaluation 14 + 24 + 2 = 40 > 39: it stops there, and no fourth trial starts
    assert [t.state for t in search] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED], search
    third = search[2]
    assert third.user_attrs["stop_reason"] == "budget" and third.user_attrs["last_step"] == 2
    assert "budget: 2.3 of 6.5 full-run equivalents spent and 4 kept for confirmation" in res.stdout, res.stdout
    conf = run_cli(["confirm", "--study", "fake"], studies)
    assert conf.returncode == 0, conf.stderr
    assert "spent: 6.3 full-run equivalents (2.3 search + 4.0 confirmation; a full run = 6 steps)" in conf.stdout, \
        conf.stdout


@pytest.mark.slow  # ~30 s on 2 busy cores: make test-slow (CI runs it)
def test_baseline_runs_are_reused_by_a_later_study_of_the_same_experiment(tmp_path: Path, studies: Path) -> None:
    log = tmp_path / "runs.jsonl"
    OVERRIDES_LOG = {**OVERRIDES, "fake.log_file": str(log)}
    first = fake_space(tmp_path, name="first", overrides=OVERRIDES_LOG, study={
        "n_trials": 2, "pruner": {"type": "none"}, "confirm": {"top_k": 1, "seeds": 2}, "baseline": {"fake.x": 1.0}})
    assert run_cli(["search", "--space", str(first)], studies).returncode == 0
    assert run_cli(["confirm", "--study", "first"], studies).returncode == 0
    assert sorted(s for s in _seeds_run(log) if s != 1000) == [1001, 1001, 1002, 1002]  # the pick and the baseline
    kept = sorted((studies / ".baselines").glob("*/*.json"))
    assert [p.name for p in kept] == ["1001.json", "1002.json"]

    second = fake_space(tmp_path, name="second", overrides=OVERRIDES_LOG, study={
        "n_trials": 2, "pruner": {"type": "none"}, "confirm": {"top_k": 1, "seeds": 2}, "baseline": {"fake.x": 1.0},
        "sampler": {"seed": 5}})
    assert run_cli(["search", "--space", str(second)], studies).returncode == 0
    before = len(_seeds_run(log))
    res = run_cli(["confirm", "--study", "second"], studies)
    assert res.returncode == 0, res.stderr
    assert sorted(_seeds_run(log)[before:]) == [1001, 1002]  # only the pick ran: the baseline's runs were kept
    base = [t for t in load(studies, "second").trials if t.user_attrs.get("confirm_of") == "baseline"]
    firsts = {t.user_attrs["confirm_seed"]: t.value for t in load(studies, "first").trials
              if t.user_attrs.get("confirm_of") == "baseline"}
    assert sorted(t.user_attrs["confirm_seed"] for t in base) == [1001, 1002]
    assert all(t.user_attrs["baseline_reused"].startswith("first#") for t in base)
    assert {t.user_attrs["confirm_seed"]: t.value for t in base} == firsts
    assert "2 of the baseline's 2 run(s) reused from this host's earlier runs" in res.stdout
    assert "(0.0 search" not in res.stdout and "confirmation; a full run = 6 steps, 2 baseline run(s) reused)" \
        in res.stdout

    # another experiment (a different fixed override) never reuses them; a damaged kept file is ignored
    for p in kept:
        p.write_text("{not json")
    third = fake_space(tmp_path, name="third", overrides={**OVERRIDES_LOG, "fake.std": 0.3}, study={
        "n_trials": 2, "pruner": {"type": "none"}, "confirm": {"top_k": 1, "seeds": 2}, "baseline": {"fake.x": 1.0}})
    assert run_cli(["search", "--space", str(third)], studies).returncode == 0
    assert run_cli(["confirm", "--study", "third"], studies).returncode == 0
    assert not any(t.user_attrs.get("baseline_reused") for t in load(studies, "third").trials)
    fourth = fake_space(tmp_path, name="fourth", overrides=OVERRIDES_LOG, study={
        "n_trials": 2, "pruner": {"type": "none"}, "confirm": {"top_k": 1, "seeds": 2}, "baseline": {"fake.x": 1.0}})
    assert run_cli(["search", "--space", str(fourth)], studies).returncode == 0
    assert run_cli(["confirm", "--study", "fourth"], studies).returncode == 0
    reused = [t for t in load(studies, "fourth").trials if t.user_attrs.get("baseline_reused")]
    assert not reused  # the damaged records were not used (and the runs made then rewrote them)
    assert all(json.loads(p.read_text())["study"] == "fourth" for p in kept)


@pytest.mark.parametrize("budget", ["0", "-1", "nan", "inf", "0.5"])
def test_a_bad_budget_is_refused_before_any_study_exists(tmp_path: Path, studies: Path, budget: str) -> None:
    res = run_cli(["search", "--space", str(_space(tmp_path)), "--budget", budget], studies)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert f"--budget {float(budget):g}" in res.stderr and "Traceback" not in res.stderr
    assert not studies.exists() or not any(studies.iterdir())


def test_the_search_budget_is_kept_for_confirm_and_a_budget_the_confirmation_eats_is_said(tmp_path: Path,
                                                                                       studies: Path) -> None:
    """``--budget 4`` is all the confirmation's least (1 candidate + the baseline on 2 seeds): said before any run;
    the study keeps 4, so ``confirm`` without ``--budget`` keeps to it (its race-free confirmation fits exactly)."""
    space = _space(tmp_path, n_trials=2)
    res = run_cli(["search", "--space", str(space), "--budget", "4"], studies)
    assert res.returncode == 0, res.stderr
    assert "warning: a budget of 4 full runs leaves the search 0 after the confirmation's least (4 runs" in res.stdout
    assert load(studies, "fake").user_attrs["hpo:budget"] == 4.0
    conf = run_cli(["confirm", "--study", "fake"], studies)
    assert conf.returncode == 0, conf.stderr
    assert "/4 runs" in conf.stdout or "of 4 full-run" in conf.stdout, conf.stdout
