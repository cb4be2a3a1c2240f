"""One trial: ``_runner`` runs it (:class:`TrialRunner`: its trainer subprocess on devices of the pool, the
:class:`~hpo.study._watch.Watch`, checkpoint retention), ``_outcome`` says what its ending is recorded as (run attrs,
the values or TrialPruned / TrialFailed, stop and fail reasons: the outcome list is that module's docstring)."""

from hpo.study._trial._outcome import frozen_trial
from hpo.study._trial._runner import TrialRunner, _suggest

__all__ = ["TrialRunner", "_suggest", "frozen_trial"]
