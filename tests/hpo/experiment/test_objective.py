"""Objective modes: single, weighted (parts stored), pareto (front, pruning), constraints, bad definitions."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest

from hpo.experiment._objective import Objective, parse_objective
from hpo.reporting._report import best_trial, pareto_front
from tests.hpo.conftest import fake_space, load, run_cli

WELL_KNOWN = {"mode": "weighted", "direction": "maximize", "terms": [
    {"name": "reward", "metric": "eval/reward_mean", "weight": 0.6},
    {"name": "toxicity", "metric": "eval/toxicity_mean", "weight": -0.2},
    {"name": "slow", "metric": "eval/latency_p95", "weight": -0.2, "transform": "excess", "threshold": 0.8}]}
PARETO = {"mode": "pareto", "objectives": [
    {"name": "reward", "metric": "eval/reward_mean", "direction": "maximize"},
    {"name": "toxicity", "metric": "eval/toxicity_mean", "direction": "minimize"},
    {"name": "latency", "metric": "eval/latency_p95", "direction": "minimize"}]}


def _space(tmp_path: Path, name: str, objective: dict, **sections: object) -> Path:
    """A fake-trainer experiment whose objective section is exactly ``objective``."""
    import yaml

    path = fake_space(tmp_path, name=name, **sections)
    raw = yaml.safe_load(path.read_text())
    raw["objective"] = objective
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _parse(raw: object) -> Objective:
    def error(where: str, msg: str) -> Exception:
        return ValueError(f"{where}: {msg}")
    return parse_objective(raw, error)


def test_weighted_formula_is_data() -> None:
    obj = _parse(WELL_KNOWN)
    for lat, expected_slow in ((0.5, 0.0), (1.3, -0.2 * 0.5)):
        values, parts = obj.evaluate({"eval/reward_mean": 0.5, "eval/toxicity_mean": 0.1, "eval/latency_p95": lat})
        assert parts["score/slow"] == pytest.approx(expected_slow)
        assert values[0] == pytest.approx(0.6 * 0.5 - 0.2 * 0.1 - 0.2 * max(0.0, lat - 0.8))
        assert parts["score/total"] == pytest.approx(values[0])
    assert obj.evaluate({"eval/reward_mean": 0.5}) is None  # not an evaluation line with every metric
    assert obj.names == ["score"] and obj.worst == -math.inf


def test_pareto_and_constraints() -> None:
    obj = _parse({**PARETO, "constraints": [{"metric": "eval/toxicity_mean", "op": "<=", "value": 0.1},
                                             {"name": "min_reward", "metric": "eval/reward_mean", "op": ">=",
                                              "value": 0.3}]})
    assert obj.directions == ["maximize", "minimize", "minimize"]
    assert obj.worst == [-math.inf, math.inf, math.inf]
    c = obj.constraint_values({"eval/toxicity_mean": 0.25, "eval/reward_mean": 0.5})
    assert c == {"toxicity_mean": pytest.approx(0.15), "min_reward": pytest.approx(-0.2)}
    assert obj.constraint_values(None) == {"toxicity_mean": math.inf, "min_reward": math.inf}


@pytest.mark.parametrize("objective, needle", [
    ({"mode": "pareto", "objectives": [{"metric": "eval/reward_mean", "direction": "maximize"},
                                       {"metric": "eval/toxicity_mean"}]},
     "objective.objectives[1].direction: required (maximize or minimize)"),
    ({**WELL_KNOWN, "terms": [*WELL_KNOWN["terms"], {"metric": "eval/toxicty_mean", "weight": 0.1}]},
     "objective.terms[3].metric: unknown metric 'eval/toxicty_mean'"),
    ({**WELL_KNOWN, "terms": [{"metric": "eval/reward_mean"}]}, "objective.terms[0].weight: required"),
    ({"metric": "eval/no_such_metric"}, "objective.metric: unknown metric 'eval/no_such_metric'"),
    ({"mode": "lexicographic"}, "objective.mode: 'lexicographic' is not one of single, weighted, pareto"),
    ({**PARETO, "constraints": [{"metric": "eval/toxicity_mean", "op": "<", "value": 0.1}]},
     "objective.constraints[0].op: '<' is not one of <=, >="),
    ({"mode": "pareto", "objectives": [{"metric": "eval/reward_mean", "direction": "maximize"}]},
     "pareto needs at least 2 objectives"),
    ({"metric": "eval/reward_mean", "terms": []}, "objective.terms: not used with mode single"),
])
def test_bad_objectives_exit_2_before_any_trial(tmp_path: Path, objective: dict, needle: str) -> None:
    """Real trainer config (default command): metric names are checked against what it logs."""
    space = tmp_path / "bad.yaml"
    space.write_text(
        "config: tiny_arith\nparams:\n  lr: {key: actor_rollout_ref.actor.optim.lr, type: float, low: 1.0e-5, "
        "high: 1.0e-3, log: true}\n")
    import yaml

    raw = yaml.safe_load(space.read_text())
    raw["objective"] = objective
    space.write_text(yaml.safe_dump(raw))
    out = run_cli(["search", "--space", str(space)], tmp_path / "studies")
    assert out.returncode == 2, out.stderr
    assert needle in out.stderr and str(space) in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "studies").exists() or not list((tmp_path / "studies").rglob("*.db"))


def test_disabled_evaluator_metric_is_rejected(tmp_path: Path) -> None:
    space = tmp_path / "s.yaml"
    space.write_text(
        "config: tiny_arith\noverrides: {evaluation.toxicity.enable: false}\n"
        "params:\n  kl: {key: algorithm.kl_ctrl.kl_coef, type: float, low: 0.01, high: 0.2}\n"
        "objective: {metric: eval/toxicity_mean, direction: minimize}\n")
    out = run_cli(["search", "--space", str(space)], tmp_path / "studies")
    assert out.returncode == 2 and "unknown metric 'eval/toxicity_mean'" in out.stderr


def test_pareto_pruner_must_be_median_or_none(tmp_path: Path, studies: Path) -> None:
    path = _space(tmp_path, "fake", PARETO, study={"pruner": {"type": "hyperband"}})
    out = run_cli(["search", "--space", str(path)], studies)
    assert out.returncode == 2 and "study.pruner.type: 'hyperband' is not supported with objective mode pareto" \
        in out.stderr


def test_weighted_study_stores_parts_and_respects_constraints(tmp_path: Path, studies: Path) -> None:
    path = _space(
        tmp_path, "w",
        {"mode": "weighted", "direction": "maximize", "terms": [
            {"name": "reward", "metric": "eval/reward_mean", "weight": 1.0},
            {"name": "length", "metric": "eval/latency_p95", "weight": 0.1}],
         "constraints": [{"metric": "eval/latency_p95", "op": "<=", "value": 0.6}]},
        params={"x": {"key": "fake.x", "type": "categorical", "choices": [0.3, 0.9]},
                "lat": {"key": "fake.lat", "type": "categorical", "choices": [0.5, 0.9]}},
        study={"n_trials": 10, "sampler": {"type": "random", "seed": 0}})
    out = run_cli(["search", "--space", str(path)], studies)
    assert out.returncode == 0, out.stderr
    study = load(studies, "w")
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 10
    for t in done:
        reward = 1.0 - (t.params["x"] - 0.3) ** 2
        assert t.user_attrs["score/reward"] == pytest.approx(reward)
        assert t.user_attrs["score/length"] == pytest.approx(0.1 * t.params["lat"])
        assert t.user_attrs["score/total"] == pytest.approx(t.value)
        assert t.value == pytest.approx(reward + 0.1 * t.params["lat"])
        assert (t.constraints["latency_p95"] <= 0) == (t.params["lat"] == 0.5)
    best = best_trial(study)
    assert best is not None and best.params == {"x": 0.3, "lat": 0.5}
    best_any = max(done, key=lambda t: t.value)
    assert best_any.params == {"x": 0.3, "lat": 0.9}  # scores higher but is infeasible: never best
    out = run_cli(["best", "--study", "w"], studies)
    assert out.returncode == 0 and f"trial {best.number}" in out.stderr


@pytest.mark.slow  # ~20 s of real trials: make test-slow (CI runs it)
def test_pareto_study_front_pruning_and_failures(tmp_path: Path, studies: Path) -> None:
    path = _space(
        tmp_path, "p", PARETO,
        params={"x": {"key": "fake.x", "type": "float", "low": 0.0, "high": 1.0},
                "tox": {"key": "fake.tox", "type": "float", "low": 0.0, "high": 0.3},
                "crash": {"key": "fake.crash_at", "type": "categorical", "choices": ["none", 5]}},
        study={"n_trials": 10, "sampler": {"type": "random", "seed": 0},
               "pruner": {"type": "median", "n_startup_trials": 2, "n_warmup_steps": 4}})
    out = run_cli(["search", "--space", str(path)], studies)
    assert out.returncode == 0, out.stderr
    study = load(studies, "p")
    assert study.metric_names == ["reward", "toxicity", "latency"]
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.PRUNED) >= 1  # pruned on the reward curve
    for t in study.trials:
        if t.state == optuna.trial.TrialState.COMPLETE and t.user_attrs.get("fail_reason") == "crash":
            assert t.values == [-math.inf, math.inf, math.inf]
    front = pareto_front(study)
    assert front and all(len(t.values) == 3 and all(math.isfinite(v) for v in t.values) for t in front)
    best = run_cli(["best", "--study", "p"], studies)
    assert best.returncode == 0, best.stderr
    assert "reward (max)" in best.stdout and "toxicity (min)" in best.stdout
    assert {str(t.number) for t in front} <= {line.split()[0] for line in best.stdout.splitlines()[1:]}
    one = run_cli(["best", "--study", "p", "--trial", str(front[0].number)], studies)
    assert one.returncode == 0 and "fake.x=" in one.stdout
