"""What the study loop tells a person while it runs. The loop holds a :class:`Progress` and never imports the
reporting layer; :class:`hpo.reporting.Reporter` is the console implementation."""

from __future__ import annotations

from typing import Any, Protocol

import optuna
from optuna.trial import FrozenTrial


class Progress(Protocol):
    def note(self, text: str) -> None:
        """A line about the study (a recovered trial, the prepare step, ...)."""

    def trial_started(self, number: int, params: dict[str, Any], retry_of: int | None) -> None:
        """A trial's process is about to start with these parameters."""

    def trial_eval(self, number: int, step: int, total: int | None, value: float, mem_gb: float) -> None:
        """A trial reported an evaluation (the objective's aggregate so far)."""

    def trial_tick(self, number: int, step: int | None, total: int | None, mem_gb: float) -> None:
        """Twice a second while a trial runs: its step and memory."""

    def trial_finished(self, study: optuna.Study, trial: FrozenTrial, finished: int) -> None:
        """A trial was told; ``finished`` trials of the study count towards its target."""
