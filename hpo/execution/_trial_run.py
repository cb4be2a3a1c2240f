"""What one attempt of a trial runs and how it is watched: the :class:`TrialRun` the study loop builds once and hands
to either executor, a local :class:`~hpo.execution.TrialProcess` or a :class:`~hpo.execution.ray_jobs.RayJob`; each
adds only its own settings (a local process's memory mechanism and private ``/tmp``, a Ray job's cluster and
resources)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TrialRun:
    """One attempt: the command, where its logs and metrics go, its limits, and the study loop's callbacks."""

    argv: Sequence[str]
    env: Mapping[str, str]
    log_dir: Path  # stdout.log / stderr.log (a Ray job: stderr.log, from the job's log)
    metrics_path: Path  # the trainer's JSONL metrics file (a Ray job: on its node, sent back through the job's log)
    cwd: str | None = None
    timeout_s: float | None = None  # wall seconds before it is stopped (stop value ``timeout``)
    memory_limit_gb: float | None = None  # the hard memory cap of the whole trial (stop value ``memory``)
    # each metrics line (step, data); a stop value returned (pruned, converged, ...) stops the run with it
    on_metrics: Callable[[int, dict[str, Any]], str | None] | None = None
    on_tick: Callable[[int | None, float], None] | None = None  # (last step, memory GB) while it runs
    stop_event: threading.Event | None = None  # set: the run is stopped (stop value ``interrupted``)
    # the trainer's lines that say it dropped a row of its data (Backend.dropped_row_patterns): counted in RunResult
    dropped_row_patterns: Sequence[str] = ()
    log_cap: int | None = -1  # bytes per log; None: no cap; -1: $VERL_HPO_LOG_CAP_MIB
