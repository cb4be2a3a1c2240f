"""A proxy search's spend in the target's currency (:mod:`hpo.record._cost`): a proxy step counts at the ratio of the
study's own measured wall time per step, proxy over target, never at an assumed one, and the spend is split four ways
(proxy search, target search, confirmation, baseline)."""

from __future__ import annotations

from typing import Any

import pytest
from optuna.trial import FrozenTrial, create_trial

from hpo.record import ATTR_BASELINE, ATTR_CONFIRM_OF, ATTR_FIDELITY, ATTR_PROMOTED_FROM, PROXY, TARGET, study_cost


def _t(steps: int, wall: float, fidelity: str = TARGET, system: dict[str, Any] | None = None) -> FrozenTrial:
    return create_trial(value=1.0, user_attrs={"last_step": steps, "total_steps": 10, "wall_time_s": wall},
                        system_attrs={ATTR_FIDELITY: fidelity, **(system or {})})


def _trials(proxy_wall: float) -> list[FrozenTrial]:
    return [_t(10, proxy_wall, PROXY), _t(10, proxy_wall, PROXY), _t(10, proxy_wall, PROXY),  # the proxy search
            _t(4, 8.0, system={ATTR_PROMOTED_FROM: 0}), _t(10, 20.0),  # a promoted run and a fallback trial
            _t(10, 20.0, system={ATTR_CONFIRM_OF: 4, "hpo:confirm_seed": 1000}),
            _t(10, 20.0, system={ATTR_CONFIRM_OF: -1, "hpo:confirm_seed": 1000, ATTR_BASELINE: True})]


def test_a_proxy_step_costs_its_measured_ratio_to_a_target_step() -> None:
    cost = study_cost(_trials(proxy_wall=5.0))
    target_per_step = (8 + 20 + 20 + 20) / (4 + 10 + 10 + 10)  # 2.0 s
    assert cost.proxy_ratio == pytest.approx(0.5 / target_per_step)  # 0.5 s a proxy step
    assert cost.split == pytest.approx({"proxy search": 30 * 0.25 / 10, "target search": 1.4, "confirmation": 1.0,
                                        "baseline": 1.0})
    assert cost.total_runs == pytest.approx(0.75 + 1.4 + 2.0)
    # measured, not assumed: proxy runs twice as slow cost twice as much
    assert cost.proxy_ratio is not None
    assert study_cost(_trials(proxy_wall=10.0)).proxy_ratio == pytest.approx(2 * cost.proxy_ratio)
    assert "30 proxy steps at a measured 0.25 target step each" in cost.text()
    assert cost.text().startswith("4.2 target full-run equivalents (0.8 proxy search + 1.4 target search + 1.0 "
                                  "confirmation + 1.0 baseline")


def test_before_a_target_run_the_proxy_is_not_counted_and_says_so() -> None:
    cost = study_cost([_t(10, 5.0, PROXY), _t(6, 3.0, PROXY)])
    assert cost.proxy_ratio is None and cost.proxy_steps == 16 and cost.total_runs == 0.0
    assert "16 proxy steps not counted yet: their cost ratio to a target step is measured once a target run has " \
           "finished" in cost.text()
