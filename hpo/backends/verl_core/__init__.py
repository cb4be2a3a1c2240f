"""The ``verl_core`` trainer as a backend (``_backend``) and its check of an experiment with ``verl_core.config``
(``_check``).

May import: ``hpo.experiment``, ``hpo.execution``, ``hpo.analysis``, ``hpo.backends`` (its base and pre-flight)."""

from hpo.backends.verl_core._backend import VerlCoreBackend
from hpo.backends.verl_core._check import DRIVER_KEYS, check_trainer

__all__ = ["DRIVER_KEYS", "VerlCoreBackend", "check_trainer"]
