"""How a trial or the driver stops early: the exceptions the study loop raises and maps (see
:mod:`hpo.study._trial._outcome` for the outcomes, :mod:`hpo.study._driver` for the loop)."""

from __future__ import annotations


class TrialInterrupted(Exception):
    """The driver was asked to stop while this trial ran; it is queued again for resume."""


class TrialFailed(Exception):
    """A trial failed and ``on_failure: fail`` asks for state FAIL (caught by ``study.optimize``)."""


class DriverError(Exception):
    """A runtime problem that is not bad input (exit 1)."""


class TrialLost(Exception):
    """Another driver finished this driver's running trial (it took us for dead); we drop it and go on."""


class TrialRetried(Exception):
    """The trial's Ray node (or job supervisor) died under it: FAIL, not counted, and one retry queued."""
