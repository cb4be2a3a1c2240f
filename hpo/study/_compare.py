"""Telling confirmed settings apart: Welch's interval on a difference of means, the settings tied with the best, the
documented preference among tied settings, and the improvement over ``study.baseline``.

Pure Python (the driver stays light: no scipy); Student's t quantile comes from the regularized incomplete beta
function (a continued fraction), checked against tabulated values in the tests.

**Tie rule.** Setting B cannot be told apart from the best confirmed setting A when the 95% Welch interval of
``mean(A) - mean(B)`` over their confirmation runs contains 0 (with fewer than 2 runs on a side nothing can be told
apart: every such setting is tied). **Preference among tied settings** (:func:`prefer`), safer then cheaper:

1. fewer bad confirmation runs (failed, or stopped by the run diagnosis as collapsed): a setting that breaks under
   some seed is riskier than one that never did;
2. then fewer steps to its plateau: the mean, over its confirmation runs, of the first evaluation step at which the
   objective came within ``tolerance`` (``early_stopping.plateau_min_delta``, else 1% of the value) of that run's
   best; a setting that gets there sooner can be trained shorter;
3. then the better confirmed mean.

Only validation values select (the tie, the preference); the held-out test values are reported beside them and
never choose, or the test split would become a second validation set.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from optuna.trial import FrozenTrial

from hpo.study._confirm import Confirmed

LEVEL = 0.95  # the intervals' confidence level
RULE = "fewer bad runs, then fewer steps to plateau, then the better confirmed mean"  # see the module docstring


# ----------------------------------------------------------------------------- Student's t
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-14:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` (> 0, not necessarily whole) degrees of freedom."""
    tail = 0.5 * _betai(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (0.5 < p < 1) of Student's t with ``df`` degrees of freedom (bisection on :func:`t_cdf`)."""
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


# ----------------------------------------------------------------------------- Welch
@dataclass(frozen=True)
class Difference:
    """``mean(a) - mean(b)`` and its two-sided Welch interval at :data:`LEVEL`."""

    diff: float
    low: float
    high: float
    df: float

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0.0 or self.high < 0.0

    def text(self) -> str:
        return f"{self.diff:+.4g} [{self.low:+.4g}, {self.high:+.4g}]"


def welch(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Difference | None:
    """Welch's interval for ``mean(a) - mean(b)`` (unequal variances); None with fewer than 2 finite values on a
    side. Two sides without spread give a zero-width interval."""
    a = [float(v) for v in a if math.isfinite(v)]
    b = [float(v) for v in b if math.isfinite(v)]
    if len(a) < 2 or len(b) < 2:
        return None
    diff = statistics.fmean(a) - statistics.fmean(b)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0.0:
        return Difference(diff, diff, diff, math.inf)
    df = (va + vb) ** 2 / ((va * va / (len(a) - 1) if va else 0.0) + (vb * vb / (len(b) - 1) if vb else 0.0))
    half = t_quantile(0.5 + level / 2.0, df) * se
    return Difference(diff, diff - half, diff + half, df)


# ----------------------------------------------------------------------------- ties and preference
def bad_runs(c: Confirmed) -> int:
    """Confirmation runs that failed (worst value) or that the diagnosis stopped as collapsed."""
    out = 0
    for r, v in zip(c.runs, c.values, strict=False):
        stop = str(r.user_attrs.get("stop_reason", ""))
        if not math.isfinite(v) or "fail_reason" in r.user_attrs or stop.startswith("collapsed"):
            out += 1
    return out


def steps_to_plateau(run: FrozenTrial, tolerance: float, maximize: bool) -> int | None:
    """The first evaluation step at which ``run``'s reported objective came within ``tolerance`` of its best."""
    curve = sorted((s, v) for s, v in run.intermediate_values.items() if math.isfinite(v))
    if not curve:
        return None
    sign = 1.0 if maximize else -1.0
    best = max(sign * v for _, v in curve)
    return next(s for s, v in curve if sign * v >= best - tolerance)


def mean_steps_to_plateau(c: Confirmed, tolerance: float, maximize: bool) -> float:
    steps = [s for s in (steps_to_plateau(r, tolerance, maximize) for r in c.runs) if s is not None]
    return statistics.fmean(steps) if steps else math.inf


@dataclass(frozen=True)
class Verdict:
    """Which confirmed setting ``best`` recommends and why."""

    top: Confirmed  # the best confirmed mean
    pick: Confirmed  # the recommended setting (``top`` unless a tied one is preferred)
    tied: tuple[Confirmed, ...]  # settings that cannot be told apart from ``top`` (``top`` excluded)
    gaps: dict[int, Difference | None]  # trial number -> top - it (sign-adjusted: > 0 means top is better)
    plateau_steps: dict[int, float]
    bad: dict[int, int]


def verdict(ranked: Sequence[Confirmed], maximize: bool, tolerance: float) -> Verdict:
    """Ties with the best confirmed setting (``ranked`` best first, as :func:`hpo.study._confirm.confirmed`) and the
    preferred one among them (see the module docstring)."""
    top = ranked[0]
    sign = 1.0 if maximize else -1.0
    gaps: dict[int, Difference | None] = {}
    tied: list[Confirmed] = []
    for c in ranked[1:]:
        d = welch([sign * v for v in top.values], [sign * v for v in c.values])
        gaps[c.trial.number] = d
        if d is None or not d.excludes_zero:
            tied.append(c)
    steps = {c.trial.number: mean_steps_to_plateau(c, tolerance, maximize) for c in ranked}
    bad = {c.trial.number: bad_runs(c) for c in ranked}
    pick = prefer([top, *tied], steps, bad, maximize)
    return Verdict(top, pick, tuple(tied), gaps, steps, bad)


def prefer(group: Sequence[Confirmed], steps: dict[int, float], bad: dict[int, int], maximize: bool) -> Confirmed:
    """The preferred setting of a tied ``group``: fewer bad runs, then fewer steps to plateau, then the better
    confirmed mean (then the lower trial number)."""
    sign = 1.0 if maximize else -1.0
    return min(group, key=lambda c: (bad[c.trial.number], steps[c.trial.number], -sign * c.mean, c.trial.number))


def improvement(pick: Sequence[float], baseline: Sequence[float], maximize: bool) -> Difference | None:
    """How much better ``pick`` is than the baseline (> 0 better, whatever the direction), with its interval."""
    sign = 1.0 if maximize else -1.0
    return welch([sign * v for v in pick], [sign * v for v in baseline])
