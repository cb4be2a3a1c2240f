"""The confirmed values: each confirmed trial's finished runs by seed, their means and spreads, the baseline's."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpo.record import (
    ATTR_CONFIRM_OF,
    ATTR_CONFIRM_SEED,
    is_confirm,
)
from hpo.study._confirm._seeds import BASELINE_OF, _sign


@dataclass(frozen=True)
class Confirmed:
    """A search trial and its confirmation runs' values (COMPLETE, finite, first objective)."""

    trial: FrozenTrial
    values: tuple[float, ...]
    seeds: tuple[int, ...]
    runs: tuple[FrozenTrial, ...] = ()  # the confirmation runs, by seed
    test_values: tuple[float, ...] = ()  # their held-out test values (user attr test_value), where measured

    @property
    def test_mean(self) -> float:
        return _mean(self.test_values)

    @property
    def test_std(self) -> float:
        return _std(self.test_values)

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return _mean(self.values)

    @property
    def std(self) -> float:
        return _std(self.values)


def _mean(xs: tuple[float, ...]) -> float:
    """The mean; a trial's values near the float limit (1e308 logged as a reward) give inf, never OverflowError."""
    if not xs:
        return math.nan
    try:
        return statistics.fmean(xs)
    except OverflowError:
        return math.fsum(x / len(xs) for x in xs)


def _std(xs: tuple[float, ...]) -> float:
    """The sample standard deviation; 0 for fewer than two values; inf where the values overflow it."""
    if len(xs) < 2:
        return 0.0
    try:
        return statistics.stdev(xs)
    except (OverflowError, AttributeError):  # stdev of values near the float limit (AttributeError: CPython's)
        return math.inf


def confirmed(study: optuna.Study) -> list[Confirmed]:
    """The confirmed search trials, best confirmed mean first (ties: the tuning value, then the number). A
    confirmation run that failed completed with the worst value and drags its mean there: a setting that
    crashes under another seed is not confirmed."""
    by_trial = _runs_by_trial(study)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    out = [_confirmed(trials[n], runs) for n, runs in by_trial.items() if n in trials]
    sign = _sign(study)
    tuned = [(-sign * float(c.trial.values[0]) if c.trial.values else 0.0) for c in out]
    order = sorted(range(len(out)), key=lambda i: (-sign * out[i].mean, tuned[i], out[i].trial.number))
    return [out[i] for i in order]


def _runs_by_trial(study: optuna.Study) -> dict[int, list[FrozenTrial]]:
    """COMPLETE confirmation runs by the trial they confirm (baseline runs under :data:`BASELINE_OF`), by seed. A
    failed run completes with the worst value: it counts."""
    by_trial: dict[int, list[FrozenTrial]] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if is_confirm(t) and t.values is not None and not (
                t.system_attrs.get("pbt:intermediate") and not t.user_attrs.get("stop_reason")
                and "fail_reason" not in t.user_attrs):  # a pbt schedule's chain: its last segment's value
            by_trial.setdefault(int(t.system_attrs[ATTR_CONFIRM_OF]), []).append(t)
    for runs in by_trial.values():
        runs.sort(key=lambda r: (int(r.system_attrs.get(ATTR_CONFIRM_SEED, -1)), r.number))
    return by_trial


def _confirmed(trial: FrozenTrial, runs: list[FrozenTrial]) -> Confirmed:
    tests = tuple(float(r.user_attrs["test_value"]) for r in runs
                  if isinstance(r.user_attrs.get("test_value"), (int, float)))
    return Confirmed(trial, tuple(float(r.values[0]) for r in runs),
                     tuple(int(r.system_attrs.get(ATTR_CONFIRM_SEED, -1)) for r in runs), tuple(runs), tests)


def baseline_confirmed(study: optuna.Study) -> Confirmed | None:
    """The baseline's confirmation runs (``study.baseline``), or None before any finished; its ``trial`` is its
    first run."""
    runs = _runs_by_trial(study).get(BASELINE_OF)
    return _confirmed(runs[0], runs) if runs else None
