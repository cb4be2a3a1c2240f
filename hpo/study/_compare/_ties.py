"""Which confirmed setting ``best`` recommends (:func:`verdict`): the settings not separated from the best confirmed
one (:func:`difference`), those of them within the resolution of its mean (tied), and the preference among tied
settings (:func:`prefer`: fewer bad runs, :func:`bad_runs`, then fewer steps to plateau, then the better mean). The
rules in full: :mod:`hpo.study._compare`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from optuna.trial import FrozenTrial

from hpo.analysis import LABELS
from hpo.study._compare._intervals import Difference, paired, welch
from hpo.study._confirm import Confirmed

# the preference among settings not separated and within the resolution of the best mean (see the module docstring)
RULE = ("fewer bad runs (failed, collapsed or reward_hacking), then fewer steps to plateau, then the better confirmed "
        "mean")
# the run diagnosis's labels that make a confirmation run bad (hpo.analysis.LABELS less length_clipping: a clipped
# response is a setting's cost, not its breaking)
BAD_LABELS = tuple(label for label in LABELS if label != "length_clipping")


# ----------------------------------------------------------------------------- ties and preference
def bad_runs(c: Confirmed) -> int:
    """Confirmation runs that failed (worst value), that the diagnosis stopped as collapsed, or that it labelled
    with a collapse or ``reward_hacking`` (:data:`BAD_LABELS`; a label need not stop the run)."""
    return sum(1 for r, v in zip(c.runs, c.values, strict=False)
               if not math.isfinite(v) or "fail_reason" in r.user_attrs or _labelled_bad(r))


def _labelled_bad(run: FrozenTrial) -> bool:
    attrs = run.user_attrs
    if str(attrs.get("stop_reason", "")).startswith("collapsed"):
        return True
    listed = attrs.get("diagnosis_labels")  # every label that applied; "diagnosis": the first of them
    labels = [str(attrs.get("diagnosis", "")), *(map(str, listed) if isinstance(listed, list) else ())]
    return any(label in BAD_LABELS for label in labels)


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
    tied: tuple[Confirmed, ...]  # not separated from ``top`` and within the resolution of its mean (``top`` excluded)
    gaps: dict[int, Difference | None]  # trial number -> top - it (sign-adjusted: > 0 means top is better)
    plateau_steps: dict[int, float]
    bad: dict[int, int]
    unseparated: tuple[Confirmed, ...] = ()  # not separated from ``top`` but more than the resolution below it
    resolution: float = 0.0  # the confirmed means' differences that do not matter


def difference(a: Confirmed, b: Confirmed, sign: float = 1.0) -> Difference | None:
    """``sign * (a - b)``: the paired interval over the seeds both ran when they share at least 2, else Welch's over
    all their runs (see the module docstring)."""
    av, bv = _seed_values(a), _seed_values(b)
    shared = [s for s in av if s in bv]
    if len(shared) >= 2:
        return paired([sign * av[s] for s in shared], [sign * bv[s] for s in shared])
    return welch([sign * v for v in a.values], [sign * v for v in b.values])


def _seed_values(c: Confirmed) -> dict[int, float]:
    return {s: v for s, v in zip(c.seeds, c.values, strict=False) if s >= 0}  # -1: a run without its seed


def verdict(ranked: Sequence[Confirmed], maximize: bool, tolerance: float,
            out: frozenset[int] = frozenset(), resolution: float | None = None) -> Verdict:
    """Ties with the best confirmed setting (``ranked`` best first, as :func:`hpo.study._confirm.confirmed`) and the
    preferred one among them (see the module docstring). ``out``: trials a racing confirmation dropped as behind
    (never tied, whatever their few runs' interval says). ``resolution``: ``study.confirm.resolution`` (None: the
    ``tolerance``)."""
    top = ranked[0]
    sign = 1.0 if maximize else -1.0
    res = tolerance if resolution is None else resolution
    gaps: dict[int, Difference | None] = {}
    tied: list[Confirmed] = []
    unseparated: list[Confirmed] = []
    for c in ranked[1:]:
        d = gaps[c.trial.number] = difference(top, c, sign)
        if (d is not None and d.excludes_zero) or c.trial.number in out:
            continue
        below = sign * (top.mean - c.mean)  # nan: both failed everywhere, equally bad
        (unseparated if below > res * (1 + 1e-9) + 1e-12 else tied).append(c)
    steps = {c.trial.number: mean_steps_to_plateau(c, tolerance, maximize) for c in ranked}
    bad = {c.trial.number: bad_runs(c) for c in ranked}
    pick = prefer([top, *tied], steps, bad, maximize)
    return Verdict(top, pick, tuple(tied), gaps, steps, bad, tuple(unseparated), res)


def prefer(group: Sequence[Confirmed], steps: dict[int, float], bad: dict[int, int], maximize: bool) -> Confirmed:
    """The preferred setting of a tied ``group``: fewer bad runs, then fewer steps to plateau, then the better
    confirmed mean (then the lower trial number)."""
    sign = 1.0 if maximize else -1.0
    return min(group, key=lambda c: (bad[c.trial.number], steps[c.trial.number], -sign * c.mean, c.trial.number))
