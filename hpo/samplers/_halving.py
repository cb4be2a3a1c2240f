"""Asynchronous successive halving (ASHA, Li et al. 2020) over a study's retry chains: Optuna's
``SuccessiveHalvingPruner`` records each trial's value at every rung it reaches (system attr ``completed_rung_k``) and
promotes a trial past rung k when its value is in the top ``1 / reduction_factor`` of every value recorded at that
rung so far, so several drivers never wait for a rung to fill. A retry of an interrupted trial carries the rungs its
attempt completed (retries copy system attrs) and continues from there; this pruner hides the interrupted attempt
from the competition, so a retry chain's value counts once at each rung, however often its driver died."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial

RETRY_OF = "failed_trial"  # hpo.record.ATTR_RETRY_OF (Optuna's RetryFailedTrialCallback key)


class _Chains:
    """The study as the pruner sees it: every trial but those a retry replaced."""

    def __init__(self, study: optuna.Study) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def get_trials(self, deepcopy: bool = True, states: Any = None) -> list[FrozenTrial]:
        trials = self._study.get_trials(deepcopy=deepcopy, states=states)
        everything = trials if states is None else self._study.get_trials(deepcopy=False)
        replaced = {t.system_attrs.get(RETRY_OF) for t in everything}
        return [t for t in trials if t.number not in replaced]


class ChainHalvingPruner(optuna.pruners.SuccessiveHalvingPruner):
    """Optuna's successive halving, one value per retry chain at each rung (see the module docstring)."""

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        return super().prune(_Chains(study), trial)  # type: ignore[arg-type]
