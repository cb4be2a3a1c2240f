"""Telling confirmed settings apart: Student's t quantiles against tables, Welch's interval against a hand
computation, the tie report and the documented preference among tied settings (real Optuna in-memory studies)."""

from __future__ import annotations

import math
import statistics

import optuna
import pytest
from optuna.distributions import FloatDistribution

from hpo.study._compare import improvement, t_quantile, verdict, welch
from hpo.study._confirm import (
    ATTR_BASELINE,
    ATTR_CONFIRM_OF,
    ATTR_CONFIRM_SEED,
    BASELINE_OF,
    baseline_confirmed,
    confirmed,
)

DIST = {"lr": FloatDistribution(1e-7, 1e-2, log=True)}


@pytest.mark.parametrize("df, q", [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (10, 2.228), (30, 2.042),
                                   (1e9, 1.960)])
def test_t_quantile_matches_the_tables(df: float, q: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(q, abs=1e-3)


def test_welch_interval_by_hand() -> None:
    a, b = [0.96, 0.95, 0.97], [0.80, 0.78, 0.85]
    d = welch(a, b)
    assert d is not None
    va, vb = statistics.variance(a) / 3, statistics.variance(b) / 3
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    half = t_quantile(0.975, df) * math.sqrt(va + vb)
    assert d.diff == pytest.approx(statistics.fmean(a) - statistics.fmean(b))
    assert (d.low, d.high, d.df) == pytest.approx((d.diff - half, d.diff + half, df))
    assert d.excludes_zero
    assert welch([1.0], [2.0, 3.0]) is None  # one run: no spread to judge by
    same = welch([0.5, 0.5], [0.4, 0.4])
    assert same is not None and same.low == same.high == pytest.approx(0.1)
    worse = improvement([1.0, 1.1], [0.5, 0.6], maximize=False)  # a loss: lower is better
    assert worse is not None and worse.diff == pytest.approx(-0.5)


def _study(settings: dict[float, list[tuple[float, dict[int, float]]]], baseline: tuple[float, ...] = (),
           collapsed: tuple[float, int] | None = None) -> optuna.Study:
    """A study with one search trial per ``lr`` and its confirmation runs (value, curve), seeds 1000..."""
    study = optuna.create_study(direction="maximize")
    for lr, runs in settings.items():
        search = optuna.create_trial(value=max(v for v, _ in runs), params={"lr": lr}, distributions=DIST)
        study.add_trial(search)
        number = study.trials[-1].number
        for i, (value, curve) in enumerate(runs):
            study.add_trial(optuna.create_trial(
                value=value, params={"lr": lr}, distributions=DIST, intermediate_values=curve,
                user_attrs={"stop_reason": "collapsed:kl_blowup"} if collapsed == (lr, i) else {},
                system_attrs={ATTR_CONFIRM_OF: number, ATTR_CONFIRM_SEED: 1000 + i}))
    for i, value in enumerate(baseline):
        study.add_trial(optuna.create_trial(value=value, params={}, distributions={}, system_attrs={
            ATTR_CONFIRM_OF: BASELINE_OF, ATTR_CONFIRM_SEED: 1000 + i, ATTR_BASELINE: True}))
    return study


SLOW = {0: 0.0, 10: 0.5, 20: 0.9, 30: 0.96}  # reaches its plateau at step 30
FAST = {0: 0.0, 10: 0.955, 20: 0.96, 30: 0.96}  # at step 10


def test_overlapping_settings_are_tied_and_the_faster_one_is_preferred() -> None:
    study = _study({1e-3: [(0.965, SLOW), (0.950, SLOW), (0.962, SLOW)],  # best mean
                    1e-5: [(0.960, FAST), (0.952, FAST), (0.958, FAST)],  # within the spread, plateaus sooner
                    1e-6: [(0.80, SLOW), (0.81, SLOW), (0.79, SLOW)]})  # clearly worse
    ranked = confirmed(study)
    v = verdict(ranked, maximize=True, tolerance=0.01)
    by_lr = {c.trial.params["lr"]: c for c in ranked}
    assert v.top is by_lr[1e-3]
    assert [c.trial.params["lr"] for c in v.tied] == [1e-5]  # 1e-6 is told apart
    gap = v.gaps[by_lr[1e-6].trial.number]
    assert gap is not None and gap.excludes_zero
    assert v.plateau_steps[by_lr[1e-3].trial.number] == 30 and v.plateau_steps[by_lr[1e-5].trial.number] == 10
    assert v.pick is by_lr[1e-5]


def test_clearly_different_settings_are_not_tied() -> None:
    study = _study({1e-3: [(0.97, SLOW), (0.968, SLOW), (0.972, SLOW)],
                    1e-5: [(0.90, FAST), (0.905, FAST), (0.895, FAST)]})
    v = verdict(confirmed(study), maximize=True, tolerance=0.01)
    assert v.tied == () and v.pick is v.top and v.top.trial.params["lr"] == 1e-3


def test_a_tied_setting_with_a_collapsed_run_is_not_preferred() -> None:
    study = _study({1e-3: [(0.965, SLOW), (0.950, SLOW), (0.962, SLOW)],
                    1e-5: [(0.960, FAST), (0.952, FAST), (0.958, FAST)]}, collapsed=(1e-5, 1))
    fast = next(t.number for t in study.trials if t.params == {"lr": 1e-5} and ATTR_CONFIRM_OF not in t.system_attrs)
    v = verdict(confirmed(study), maximize=True, tolerance=0.01)
    assert [c.trial.number for c in v.tied] == [fast] and v.bad[fast] == 1 and v.pick is v.top


def test_the_baseline_runs_are_not_a_confirmed_setting() -> None:
    study = _study({1e-5: [(0.96, FAST), (0.95, FAST)]}, baseline=(0.80, 0.82))
    assert [c.trial.params for c in confirmed(study)] == [{"lr": 1e-5}]
    base = baseline_confirmed(study)
    assert base is not None and base.values == (0.80, 0.82) and base.seeds == (1000, 1001)
