"""Model-size fidelity for the sampler and the pruner (``study.fidelity.proxy``): a study holds search trials on the
proxy model and on the target (system attr :data:`~hpo.record.ATTR_FIDELITY`), whose values are not on one scale, so
each sees only its own kind.

* :class:`FidelitySampler` decides a new trial's fidelity when Optuna creates it (``before_trial``, under the
  driver's ask lock): ``proxy`` until the study's check of the proxy (:data:`~hpo.record.ATTR_FIDELITY_CHECK`) says
  it does not rank settings as the target does, ``target`` from then on; a queued trial (a promoted setting, a retry)
  keeps the fidelity it was queued with. Each fidelity has a sampler of its own, which sees the study's trials of
  that fidelity only (:class:`FidelityView`): the target's search models the target's values, never the proxy's.
* :class:`FidelityPruner`: the pruner sees the trials of the pruned trial's fidelity only (successive halving's rungs
  and the median rule compare a target trial with target trials).
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from hpo.record import ATTR_FIDELITY, ATTR_FIDELITY_CHECK, PROXY, TARGET, fidelity_of, is_confirm


class FidelityView:
    """``study`` as a sampler or pruner of one fidelity sees it: every trial of another fidelity hidden."""

    def __init__(self, study: optuna.Study, fidelity: str) -> None:
        self._study = study
        self._fidelity = fidelity

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _keep(self, trials: list[FrozenTrial]) -> list[FrozenTrial]:
        return [t for t in trials if fidelity_of(t) == self._fidelity]

    def get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        return self._keep(self._study.get_trials(deepcopy=deepcopy, states=states))

    def _get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None,
                    use_cache: bool = False) -> list[FrozenTrial]:
        return self._keep(self._study._get_trials(deepcopy=deepcopy, states=states, use_cache=use_cache))

    @property
    def trials(self) -> list[FrozenTrial]:
        return self.get_trials()


def search_fidelity(study: optuna.Study) -> str:
    """The fidelity of the next new search trial: ``target`` once the proxy's check says it does not hold (the rest
    of the search runs on the target), else ``proxy``."""
    check = study._storage.get_study_user_attrs(study._study_id).get(ATTR_FIDELITY_CHECK)
    return TARGET if isinstance(check, dict) and check.get("holds") is False else PROXY


class FidelitySampler(BaseSampler):
    """One sampler per fidelity, each over the study's trials of its fidelity (see the module docstring)."""

    def __init__(self, proxy: BaseSampler, target: BaseSampler) -> None:
        self._samplers = {PROXY: proxy, TARGET: target}
        self._decided: dict[int, str] = {}  # trial id -> its fidelity, for the trials this driver created

    def _of(self, trial: FrozenTrial) -> str:
        found = trial.system_attrs.get(ATTR_FIDELITY)
        if found in self._samplers:
            return fidelity_of(trial)
        return self._decided.get(trial._trial_id, PROXY)

    def _view(self, study: optuna.Study, trial: FrozenTrial) -> tuple[BaseSampler, Any]:
        fidelity = self._of(trial)
        return self._samplers[fidelity], FidelityView(study, fidelity)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        fidelity = trial.system_attrs.get(ATTR_FIDELITY)
        if is_confirm(trial):  # a confirmation run (queued with its values) runs on the target
            fidelity = TARGET
        elif fidelity not in self._samplers:  # a new trial: the search's current fidelity, recorded before it runs
            fidelity = search_fidelity(study)
            study._storage.set_trial_system_attr(trial._trial_id, ATTR_FIDELITY, fidelity)
        self._decided[trial._trial_id] = str(fidelity)
        sampler, view = self._view(study, trial)
        sampler.before_trial(view, trial)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        sampler, view = self._view(study, trial)
        return sampler.infer_relative_search_space(view, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        sampler, view = self._view(study, trial)
        return sampler.sample_relative(view, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        sampler, view = self._view(study, trial)
        return sampler.sample_independent(view, trial, param_name, param_distribution)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        sampler, view = self._view(study, trial)
        sampler.after_trial(view, trial, state, values)
        self._decided.pop(trial._trial_id, None)

    def reseed_rng(self) -> None:
        for sampler in self._samplers.values():
            sampler.reseed_rng()


class FidelityPruner(optuna.pruners.BasePruner):
    """The pruner of ``inner``, shown the trials of the pruned trial's fidelity only."""

    def __init__(self, inner: optuna.pruners.BasePruner) -> None:
        self._inner = inner

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        return self._inner.prune(FidelityView(study, fidelity_of(trial)), trial)  # type: ignore[arg-type]


def with_fidelity(study: optuna.Study, target_sampler: BaseSampler) -> None:
    """Give ``study`` (opened by a driver of a proxy search) its fidelity-aware sampler and pruner: its own sampler
    for the proxy's trials, ``target_sampler`` for the target's."""
    if not isinstance(study.sampler, FidelitySampler):
        study.sampler = FidelitySampler(study.sampler, target_sampler)
    if not isinstance(study.pruner, FidelityPruner):
        study.pruner = FidelityPruner(study.pruner)
