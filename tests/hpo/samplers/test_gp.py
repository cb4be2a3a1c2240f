"""The GP sampler told about pruned trials (hpo/samplers/_gp.py), against Optuna's own GPSampler on one study."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from hpo.experiment._space import SamplerSpec
from hpo.samplers._gp import PrunedAwareGPSampler, as_completed
from hpo.study._optuna import make_sampler

X = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}


def study_with_a_pruned_region(sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    """Two completed trials at x = 0.8, 0.9 (value 0.5), five pruned ones at x <= 0.25 that last reported 0.0, and
    one pruned before its first report (nothing to learn from)."""
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for x in (0.8, 0.9):
        study.add_trial(optuna.trial.create_trial(params={"x": x}, distributions=X, value=0.5))
    for x in (0.05, 0.1, 0.15, 0.2, 0.25):
        study.add_trial(optuna.trial.create_trial(params={"x": x}, distributions=X, state=TrialState.PRUNED,
                                                  intermediate_values={5: 0.3, 10: 0.0}))
    study.add_trial(optuna.trial.create_trial(params={"x": 0.5}, distributions=X, state=TrialState.PRUNED))
    return study


def proposals(sampler: optuna.samplers.BaseSampler, n: int = 4) -> list[float]:
    study = study_with_a_pruned_region(sampler)
    out = []
    for _ in range(n):
        t = study.ask(X)
        out.append(t.params["x"])
        study.tell(t, state=TrialState.FAIL)  # ignored by both samplers: every proposal sees the same history
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_pruned_trials_steer_the_gp_away_from_where_they_were_pruned(seed: int) -> None:
    plain = proposals(optuna.samplers.GPSampler(seed=seed, n_startup_trials=2))
    aware = proposals(PrunedAwareGPSampler(seed=seed, n_startup_trials=2))
    assert all(x <= 0.25 for x in plain)  # Optuna's GP sees two equal values and explores the pruned region
    assert all(x > 0.3 for x in aware)


def test_a_pruned_trial_counts_at_its_last_reported_value() -> None:
    study = study_with_a_pruned_region(optuna.samplers.RandomSampler(seed=0))
    pruned = [t for t in study.trials if t.state == TrialState.PRUNED]
    seen = as_completed(pruned[0])
    assert seen is not None and seen.state == TrialState.COMPLETE and seen.values == [0.0]
    assert seen.params == pruned[0].params and seen.number == pruned[0].number
    assert as_completed(pruned[-1]) is None  # pruned before any report


def test_the_gp_spec_makes_the_aware_sampler() -> None:
    assert isinstance(make_sampler(SamplerSpec(type="gp", n_startup_trials=2), 0), PrunedAwareGPSampler)
