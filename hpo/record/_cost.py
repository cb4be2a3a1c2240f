"""What a study spent, in trainer steps and in full-run equivalents (one full run = the steps a search trial is set
to, ``total_steps``): the search's trials and the confirmation's runs apart. Read from the stored record alone, so
every driver, ``best`` and the benchmarks count alike.

A trial's steps are those it ran itself: its last logged step (else its last reported evaluation), less the step a
retry resumed from; a trial that logged nothing cost nothing here (its startup is not a step), and a baseline run
reused from an earlier study (``baseline_reused``) or imported from the user's own runs (``baseline_imported``) cost
nothing in this one.

A study with ``study.fidelity.proxy`` counts in the target's currency: a full run is a target run, and a proxy trial's
steps count at their measured cost ratio to a target step (:func:`proxy_ratio`: the wall time per step of the study's
own proxy trials over that of its target runs, on the same devices), never at an assumed one; until a target run has
finished the ratio is unknown and the proxy's steps are not counted yet (the proxy search is bounded by its
``n_trials``). The spend is then split four ways: proxy search, target search (promoted runs and a fallback search),
confirmation and baseline."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from optuna.trial import FrozenTrial

from hpo.record._attrs import is_baseline, is_confirm, is_proxy


def steps_run(t: FrozenTrial) -> int:
    """The trainer steps ``t`` ran itself (see the module docstring)."""
    if t.user_attrs.get("baseline_reused") or t.user_attrs.get("baseline_imported"):
        return 0  # a kept run of an earlier study, or the user's own run imported by confirm --baseline-runs
    last = t.user_attrs.get("last_step")
    if not isinstance(last, int) or isinstance(last, bool):
        last = max(t.intermediate_values, default=0)
    start = t.user_attrs.get("resumed_from_step")
    start = start if isinstance(start, int) and not isinstance(start, bool) else 0
    return max(0, int(last) - start)


def full_steps(trials: Iterable[FrozenTrial]) -> int | None:
    """A full run's steps: the largest ``total_steps`` a search trial recorded (a target one's when any did; None
    before any did)."""
    trials = [t for t in trials if not is_confirm(t)]
    for group in ([t for t in trials if not is_proxy(t)], trials):
        found = [t.user_attrs.get("total_steps") for t in group]
        ints = [n for n in found if isinstance(n, int) and not isinstance(n, bool) and n > 0]
        if ints:
            return max(ints)
    return None


def step_seconds(trials: Iterable[FrozenTrial]) -> float | None:
    """Wall time per trainer step over ``trials`` (their wall times over the steps they ran; None without both)."""
    wall = steps = 0.0
    for t in trials:
        w, n = t.user_attrs.get("wall_time_s"), steps_run(t)
        if isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) and w > 0 and n > 0:
            wall, steps = wall + float(w), steps + n
    return wall / steps if steps else None


def proxy_ratio(trials: Iterable[FrozenTrial]) -> float | None:
    """What a proxy step costs in target steps, measured: the proxy trials' wall time per step over the target runs'
    (search, promoted, confirmation and baseline runs alike); None until both have run."""
    trials = list(trials)
    proxy = step_seconds(t for t in trials if is_proxy(t))
    target = step_seconds(t for t in trials if not is_proxy(t))
    return proxy / target if proxy is not None and target else None


@dataclass(frozen=True)
class Cost:
    """Steps spent by the search and by the confirmation, and a full run's length. With a proxy, ``search_steps`` is
    in the target's steps: the target's search trials' plus the proxy's at :attr:`proxy_ratio` (0 until measured)."""

    search_steps: float
    confirm_steps: int
    full: int | None
    reused_runs: int = 0  # baseline runs taken from an earlier study
    proxy_steps: int = 0  # steps the proxy's trials ran (on the proxy model)
    proxy_ratio: float | None = None  # a proxy step's measured cost in target steps
    baseline_steps: int = 0  # of confirm_steps: the baseline's runs
    proxied: bool = False  # the study has proxy trials

    def runs(self, steps: float) -> float:
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

    @property
    def proxy_runs(self) -> float:
        """The proxy search in target full runs (0 until its ratio is measured)."""
        return self.runs(self.proxy_steps * (self.proxy_ratio or 0.0))

    @property
    def split(self) -> dict[str, float]:
        """The spend in target full runs: proxy search, target search, confirmation, baseline."""
        proxy = self.proxy_runs
        return {"proxy search": proxy, "target search": self.search_runs - proxy,
                "confirmation": self.runs(self.confirm_steps - self.baseline_steps),
                "baseline": self.runs(self.baseline_steps)}

    def text(self) -> str:
        if not self.full:
            return f"{round(self.search_steps + self.confirm_steps)} steps"
        reused = f", {self.reused_runs} baseline run(s) reused" if self.reused_runs else ""
        if not self.proxied:
            return (f"{self.total_runs:.1f} full-run equivalents ({self.search_runs:.1f} search + "
                    f"{self.confirm_runs:.1f} confirmation; a full run = {self.full} steps{reused})")
        parts = " + ".join(f"{v:.1f} {k}" for k, v in self.split.items())
        ratio = (f"{self.proxy_steps} proxy steps at a measured {self.proxy_ratio:.3g} target step each"
                 if self.proxy_ratio is not None else
                 f"{self.proxy_steps} proxy steps not counted yet: their cost ratio to a target step is measured "
                 "once a target run has finished")
        return (f"{self.total_runs:.1f} target full-run equivalents ({parts}; {ratio}; a full run = {self.full} "
                f"target steps{reused})")


def study_cost(trials: Iterable[FrozenTrial]) -> Cost:
    """What the study's trials spent (every state: a pruned or failed trial's steps were spent too)."""
    trials = list(trials)
    proxy = sum(steps_run(t) for t in trials if is_proxy(t))
    ratio = proxy_ratio(trials) if proxy else None
    search = sum(steps_run(t) for t in trials if not is_confirm(t) and not is_proxy(t)) + proxy * (ratio or 0.0)
    confirm = sum(steps_run(t) for t in trials if is_confirm(t))
    baseline = sum(steps_run(t) for t in trials if is_confirm(t) and is_baseline(t))
    reused = sum(1 for t in trials if is_confirm(t) and t.user_attrs.get("baseline_reused"))
    return Cost(search if proxy else int(search), confirm, full_steps(trials), reused, proxy, ratio, baseline,
                any(is_proxy(t) for t in trials))
