"""Intervals on a difference of means at :data:`LEVEL`: Welch's interval (unequal variances), the improvement over a
baseline, and the paired-t interval of per-seed differences; what they decide is ``_ties`` and ``_race``.

Pure Python (the driver stays light: no scipy); Student's t quantile comes from the regularized incomplete beta
function (a continued fraction), checked against tabulated values in the tests.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

LEVEL = 0.95  # the intervals' confidence level


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
    """``mean(a) - mean(b)`` and its two-sided interval at :data:`LEVEL`: Welch's, or the paired-t interval of the
    per-seed differences (:func:`paired`)."""

    diff: float
    low: float
    high: float
    df: float
    test: str = "Welch"  # "Welch" | "paired"
    n: int = 0  # the pairs (paired), else the smaller side's runs

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
    n = min(len(a), len(b))
    if se == 0.0:
        return Difference(diff, diff, diff, math.inf, "Welch", n)
    df = (va + vb) ** 2 / ((va * va / (len(a) - 1) if va else 0.0) + (vb * vb / (len(b) - 1) if vb else 0.0))
    half = t_quantile(0.5 + level / 2.0, df) * se
    return Difference(diff, diff - half, diff + half, df, "Welch", n)


def improvement(pick: Sequence[float], baseline: Sequence[float], maximize: bool) -> Difference | None:
    """How much better ``pick`` is than the baseline (> 0 better, whatever the direction), with its interval."""
    sign = 1.0 if maximize else -1.0
    return welch([sign * v for v in pick], [sign * v for v in baseline])



# ----------------------------------------------------------------------------- paired
def paired(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Difference | None:
    """The paired-t interval of ``mean(a_i - b_i)`` over the seeds both ran (``a[i]``, ``b[i]``: seed ``i``): runs
    on one seed share its data order and sampling, so the differences vary less than the values (the blocking of
    F-race). None with fewer than 2 finite pairs; pairs without spread give a zero-width interval."""
    d = [float(x) - float(y) for x, y in zip(a, b, strict=False) if math.isfinite(x) and math.isfinite(y)]
    if len(d) < 2:
        return None
    mean, sd = statistics.fmean(d), statistics.stdev(d)
    if sd == 0.0:
        return Difference(mean, mean, mean, math.inf, "paired", len(d))
    half = t_quantile(0.5 + level / 2.0, len(d) - 1) * sd / math.sqrt(len(d))
    return Difference(mean, mean - half, mean + half, len(d) - 1.0, "paired", len(d))
