"""The ``verl_core`` trainer as a backend (``_backend``), what it calls things (``_names``: commands, metric names,
the held-out split, code keys), its check of an experiment with ``verl_core.config`` (``_check``), its memory
pre-flight with ``verl_core.memory`` (``_memory``) and its checkpoints, which retries and PBT segments continue
(``_resume``).

May import: ``hpo.experiment``, ``hpo.execution``, ``hpo.analysis``, ``hpo.backends``' contract modules (its base,
attempt, features, pre-flight, replay, ...), and its own trainer ``verl_core`` (torch-free modules only, imported
lazily)."""

from hpo.backends.verl_core._backend import VerlCoreBackend, VerlCoreCommand
from hpo.backends.verl_core._check import DRIVER_KEYS, check_trainer

BACKEND = VerlCoreBackend  # what the registry runs for trial.backend: verl_core

__all__ = ["BACKEND", "DRIVER_KEYS", "VerlCoreBackend", "VerlCoreCommand", "check_trainer"]
