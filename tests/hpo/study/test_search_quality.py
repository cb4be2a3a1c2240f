"""Search-quality options of the driver, against the fake trainer: the objective's aggregation over evaluations,
the pruning warm-up in evaluations and collapse stopping by diagnosis (the pruners and the GP sampler themselves:
``test_optuna.py``)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from optuna.trial import TrialState

from hpo.backends import load_space
from hpo.experiment._objective import Objective
from hpo.experiment._space import SpaceError
from tests.hpo.conftest import fake_space, load, run_cli


def fake_curve(x: float, step: int, total: int = 10) -> float:  # noqa: D103
    """eval/reward_mean of tests/hpo/fake_trainer.py at ``step``."""
    return (1.0 - (x - 0.3) ** 2) * (step + 1) / (total + 1)


@pytest.mark.parametrize(("aggregate", "expected"), [
    ("last", lambda x: fake_curve(x, 10)),
    ("best", lambda x: fake_curve(x, 10)),  # the fake's curve only rises
    ("mean_last_k", lambda x: sum(fake_curve(x, s) for s in (6, 8, 10)) / 3),
])
def test_objective_aggregate_sets_the_trial_value_and_its_curve(tmp_path: Path, studies: Path, aggregate: str,
                                                                 expected) -> None:  # type: ignore[no-untyped-def]
    objective = {"metric": "eval/reward_mean", "direction": "maximize", "aggregate": aggregate}
    if aggregate == "mean_last_k":
        objective["k"] = 3
    space = fake_space(tmp_path, objective=objective, study={"n_trials": 2})
    res = run_cli(["search", "--space", str(space)], studies)
    assert res.returncode == 0, res.stderr
    for t in load(studies, "fake").trials:
        assert t.state == TrialState.COMPLETE
        assert t.value == pytest.approx(expected(t.params["x"]))
        if aggregate == "mean_last_k":  # the reported curve is the running aggregate: mean of evals 0 and 2 at 2
            assert t.intermediate_values[2] == pytest.approx((fake_curve(t.params["x"], 0)
                                                              + fake_curve(t.params["x"], 2)) / 2)


def test_aggregate_of_a_curve_that_peaks() -> None:
    history = [[0.1], [0.9], [0.5], [0.3]]
    assert Objective(aggregate="last").aggregated(history) == [0.3]
    assert Objective(aggregate="best").aggregated(history) == [0.9]
    assert Objective(aggregate="best", direction="minimize").aggregated(history) == [0.1]
    assert Objective(aggregate="mean_last_k", k=2).aggregated(history) == [pytest.approx(0.4)]
    assert Objective(aggregate="mean_last_k", k=9).aggregated(history) == [pytest.approx(0.45)]


@pytest.mark.parametrize(("bad", "needle"), [
    ({"aggregate": "median"}, "objective.aggregate: 'median' is not one of last, best, mean_last_k"),
    ({"aggregate": "last", "k": 2}, "objective.k: only with aggregate mean_last_k"),
    ({"aggregate": "mean_last_k", "k": 0}, "objective.k: expected a positive integer, got 0"),
])
def test_bad_aggregate_is_one_line(tmp_path: Path, studies: Path, bad: dict, needle: str) -> None:  # type: ignore[type-arg]
    space = fake_space(tmp_path, objective={"metric": "eval/reward_mean", **bad})
    res = run_cli(["search", "--space", str(space)], studies)
    assert res.returncode == 2
    assert needle in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not studies.exists() or not any(studies.iterdir())


def test_an_override_can_switch_the_aggregate_away_from_mean_last_k() -> None:
    """kl_lr ships mean_last_k with k: 3; `objective.k=null` unsets k, so `objective.aggregate=last` is accepted."""
    space = load_space("kl_lr", overrides=["objective.aggregate=last", "objective.k=null"])
    assert space.objective.aggregate == "last"
    with pytest.raises(SpaceError, match="objective.k: only with aggregate mean_last_k"):
        load_space("kl_lr", overrides=["objective.aggregate=last"])


@pytest.mark.parametrize("warmup", [0, 3, 100])
@pytest.mark.slow  # three real-trainer studies, ~20 s each: make test-slow (CI runs it)
def test_pruning_warmup_counts_evaluations(tmp_path: Path, studies: Path, warmup: int) -> None:
    space = fake_space(tmp_path, overrides={"trainer.total_training_steps": 20, "trainer.test_freq": 2,
                                            "fake.step_s": 0.1},
                       study={"n_trials": 6, "pruner": {"type": "median", "n_startup_trials": 1,
                                                        "n_warmup_evals": warmup}})
    assert run_cli(["search", "--space", str(space)], studies).returncode == 0
    trials = load(studies, "fake").trials
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    if warmup == 100:  # more than the 11 evaluations a trial makes: never pruned
        assert not pruned
        return
    assert pruned, [(t.number, t.state, t.params) for t in trials]
    for t in pruned:  # evaluations at 0, 2, 4, ...: pruned at the (warmup + 1)-th one at the earliest
        assert len(t.intermediate_values) > warmup
        assert t.user_attrs["last_step"] >= 2 * warmup


@pytest.mark.slow  # ~30-100 s on 2 busy cores: make test-slow (CI runs it)
def test_collapse_stops_a_trial_with_its_label(tmp_path: Path, studies: Path) -> None:
    """A NaN loss at step 5 of 40: stopped at once as collapsed:nan, completing with the evaluations it had;
    a healthy trial runs to the end labelled healthy."""
    space = fake_space(tmp_path, overrides={"trainer.total_training_steps": 40, "trainer.test_freq": 2,
                                            "fake.step_s": 0.05},
                       params={"nan_at": {"key": "fake.nan_at", "type": "categorical", "choices": [5, 1000]}},
                       study={"n_trials": 2, "sampler": {"type": "random", "seed": 3}})
    assert run_cli(["search", "--space", str(space), "--override", "study.n_trials=6"], studies).returncode == 0
    trials = load(studies, "fake").trials
    sick = [t for t in trials if t.params["nan_at"] == 5]
    well = [t for t in trials if t.params["nan_at"] == 1000]
    assert sick and well, [t.params for t in trials]
    for t in sick:
        assert t.state == TrialState.COMPLETE
        assert t.user_attrs["stop_reason"] == "collapsed:nan"
        assert t.user_attrs["diagnosis"] == "nan"
        assert t.user_attrs["last_step"] < 20 and t.user_attrs["compute_saved_s"] > 0
        assert math.isfinite(t.value) and t.value == pytest.approx(t.intermediate_values[max(t.intermediate_values)])
    for t in well:
        assert t.user_attrs["diagnosis"] == "healthy" and "stop_reason" not in t.user_attrs
        assert t.user_attrs["last_step"] == 40
    off = run_cli(["search", "--space", str(space), "--study", "off", "--override", "study.n_trials=4",
                   "--override", "diagnosis.stop_on_nan=false"], studies)
    assert off.returncode == 0, off.stderr
    for t in load(studies, "off").trials:  # labelled, but not stopped
        assert t.user_attrs["last_step"] == 40
        assert t.user_attrs["diagnosis"] == ("nan" if t.params["nan_at"] == 5 else "healthy")


def test_plateau_stops_a_trial_that_stopped_improving(tmp_path: Path, studies: Path) -> None:
    space = fake_space(tmp_path, overrides={"trainer.total_training_steps": 20, "trainer.test_freq": 2,
                                            "fake.step_s": 0.05, "fake.peak_at": 4},
                       early_stopping={"enabled": True, "threshold": 0.0, "plateau_evals": 2},
                       study={"n_trials": 1})
    assert run_cli(["search", "--space", str(space)], studies).returncode == 0
    (t,) = load(studies, "fake").trials
    # evaluations at 0, 2, 4 rise; 6 and 8 repeat the value of 4: two evaluations without a new best
    assert t.state == TrialState.COMPLETE and t.user_attrs["stop_reason"] == "plateau"
    assert t.user_attrs["last_step"] == 8
    assert t.value == pytest.approx(fake_curve(t.params["x"], 4, total=20))
    assert t.user_attrs["compute_saved_s"] == pytest.approx(12 * 0.05, rel=0.2)
