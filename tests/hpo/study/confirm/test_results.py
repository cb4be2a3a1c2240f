"""The confirmed values (``hpo/study/_confirm/_results.py``) on real Optuna studies: each confirmed trial's finished
runs by seed, ranked by their mean (a run that failed under another seed drags it to the worst value), their spread
and held-out test values, and the baseline's runs apart."""

from __future__ import annotations

import math
from typing import Any

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from hpo.record import ATTR_BASELINE, ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED
from hpo.study._confirm import baseline_confirmed, confirmed

optuna.logging.set_verbosity(optuna.logging.WARNING)
X = {"x": FloatDistribution(0, 1)}


def run(study: optuna.Study, of: int, seed: int, value: float | None, state: TrialState = TrialState.COMPLETE,
        **user: Any) -> None:
    """A confirmation run of trial ``of`` (-1: the baseline) on ``seed``."""
    system = {ATTR_CONFIRM_OF: of, ATTR_CONFIRM_SEED: seed, **({ATTR_BASELINE: True} if of == -1 else {})}
    params = {} if of == -1 else study.trials[of].params
    study.add_trial(create_trial(state=state, value=value, params=params, distributions={} if of == -1 else X,
                                 system_attrs=system, user_attrs=user))


def test_confirmed_trials_rank_by_their_mean_over_finished_runs_by_seed() -> None:
    study = optuna.create_study(direction="maximize")
    for v in (0.9, 0.8, 0.1):
        study.add_trial(create_trial(value=v, params={"x": v}, distributions=X))
    run(study, 0, 1002, 0.5, test_value=0.45)
    run(study, 0, 1000, 0.7, test_value=0.65)
    run(study, 0, 1003, None, TrialState.WAITING)  # queued: not a value yet
    run(study, 1, 1000, 0.8)
    run(study, 1, 1002, 0.82)
    run(study, -1, 1000, 0.3)
    ranked = confirmed(study)
    assert [c.trial.number for c in ranked] == [1, 0]  # the lucky tuning run (0.9) is not the best confirmed
    best, lucky = ranked
    assert best.values == (0.8, 0.82) and best.seeds == (1000, 1002) and best.mean == pytest.approx(0.81)
    assert lucky.seeds == (1000, 1002) and lucky.values == (0.7, 0.5)  # by seed, whatever order they finished in
    assert lucky.std == pytest.approx(math.sqrt(0.02)) and lucky.test_values == (0.65, 0.45)
    assert lucky.test_mean == pytest.approx(0.55) and best.test_values == ()
    base = baseline_confirmed(study)
    assert base is not None and base.values == (0.3,) and base.std == 0.0


def test_a_run_that_failed_under_another_seed_drags_its_setting_down() -> None:
    study = optuna.create_study(direction="minimize")
    for v in (0.1, 0.2):
        study.add_trial(create_trial(value=v, params={"x": v}, distributions=X))
    run(study, 0, 1000, 0.1)
    run(study, 0, 1001, math.inf, fail_reason="crash")  # the worst value a failed run completes with
    run(study, 1, 1000, 0.3)
    ranked = confirmed(study)
    assert [c.trial.number for c in ranked] == [1, 0] and ranked[1].mean == math.inf
    assert baseline_confirmed(study) is None


def test_values_near_the_float_limit_give_inf_not_an_error() -> None:
    study = optuna.create_study(direction="maximize")
    study.add_trial(create_trial(value=1.0, params={"x": 0.5}, distributions=X))
    run(study, 0, 1000, 1.5e308)  # a planted reward: their sum overflows a float
    run(study, 0, 1001, 1.7e308)
    (c,) = confirmed(study)
    assert c.mean == pytest.approx(1.6e308) and c.std == pytest.approx(math.sqrt(2) * 1e307)
    run(study, 0, 1002, -1.7e308)  # a spread past the float limit
    (c,) = confirmed(study)
    assert math.isfinite(c.mean) and c.std == math.inf
