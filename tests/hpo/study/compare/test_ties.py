"""Telling confirmed settings apart (``hpo/study/_compare/_ties.py``): the tie report and the documented preference
among tied settings (real Optuna in-memory studies): the preference only within ``confirm.resolution`` of the best
mean, the paired test on shared seeds, Welch otherwise, and the diagnosis labels that make a run bad. The intervals
themselves: ``test_intervals.py``."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution

from hpo.study._compare import bad_runs, verdict, welch
from hpo.study._confirm import (
    ATTR_BASELINE,
    ATTR_CONFIRM_OF,
    ATTR_CONFIRM_SEED,
    BASELINE_OF,
    baseline_confirmed,
    confirmed,
)

DIST = {"lr": FloatDistribution(1e-7, 1e-2, log=True)}


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


# ----------------------------------------------------------------------------- never recommend the worse of two
Run = tuple[int, float, dict[int, float], dict[str, object]]  # seed, value, curve, user attrs
X_DIST = {"x": FloatDistribution(0.0, 1.0)}


def runs_study(confirm: dict[int, list[Run]], n_search: int = 5, storage: str | None = None,
               name: str | None = None) -> optuna.Study:
    """Search trials 0..n_search-1 (param ``x`` = number / 10, the key fake.x of ``fake_space``) and the given
    confirmation runs of some of them."""
    study = optuna.create_study(direction="maximize", storage=storage, study_name=name)
    for i in range(n_search):
        study.add_trial(optuna.create_trial(value=0.5 + 0.01 * i, params={"x": i / 10}, distributions=X_DIST))
    for number, runs in confirm.items():
        for seed, value, curve, attrs in runs:
            study.add_trial(optuna.create_trial(
                value=value, params={"x": number / 10}, distributions=X_DIST, intermediate_values=curve,
                user_attrs=attrs, system_attrs={ATTR_CONFIRM_OF: number, ATTR_CONFIRM_SEED: seed}))
    return study


def _curve(plateau: int, value: float) -> dict[int, float]:
    """A run that reaches ``value`` at step ``plateau`` (and stays there)."""
    return {0: 0.1, plateau // 3: 0.5, 2 * plateau // 3: value - 0.05, plateau: value, 60: value}


def seed0_study(seeds: tuple[int, int] = (1000, 1001), storage: str | None = None,
                name: str | None = None) -> optuna.Study:
    """Seed 0 of the search_cost benchmark's kl_lr re-run (issue 51): the race ended after two seeds with trial 2
    (0.979, 0.973; plateau at step 45) and trial 4 (0.917, 0.856; plateau at step 35) not separated."""
    return runs_study({2: [(seeds[0], 0.979, _curve(45, 0.979), {}), (seeds[1], 0.973, _curve(45, 0.973), {})],
                       4: [(seeds[0], 0.917, _curve(35, 0.917), {}), (seeds[1], 0.856, _curve(35, 0.856), {})]},
                      storage=storage, name=name)


def test_not_separated_but_apart_by_more_than_the_resolution_the_better_mean_wins() -> None:
    """Before: the two were 'not told apart' and trial 4, 0.09 worse on both seeds, was preferred for its earlier
    plateau."""
    ranked = confirmed(seed0_study())
    v = verdict(ranked, maximize=True, tolerance=0.01)  # resolution: the tolerance (kl_lr's plateau_min_delta)
    assert v.plateau_steps == {2: 45, 4: 35}
    gap = v.gaps[4]
    assert gap is not None and not gap.excludes_zero and gap.diff == pytest.approx(0.0895)  # two seeds: wide
    assert v.top.trial.number == 2 and v.pick.trial.number == 2
    assert v.tied == () and [c.trial.number for c in v.unseparated] == [4] and v.resolution == 0.01


def test_within_the_resolution_the_safer_cheaper_setting_is_still_preferred() -> None:
    v = verdict(confirmed(seed0_study()), maximize=True, tolerance=0.01, resolution=0.1)
    assert [c.trial.number for c in v.tied] == [4] and v.unseparated == () and v.pick.trial.number == 4


A = (0.90, 0.70, 0.80)  # seeds move both settings alike
B = (0.88, 0.69, 0.78)  # 0.01-0.02 behind on every seed, and plateaus sooner


def _pair_study(b_seeds: tuple[int, ...]) -> optuna.Study:
    return runs_study({0: [(1000 + i, a, SLOW, {}) for i, a in enumerate(A)],
                       1: [(s, b, FAST, {}) for s, b in zip(b_seeds, B, strict=True)]})


def test_shared_seeds_are_compared_paired_and_disjoint_seeds_by_welch() -> None:
    w = welch(A, B)
    assert w is not None and not w.excludes_zero  # unpaired, the seeds' spread hides the gap
    shared = verdict(confirmed(_pair_study((1000, 1001, 1002))), maximize=True, tolerance=0.01, resolution=0.05)
    gap = shared.gaps[1]
    assert gap is not None and gap.test == "paired" and gap.excludes_zero and gap.n == 3
    assert shared.tied == () and shared.pick.trial.number == 0  # separated: no preference, whatever the resolution
    apart = verdict(confirmed(_pair_study((2000, 2001, 2002))), maximize=True, tolerance=0.01, resolution=0.05)
    gap = apart.gaps[1]
    assert gap is not None and gap.test == "Welch" and not gap.excludes_zero
    assert gap.low == pytest.approx(w.low) and gap.high == pytest.approx(w.high)
    assert [c.trial.number for c in apart.tied] == [1] and apart.pick.trial.number == 1  # within 0.05: sooner


@pytest.mark.parametrize("attrs, bad", [
    ({"diagnosis": "reward_hacking", "diagnosis_labels": ["reward_hacking"]}, 1),
    ({"diagnosis": "kl_blowup", "diagnosis_labels": ["kl_blowup", "reward_hacking"]}, 1),  # labelled, not stopped
    ({"diagnosis": "length_clipping", "diagnosis_labels": ["length_clipping"]}, 0),  # clipped, not broken
    ({"diagnosis": "healthy", "diagnosis_labels": []}, 0),
])
def test_a_run_labelled_collapsed_or_reward_hacking_counts_as_bad(attrs: dict[str, object], bad: int) -> None:
    study = runs_study({0: [(1000, 0.965, SLOW, {}), (1001, 0.950, SLOW, {}), (1002, 0.962, SLOW, {})],
                        1: [(1000, 0.960, FAST, {}), (1001, 0.952, FAST, attrs), (1002, 0.958, FAST, {})]})
    v = verdict(confirmed(study), maximize=True, tolerance=0.01)
    assert [c.trial.number for c in v.tied] == [1] and v.bad[1] == bad
    assert v.pick.trial.number == (0 if bad else 1)  # a setting that hacked its reward under a seed is riskier
    assert bad_runs(next(c for c in confirmed(study) if c.trial.number == 1)) == bad


@pytest.mark.parametrize("value", [-0.01, float("nan"), float("inf")])
def test_a_resolution_below_zero_or_not_finite_is_refused(tmp_path: Path, value: float) -> None:
    from hpo.backends import load_space
    from hpo.experiment import SpaceError
    from tests.hpo.conftest import fake_space

    with pytest.raises(SpaceError, match=rf"fake.yaml: study\.confirm\.resolution: .*{value}"):
        load_space(str(fake_space(tmp_path, study={"confirm": {"resolution": value}})), check=False)
    zero = load_space(str(fake_space(tmp_path, study={"confirm": {"resolution": 0}})), check=False)
    assert zero.study.confirm.resolution == 0  # 0: only the test decides; any gap it cannot separate, the better mean
