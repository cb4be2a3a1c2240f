"""Racing confirmation (``hpo/study/_compare/_race.py``): its decisions (:func:`~hpo.study._compare.race_step`) on
synthetic values with known answers, and which run is another's twin."""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from hpo.record import ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED
from hpo.record._attrs import PBT_INDEX
from hpo.study._compare import race_step, twin_of, welch

KW = {"resolution": 0.01, "min_seeds": 2, "max_seeds": 4}


def test_nothing_is_dropped_or_decided_before_min_seeds() -> None:
    step = race_step({1: [0.95], 2: [0.10]}, [0.5], True, **KW)
    assert step.leader == 1 and step.dropped == () and step.end is None and step.baseline_more


def test_a_candidate_behind_on_every_seed_is_dropped_where_welch_could_not_tell() -> None:
    """Seeds move both settings together (0.9 / 0.7): unpaired, the spread hides a 0.05 gap; paired, it is exact."""
    values = {1: [0.90, 0.70], 2: [0.85, 0.65]}
    w = welch(values[1], values[2])
    assert w is not None and not w.excludes_zero
    step = race_step(values, None, True, **KW)
    assert step.leader == 1 and step.dropped == (2,) and step.end == "separated"
    assert step.gaps[2] is not None and step.gaps[2].diff == pytest.approx(0.05)


def test_candidates_within_the_resolution_end_the_race_tied() -> None:
    values = {1: [0.950, 0.960, 0.955], 2: [0.949, 0.958, 0.956]}
    step = race_step(values, None, True, **{**KW, "max_seeds": 5})
    assert step.dropped == () and step.end == "tied"  # interval [-0.0031, +0.0045] lies within +-0.01
    assert race_step(values, None, True, **{**KW, "resolution": 0.001, "max_seeds": 5}).end is None  # not yet


def test_the_race_goes_on_while_unresolved_and_stops_at_the_seed_cap() -> None:
    noisy = {1: [0.95, 0.86], 2: [0.90, 0.90]}
    assert race_step(noisy, None, True, **KW).end is None
    capped = {1: [0.95, 0.86, 0.93, 0.90], 2: [0.90, 0.90, 0.90, 0.90]}
    step = race_step(capped, None, True, **KW)
    assert step.dropped == () and step.end == "seed cap"


def test_a_candidate_with_a_failed_run_is_dropped_at_once() -> None:
    step = race_step({1: [0.9], 2: [-math.inf], 3: [0.8]}, None, True, **KW)
    assert step.leader == 1 and step.dropped == (2,) and step.end is None


def test_minimizing_flips_who_leads() -> None:
    step = race_step({1: [0.30, 0.40], 2: [0.20, 0.30]}, None, False, **KW)
    assert step.leader == 2 and step.dropped == (1,)


def test_ties_go_to_the_better_search_value_first() -> None:
    assert race_step({7: [0.9, 0.8], 3: [0.9, 0.8]}, None, True, **KW).leader == 7


def test_the_baseline_runs_until_the_improvement_over_it_excludes_zero() -> None:
    leader = {1: [0.95, 0.96]}
    assert race_step(leader, [0.50], True, **KW).baseline_more  # fewer than min_seeds
    assert not race_step(leader, [0.80, 0.82], True, **KW).baseline_more  # [+0.09, +0.09 +- ...] excludes 0
    assert race_step(leader, [0.60, 1.00], True, **KW).baseline_more  # too spread: another seed
    assert not race_step(leader, [0.60, 1.00, 0.9, 0.7], True, **KW).baseline_more  # at max_seeds: no more


def test_the_baseline_is_judged_on_the_held_out_values_when_both_have_them() -> None:
    leader = {1: [0.95, 0.96]}
    base = [0.80, 0.82]  # validation: clearly worse
    tests = {1: [0.90, 0.70]}  # but on the test split the leader is spread out
    assert race_step(leader, base, True, **KW, tests=tests, baseline_tests=[0.80, 0.81]).baseline_more
    assert not race_step(leader, base, True, **KW, tests={1: [0.90, 0.91]}, baseline_tests=[0.80, 0.81]).baseline_more


def _queued(study: optuna.Study, **attrs: object) -> FrozenTrial:
    study.enqueue_trial({}, skip_if_exists=False)
    trial = study.trials[-1]
    for key, value in attrs.items():
        study._storage.set_trial_system_attr(trial._trial_id, key, value)
    return study.trials[-1]


def test_a_twin_is_the_same_trial_seed_and_schedule_range() -> None:
    """Two drivers queueing one race run: the later is surplus. The ranges of one PBT schedule's confirmation share
    trial and seed, and each is a run of its own (found by the real PBT study in test_pbt_real.py)."""
    study = optuna.create_study()
    first = _queued(study, **{ATTR_CONFIRM_OF: 3, ATTR_CONFIRM_SEED: 1000})
    twin = _queued(study, **{ATTR_CONFIRM_OF: 3, ATTR_CONFIRM_SEED: 1000})
    other_seed = _queued(study, **{ATTR_CONFIRM_OF: 3, ATTR_CONFIRM_SEED: 1001})
    assert twin_of(study, twin) == first.number and twin_of(study, first) is None and twin_of(study, other_seed) is None
    seg0 = _queued(study, **{ATTR_CONFIRM_OF: 6, ATTR_CONFIRM_SEED: 1000, PBT_INDEX: 0})
    seg1 = _queued(study, **{ATTR_CONFIRM_OF: 6, ATTR_CONFIRM_SEED: 1000, PBT_INDEX: 1})
    study._storage.set_trial_state_values(seg0._trial_id, TrialState.COMPLETE, [0.5])
    assert twin_of(study, seg1) is None
    seg1_again = _queued(study, **{ATTR_CONFIRM_OF: 6, ATTR_CONFIRM_SEED: 1000, PBT_INDEX: 1})
    assert twin_of(study, seg1_again) == seg1.number
