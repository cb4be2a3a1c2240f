"""What a study spent (:mod:`hpo.record._cost`), from stored trials whose attributes may hold anything."""

from __future__ import annotations

import math
from typing import Any

from optuna.trial import FrozenTrial, TrialState, create_trial

from hpo.record import ATTR_CONFIRM_OF, full_steps, steps_run, study_cost


def _t(user: dict[str, Any], inter: dict[int, float] | None = None, confirm: bool = False,
       state: TrialState = TrialState.COMPLETE) -> FrozenTrial:
    return create_trial(state=state, value=1.0 if state == TrialState.COMPLETE else None, user_attrs=user,
                        intermediate_values=inter or {}, system_attrs={ATTR_CONFIRM_OF: 3} if confirm else {})


def test_a_trial_costs_the_steps_it_ran_itself() -> None:
    assert steps_run(_t({"last_step": 60})) == 60
    assert steps_run(_t({"last_step": 60, "resumed_from_step": 40})) == 20  # a retry continued a checkpoint
    assert steps_run(_t({}, {0: 0.1, 10: 0.5, 20: 0.7}, state=TrialState.PRUNED)) == 20  # no last_step: its curve
    assert steps_run(_t({"last_step": 60, "baseline_reused": "other#4"}, confirm=True)) == 0
    assert steps_run(_t({"last_step": "60", "resumed_from_step": True})) == 0  # junk from shared storage
    assert steps_run(_t({"last_step": 5, "resumed_from_step": 9})) == 0


def test_study_cost_in_full_run_equivalents() -> None:
    trials = [_t({"last_step": 60, "total_steps": 60}), _t({"last_step": 10, "total_steps": 60},
                                                             state=TrialState.PRUNED),
              _t({"last_step": 30, "total_steps": 60}, state=TrialState.FAIL),
              _t({"last_step": 60, "total_steps": 60}, confirm=True),
              _t({"last_step": 60, "total_steps": 60, "baseline_reused": "a#1"}, confirm=True)]
    cost = study_cost(trials)
    assert (cost.search_steps, cost.confirm_steps, cost.full, cost.reused_runs) == (100, 60, 60, 1)
    assert cost.total_runs == 160 / 60 and cost.search_runs == 100 / 60
    assert "2.7 full-run equivalents (1.7 search + 1.0 confirmation; a full run = 60 steps, 1 baseline run(s) " \
           "reused)" == cost.text()


def test_without_a_recorded_length_the_cost_is_in_steps() -> None:
    cost = study_cost([_t({"last_step": 7})])
    assert cost.full is None and math.isnan(cost.total_runs) and cost.text() == "7 steps"
    assert full_steps([_t({"total_steps": -3}), _t({"total_steps": 40}, confirm=True)]) is None
