"""Racing confirmation through the real CLI: the fake trainer's seed noise moves every setting together on a seed, so
paired comparisons separate the candidates after 2 seeds where 4 were allowed; two drivers racing one study run each
(trial, seed) once."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from optuna.trial import TrialState

from tests.hpo.conftest import PY, ROOT, cli_env, fake_space, load, run_cli


def _space(tmp_path: Path) -> Path:
    return fake_space(tmp_path, overrides={"trainer.total_training_steps": 6, "trainer.test_freq": 2,
                                           "fake.step_s": 0.01, "trainer.seed": 1000, "fake.seed_noise": 0.3},
                      study={"n_trials": 4, "pruner": {"type": "none"}, "heartbeat_interval": 1, "grace_period": 3,
                             "confirm": {"race": True, "top_k": 3, "seeds": 4, "min_seeds": 2},
                             "baseline": {"fake.x": 1.0}},
                      trial={"n_jobs": 2})


def _runs(studies: Path) -> dict[object, list[int]]:
    by: dict[object, list[int]] = {}
    for t in load(studies, "fake").trials:
        if "confirm_of" in t.user_attrs and t.state == TrialState.COMPLETE:
            by.setdefault(t.user_attrs["confirm_of"], []).append(t.user_attrs["confirm_seed"])
    return by


def test_a_race_separates_the_candidates_in_two_seeds_and_best_says_so(tmp_path: Path, studies: Path) -> None:
    assert run_cli(["search", "--space", str(_space(tmp_path))], studies).returncode == 0
    res = run_cli(["confirm", "--study", "fake"], studies)
    assert res.returncode == 0, res.stderr
    assert "racing the top 3 configuration(s)" in res.stdout and "4 run(s) queued" in res.stdout  # round 1 only
    runs = _runs(studies)
    candidates = [k for k in runs if k != "baseline"]
    assert len(candidates) == 3
    for c in candidates:  # every seed moves all settings alike: the paired gaps are exact after 2 seeds
        assert sorted(runs[c]) == [1001, 1002], runs
    assert 2 <= len(runs["baseline"]) <= 4 and sorted(runs["baseline"]) == [1001, 1002, 1003, 1004][
        :len(runs["baseline"])]
    assert "racing confirmation ended: the leader is separated from every other candidate after 2 seed(s)" \
        in res.stdout, res.stdout
    assert res.stdout.count("racing confirmation dropped trial") == 2
    best = run_cli(["best", "--study", "fake"], studies)
    n_runs = 6 + len(runs["baseline"])
    assert best.returncode == 0 and f"racing confirmation ran {n_runs} run(s) (the baseline's included) where every " \
        "seed of every candidate takes 16" in best.stderr + best.stdout, best.stderr
    again = run_cli(["confirm", "--study", "fake"], studies)  # decided: nothing more to run
    assert again.returncode == 0 and "0 run(s) queued, 0 pending" in again.stdout, again.stdout
    assert _runs(studies) == runs


@pytest.mark.slow  # ~30 s on 2 busy cores: make test-slow (CI runs it)
def test_two_drivers_racing_one_study_run_each_seed_once(tmp_path: Path, studies: Path) -> None:
    space = _space(tmp_path)
    assert run_cli(["search", "--space", str(space)], studies).returncode == 0
    cmd = [PY, "-m", "hpo", "confirm", "--study", "fake", "--studies-dir", str(studies)]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    runs = _runs(studies)
    for of, seeds in runs.items():
        assert len(seeds) == len(set(seeds)), (of, seeds)  # no (trial, seed) finished twice
    assert all(sorted(runs[c]) == [1001, 1002] for c in runs if c != "baseline"), runs
