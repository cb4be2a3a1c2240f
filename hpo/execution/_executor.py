"""The interface every trial executor offers the study loop: a local process (:class:`~hpo.execution.TrialProcess`)
or a Ray job (:class:`~hpo.execution.ray_jobs.RayJob`). The loop builds one around the attempt's
:class:`~hpo.execution.TrialRun`, calls :meth:`run` in the trial's thread and reads the same
:class:`~hpo.execution.RunResult` (stop values ``pruned|converged|collapsed...|timeout|interrupted|memory|
bad_metrics``, failure labels ``killed|timeout|oom|crash|bad_metrics``) whichever ran it."""

from __future__ import annotations

from typing import Protocol

from hpo.execution._runner import RunResult


class TrialExecutor(Protocol):
    """Runs one trial attempt to its end (or until ``stop_event``, a metrics callback's decision or the timeout),
    calling ``on_metrics(step, data)`` for each metrics line and ``on_tick(last_step, memory_gb)`` while it runs."""

    spawned_at: float | None  # time.monotonic() when the trial was started (None: it never was)

    def run(self) -> RunResult: ...
