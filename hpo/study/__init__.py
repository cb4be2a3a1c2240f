"""The study loop: the ``Driver`` that asks, runs and tells trials beside other drivers, the study's storage
(retrying through outages), stale-trial recovery and heartbeats, seed confirmation and checkpoint retention.

May import: ``hpo.backends``, ``hpo.execution``, ``hpo.experiment``, ``hpo.analysis``; never ``hpo.reporting``
(progress goes to a ``Progress`` the caller hands in)."""

from hpo.study._confirm import Confirmed, confirmed, queue_confirmations
from hpo.study._driver import (
    Driver,
    DriverError,
    TrialInterrupted,
    load_stored,
    make_pruner,
    make_sampler,
    n_finished,
    open_study,
)
from hpo.study._progress import Progress

__all__ = ["Confirmed", "Driver", "DriverError", "Progress", "TrialInterrupted", "confirmed", "load_stored",
           "make_pruner", "make_sampler", "n_finished", "open_study", "queue_confirmations"]
