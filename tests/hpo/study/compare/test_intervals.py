"""The intervals confirmation compares settings by (``hpo/study/_compare/_intervals.py``): Student's t quantiles
against the tables, Welch's interval and the paired interval against hand computations, and the improvement over the
baseline in the objective's direction."""

from __future__ import annotations

import math
import statistics

import pytest

from hpo.study._compare import improvement, paired, t_quantile, welch


@pytest.mark.parametrize("df, q", [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (10, 2.228), (30, 2.042),
                                   (1e9, 1.960)])
def test_t_quantile_matches_the_tables(df: float, q: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(q, abs=1e-3)


def test_welch_interval_by_hand() -> None:
    a, b = [0.96, 0.95, 0.97], [0.80, 0.78, 0.85]
    d = welch(a, b)
    assert d is not None
    va, vb = statistics.variance(a) / 3, statistics.variance(b) / 3
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    half = t_quantile(0.975, df) * math.sqrt(va + vb)
    assert d.diff == pytest.approx(statistics.fmean(a) - statistics.fmean(b))
    assert (d.low, d.high, d.df) == pytest.approx((d.diff - half, d.diff + half, df))
    assert d.excludes_zero
    assert welch([1.0], [2.0, 3.0]) is None  # one run: no spread to judge by
    same = welch([0.5, 0.5], [0.4, 0.4])
    assert same is not None and same.low == same.high == pytest.approx(0.1)
    worse = improvement([1.0, 1.1], [0.5, 0.6], maximize=False)  # a loss: lower is better
    assert worse is not None and worse.diff == pytest.approx(-0.5)


def test_paired_interval_by_hand() -> None:
    a, b = [0.90, 0.70, 0.80], [0.86, 0.64, 0.77]
    d = [0.04, 0.06, 0.03]
    got = paired(a, b)
    assert got is not None
    half = t_quantile(0.975, 2) * statistics.stdev(d) / math.sqrt(3)
    assert got.diff == pytest.approx(statistics.fmean(d))
    assert (got.low, got.high) == pytest.approx((statistics.fmean(d) - half, statistics.fmean(d) + half))
    assert paired([0.9], [0.8]) is None  # one seed: no interval
    same = paired([0.9, 0.7], [0.85, 0.65])
    assert same is not None and (same.low, same.high) == pytest.approx((0.05, 0.05))  # constant difference: no width
