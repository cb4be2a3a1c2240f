"""What a study spent, in trainer steps and in full-run equivalents (one full run = the steps a search trial is set
to, ``total_steps``): the search's trials and the confirmation's runs apart. Read from the stored record alone, so
every driver, ``best`` and the benchmarks count alike.

A trial's steps are those it ran itself: its last logged step (else its last reported evaluation), less the step a
retry resumed from; a trial that logged nothing cost nothing here (its startup is not a step), and a baseline run
reused from an earlier study (``baseline_reused``) cost nothing in this one."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from optuna.trial import FrozenTrial

from hpo.record._attrs import is_confirm


def steps_run(t: FrozenTrial) -> int:
    """The trainer steps ``t`` ran itself (see the module docstring)."""
    if t.user_attrs.get("baseline_reused"):
        return 0
    last = t.user_attrs.get("last_step")
    if not isinstance(last, int) or isinstance(last, bool):
        last = max(t.intermediate_values, default=0)
    start = t.user_attrs.get("resumed_from_step")
    start = start if isinstance(start, int) and not isinstance(start, bool) else 0
    return max(0, int(last) - start)


def full_steps(trials: Iterable[FrozenTrial]) -> int | None:
    """A full run's steps: the largest ``total_steps`` a search trial recorded (None before any did)."""
    found = [t.user_attrs.get("total_steps") for t in trials if not is_confirm(t)]
    ints = [n for n in found if isinstance(n, int) and not isinstance(n, bool) and n > 0]
    return max(ints) if ints else None


@dataclass(frozen=True)
class Cost:
    """Steps spent by the search and by the confirmation, and a full run's length."""

    search_steps: int
    confirm_steps: int
    full: int | None
    reused_runs: int = 0  # baseline runs taken from an earlier study

    def runs(self, steps: int) -> float:
        return steps / self.full if self.full else math.nan

    @property
    def search_runs(self) -> float:
        return self.runs(self.search_steps)

    @property
    def confirm_runs(self) -> float:
        return self.runs(self.confirm_steps)

    @property
    def total_runs(self) -> float:
        return self.runs(self.search_steps + self.confirm_steps)

    def text(self) -> str:
        if not self.full:
            return f"{self.search_steps + self.confirm_steps} steps"
        reused = f", {self.reused_runs} baseline run(s) reused" if self.reused_runs else ""
        return (f"{self.total_runs:.1f} full-run equivalents ({self.search_runs:.1f} search + "
                f"{self.confirm_runs:.1f} confirmation; a full run = {self.full} steps{reused})")


def study_cost(trials: Iterable[FrozenTrial]) -> Cost:
    """What the study's trials spent (every state: a pruned or failed trial's steps were spent too)."""
    trials = list(trials)
    search = sum(steps_run(t) for t in trials if not is_confirm(t))
    confirm = sum(steps_run(t) for t in trials if is_confirm(t))
    reused = sum(1 for t in trials if is_confirm(t) and t.user_attrs.get("baseline_reused"))
    return Cost(search, confirm, full_steps(trials), reused)
