"""The study loop: the ``Driver`` that asks, runs and tells trials beside other drivers, stale-trial recovery and
heartbeats, seed confirmation and checkpoint retention. What a trial runs is its backend's (:mod:`hpo.backends`),
where the study lives is :mod:`hpo.storages`, how values are chosen :mod:`hpo.samplers`, what the stored
attributes mean :mod:`hpo.record`.

Modules: ``_driver`` (the loop), ``_slots`` (claiming the target), ``_trial`` (one trial to its outcome),
``_trial_files`` (its directory, environment and files), ``_watch`` (reporting, pruning and early stopping per
metrics line), ``_optuna`` (sampler, pruner, creating and loading the study), ``_recovery``, ``_confirm``,
``_compare``, ``_checkpoints``, ``_ray_trials``, ``_population`` (PBT's segments as trials), ``_errors``,
``_progress``.

May import: ``hpo.backends``, ``hpo.storages``, ``hpo.samplers``, ``hpo.record``, ``hpo.execution``,
``hpo.experiment``, ``hpo.analysis``; never ``hpo.reporting`` (progress goes to a ``Progress`` the caller hands in)."""

from hpo.storages._retrying import RetryingStorage, StorageUnavailable
from hpo.storages._storage import open_storage
from hpo.study._confirm import Confirmed, confirmed, queue_confirmations
from hpo.study._driver import Driver
from hpo.study._errors import DriverError, TrialInterrupted
from hpo.study._optuna import load_stored, make_pruner, make_sampler, open_study
from hpo.study._progress import Progress
from hpo.study._slots import n_finished

__all__ = ["Confirmed", "Driver", "DriverError", "Progress", "RetryingStorage", "StorageUnavailable",
           "TrialInterrupted", "confirmed", "load_stored", "make_pruner", "make_sampler", "n_finished", "open_storage",
           "open_study", "queue_confirmations"]
