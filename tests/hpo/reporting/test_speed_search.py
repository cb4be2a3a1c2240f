"""What a throughput study's search says of its ranking (``hpo/reporting/_speed_search.py``): how busy the host was
while the trials ran, and when the fastest two are within the trials' own spread (the ranking may be noise)."""

from __future__ import annotations

import optuna

from hpo.reporting._speed_search import speed_search_summary


def _measured(tp: float, value: float, cv: float, busy: float) -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(
        value=value, params={"tp": tp}, distributions={"tp": optuna.distributions.CategoricalDistribution(
            [100.0, 104.0, 300.0])}, user_attrs={"throughput_cv": cv, "host_busy": busy, "throughput_steps": 4})


def test_the_summary_says_how_busy_the_host_was_and_when_the_ranking_is_noise() -> None:
    """Two settings 4% apart with a 5% step-to-step spread, measured while other processes took 5% then 60% of the
    CPU: the summary says both; 300 against 100 on a quiet host is no warning."""
    study = optuna.create_study(direction="maximize")
    for tp, value, busy in [(104.0, 104.0, 0.05), (100.0, 100.0, 0.6)]:
        study.add_trial(_measured(tp, value, 0.05, busy))
    text = speed_search_summary(study, study.get_trials())
    assert "host: other processes used 32% of this host's CPU time while the trials ran (median over 2 trials; 5% " \
           "to 60%, the most during trial 1)" in text, text
    assert "warning: the search's ranking may be noise: the fastest (trial 0, 104) and the next (trial 1, 100) are " \
           "3.8% apart, within 2x the trials' own spread" in text and "moved from 5% to 60%" in text, text
    quiet = optuna.create_study(direction="maximize")
    for tp, busy in [(300.0, 0.05), (100.0, 0.1)]:
        quiet.add_trial(_measured(tp, tp, 0.05, busy))
    assert "warning" not in speed_search_summary(quiet, quiet.get_trials())
