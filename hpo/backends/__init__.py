"""What a trial runs: the ``verl_core`` trainer (config checks and the memory pre-flight, ``_preflight``) and real
verl (``verl/``: argv, environment, composed-config checks in verl's own interpreter, data, resume points).

May import: ``hpo.experiment``, ``hpo.execution``, ``hpo.analysis``."""

from hpo.backends._check import check_space, load_checked_space

__all__ = ["check_space", "load_checked_space"]
