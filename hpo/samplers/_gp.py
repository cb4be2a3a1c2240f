"""Optuna's GP sampler, told about pruned trials (``study.sampler.type: gp``).

Optuna's ``GPSampler`` fits its Gaussian process on COMPLETE trials only, so with a pruner it never learns where
trials get pruned: measured on ``kl_lr_clip`` (sampler seed 0), after 5 completed trials it proposed the same two
regions (learning rate 1e-7, and kl_coef ~0.4) for the 11 trials left, every one pruned at its 3rd evaluation.
TPE does not have this blind spot (it ranks pruned trials below the completed ones). Here the GP sees each pruned
trial as completed with its last reported value: the objective's running aggregate when the pruner stopped it,
which is the pessimistic estimate the pruner acted on (below the median of the trials that went on).

Importing this module imports torch (through Optuna's GP code): only the ``gp`` sampler does.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState


def as_completed(t: FrozenTrial) -> FrozenTrial | None:
    """A pruned trial as a completed one valued at its last intermediate value (None when it reported none)."""
    if not t.intermediate_values:
        return None
    step = max(t.intermediate_values)
    return FrozenTrial(number=t.number, state=TrialState.COMPLETE, value=None,
                       values=[t.intermediate_values[step]], datetime_start=t.datetime_start,
                       datetime_complete=t.datetime_complete, params=t.params, distributions=t.distributions,
                       user_attrs=t.user_attrs, system_attrs=t.system_attrs,
                       intermediate_values=t.intermediate_values, trial_id=t._trial_id)


class _PrunedAsCompleted:
    """The study as the GP should see it: pruned trials among the completed ones (everything else delegated)."""

    def __init__(self, study: optuna.Study) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None,
                    use_cache: bool = False) -> list[FrozenTrial]:
        if states is None or TrialState.COMPLETE not in states:
            return self._study._get_trials(deepcopy=deepcopy, states=states, use_cache=use_cache)
        wanted = (*[s for s in TrialState if s in states], TrialState.PRUNED)
        out = []  # in the storage's order (by number), like the study's own
        for t in self._study._get_trials(deepcopy=deepcopy, states=wanted, use_cache=use_cache):
            if t.state == TrialState.PRUNED and TrialState.PRUNED not in states:
                c = as_completed(t)
                if c is not None:
                    out.append(c)
            else:
                out.append(t)
        return out


class PrunedAwareGPSampler(optuna.samplers.GPSampler):
    """``GPSampler`` whose model also sees pruned trials (:func:`as_completed`)."""

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return super().sample_relative(_PrunedAsCompleted(study), trial, search_space)  # type: ignore[arg-type]
