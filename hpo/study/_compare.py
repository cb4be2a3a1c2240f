"""Telling confirmed settings apart: the paired interval of the per-seed differences where two settings ran the same
seeds (Welch's interval on the difference of means where they did not), the settings tied with the best, the
documented preference among tied settings, and the improvement over ``study.baseline``.

Pure Python (the driver stays light: no scipy); Student's t quantile comes from the regularized incomplete beta
function (a continued fraction), checked against tabulated values in the tests.

**Telling two settings apart** (:func:`difference`): on the seeds both ran (at least 2), the 95% paired-t interval of
the per-seed differences (a seed moves every setting alike: its data order and sampling); otherwise Welch's interval
of ``mean(A) - mean(B)`` over all their runs. Fewer than 2 runs on a side (or 2 finite pairs): nothing can be told
apart. B is *separated* from the best confirmed setting A when the interval excludes 0 (or when a racing
confirmation dropped B as behind).

**Tie rule: never recommend the worse of two.** B is *tied* with A when it is not separated from A **and** its
confirmed mean is within ``study.confirm.resolution`` of A's (default ``early_stopping.plateau_min_delta``, else 1% of
the best confirmed mean: differences smaller than that do not matter). A setting not separated but more than the
resolution below A (the seeds were too few to tell, e.g. a race that ended at the budget or the seed cap) is not
tied: the better mean wins, and ``best`` says so ("not separated after N seeds: the recommendation is the better
mean"). **Preference among tied settings** (:func:`prefer`), safer then cheaper:

1. fewer bad confirmation runs (failed, stopped by the run diagnosis as collapsed, or labelled by it with a collapse
   or ``reward_hacking``, :data:`BAD_LABELS`): a setting that breaks under some seed is riskier than one that never
   did;
2. then fewer steps to its plateau: the mean, over its confirmation runs, of the first evaluation step at which the
   objective came within ``tolerance`` (``early_stopping.plateau_min_delta``, else 1% of the value) of that run's
   best; a setting that gets there sooner can be trained shorter;
3. then the better confirmed mean.

Only validation values select (the tie, the preference); the held-out test values are reported beside them and
never choose, or the test split would become a second validation set.

**Racing confirmation** (``study.confirm.race``; F-race's idea with a paired t-test in place of Friedman's): the
candidates and the baseline run seed by seed; after each round a candidate behind the leader on the seeds they share
(:func:`paired` interval above 0) is dropped, and the race ends when the leader is alone, when the others are within
the resolution of it, at the seed cap or at the budget (:func:`race_step`). The baseline runs only until the
improvement over it is clear. The race is replayed from the finished runs by whoever asks (:func:`race_state`), so
several drivers and a killed one agree on it; only its settings are stored.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpo.analysis import LABELS
from hpo.experiment._space import Space
from hpo.record import ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED, ATTR_RACE, is_confirm, study_cost
from hpo.record._attrs import PBT_INDEX
from hpo.study._confirm import (
    Confirmed,
    baseline_confirmed,
    confirm_seeds,
    confirmed,
    queue_runs,
    speed_generation,
    top_trials,
)

LEVEL = 0.95  # the intervals' confidence level
# the preference among settings not separated and within the resolution of the best mean (see the module docstring)
RULE = ("fewer bad runs (failed, collapsed or reward_hacking), then fewer steps to plateau, then the better confirmed "
        "mean")
# the run diagnosis's labels that make a confirmation run bad (hpo.analysis.LABELS less length_clipping: a clipped
# response is a setting's cost, not its breaking)
BAD_LABELS = tuple(label for label in LABELS if label != "length_clipping")


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


def improvement(pick: Sequence[float], baseline: Sequence[float], maximize: bool) -> Difference | None:
    """How much better ``pick`` is than the baseline (> 0 better, whatever the direction), with its interval."""
    sign = 1.0 if maximize else -1.0
    return welch([sign * v for v in pick], [sign * v for v in baseline])


# ----------------------------------------------------------------------------- racing confirmation
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


@dataclass(frozen=True)
class RaceStep:
    """What a race does after a round (:func:`race_step`)."""

    leader: int
    dropped: tuple[int, ...]  # candidates behind the leader (their paired interval excludes 0), out from now on
    gaps: dict[int, Difference | None]  # candidate -> leader - it (sign-adjusted), over the shared seeds
    end: str | None  # why the candidates' race ends ("separated", "tied", "seed cap"), None: it goes on
    baseline_more: bool  # the baseline needs another seed


def race_step(values: dict[int, Sequence[float]], baseline: Sequence[float] | None, maximize: bool, *,
              resolution: float, min_seeds: int, max_seeds: int, tests: dict[int, Sequence[float]] | None = None,
              baseline_tests: Sequence[float] | None = None) -> RaceStep:
    """One decision of racing confirmation over the alive candidates' runs (``values``: candidate -> its values
    seed by seed, every candidate on the same seeds; dict order breaks ties, best search value first).

    * The leader is the best mean. Before ``min_seeds`` seeds nothing is dropped and the race goes on.
    * A candidate whose paired interval against the leader (:func:`paired`) lies above 0 is behind: dropped; one
      with a failed run (a non-finite value: the worst) is dropped at once (it breaks under some seed).
    * The race ends "separated" when only the leader is left; "tied" when every other candidate's interval lies
      within ``[-resolution, +resolution]`` (they cannot differ by more than the resolution: more seeds would not
      change the pick by more than that); "seed cap" after ``max_seeds`` seeds.
    * The baseline needs another seed while it has fewer than ``min_seeds``, or while the improvement of the leader
      over it (Welch, on the held-out test values when ``tests`` (candidate -> test values) and ``baseline_tests``
      have them, else on validation: what ``best`` reports) contains 0, up to ``max_seeds``.
    """
    sign = 1.0 if maximize else -1.0
    alive = list(values)
    n = min((len(v) for v in values.values()), default=0)
    failed = [c for c in alive if not all(math.isfinite(v) for v in values[c][:n])]  # a run failed (worst value)
    sound = [c for c in alive if c not in failed] or alive
    leader = max(sound, key=lambda c: (sign * statistics.fmean(values[c][:n]) if n else 0.0, -alive.index(c)))
    gaps: dict[int, Difference | None] = {}
    dropped: list[int] = [c for c in failed if c != leader]  # breaks under a seed: out at once, like confirmed()
    if n >= min_seeds:
        for c in alive:
            if c != leader and c not in dropped:
                gap = gaps[c] = paired([sign * v for v in values[leader][:n]], [sign * v for v in values[c][:n]])
                if gap is not None and gap.low > 0.0:
                    dropped.append(c)
    end: str | None = None
    rest = [c for c in alive if c != leader and c not in dropped]
    if n >= min_seeds:
        if not rest:
            end = "separated"
        elif all(g is not None and -resolution <= g.low and g.high <= resolution for g in (gaps[c] for c in rest)):
            end = "tied"
        elif n >= max_seeds:
            end = "seed cap"
    more = False
    if baseline is not None and len(baseline) < max_seeds:
        if len(baseline) < min_seeds:
            more = True
        else:
            lead_tests = (tests or {}).get(leader)
            pick, base = (lead_tests, baseline_tests) if lead_tests and baseline_tests else (values[leader], baseline)
            d = improvement(pick, base, maximize)
            more = d is None or not d.excludes_zero
    return RaceStep(leader, tuple(dropped), gaps, end, more)


# ----------------------------------------------------------------------------- the race's state in the study
def start_race(study: optuna.Study, space: Space, top_k: int, n_seeds: int,
               cache: Path | None = None, note: Callable[[str], None] | None = None) -> list[tuple[int, int]]:
    """``confirm`` with ``study.confirm.race``: keep the race's candidates (the top ``top_k``) and seed cap in the
    study (:data:`~hpo.record.ATTR_RACE`, once: every driver and a later ``confirm`` go on with the same race, whatever
    ``--top`` / ``--seeds`` it is given), then queue its next round (:func:`advance_race`; the first seed of every
    candidate on the first call)."""
    if ATTR_RACE not in study._storage.get_study_system_attrs(study._study_id):
        conf = space.study.confirm
        candidates = [t.number for t in top_trials(study, top_k)]
        if not candidates:  # nothing finished with a finite value yet: no race (and no baseline) to run
            return []
        study._storage.set_study_system_attr(study._study_id, ATTR_RACE, {
            "candidates": candidates, "max_seeds": int(n_seeds), "min_seeds": min(conf.min_seeds, int(n_seeds)),
            "resolution": conf.resolution})
    return advance_race(study, space, cache, note)


@dataclass(frozen=True)
class Race:
    """Where a racing confirmation stands, replayed from its finished runs round by round (the same answer for every
    driver, whoever ran what; nothing but the settings is stored)."""

    candidates: tuple[int, ...]
    seeds: tuple[int, ...]  # the race's seeds, in order (max_seeds of them)
    alive: tuple[int, ...]  # candidates still racing (or left at the end), best search value first
    dropped: dict[int, tuple[int, Any]]  # candidate -> (seeds it had when dropped, its gap to the leader)
    rounds: int  # seeds every alive candidate has finished
    leader: int | None
    end: str | None  # "separated" | "tied" | "seed cap" | "budget" | None (going on)
    baseline_runs: int
    baseline_more: bool
    resolution: float


def race_resolution(space: Space, settings: dict[str, Any], values: dict[int, list[float]], maximize: bool) -> float:
    """``study.confirm.resolution``, else ``early_stopping.plateau_min_delta``, else 1% of the best candidate's mean
    (``values``: candidate -> its values; the tie rule's default too, :func:`verdict`)."""
    if isinstance(settings.get("resolution"), (int, float)):
        return float(settings["resolution"])
    if space.early_stopping.plateau_min_delta > 0:
        return float(space.early_stopping.plateau_min_delta)
    sign = 1.0 if maximize else -1.0
    means = [statistics.fmean(vs) for vs in values.values() if vs and all(math.isfinite(v) for v in vs)]
    return 0.01 * abs(max(sign * m for m in means)) if means else 0.0


def _by_seed(c: Confirmed | None, seeds: tuple[int, ...], test: bool = False) -> list[float]:
    """``c``'s values on ``seeds`` in order, up to the first seed it has not finished."""
    if c is None:
        return []
    got = dict(zip(c.seeds, c.values, strict=False)) if not test else {
        int(r.system_attrs.get(ATTR_CONFIRM_SEED, -1)): float(r.user_attrs["test_value"]) for r in c.runs
        if isinstance(r.user_attrs.get("test_value"), (int, float))}
    out = []
    for s in seeds:
        if s not in got:
            break
        out.append(got[s])
    return out


def race_state(study: optuna.Study, space: Space) -> Race | None:
    """The race of a study confirmed with ``study.confirm.race`` (None otherwise): the rounds every alive candidate
    finished are replayed through :func:`hpo.study._compare.race_step`, so a candidate dropped at round r stays
    dropped and the answer does not depend on which driver asks."""
    settings = study._storage.get_study_system_attrs(study._study_id).get(ATTR_RACE)
    if not isinstance(settings, dict) or not isinstance(settings.get("candidates"), list):
        return None
    maximize = study.directions[0] == optuna.study.StudyDirection.MAXIMIZE
    max_seeds = max(1, int(settings.get("max_seeds", 3)))
    min_seeds = max(2, min(int(settings.get("min_seeds", 2)), max_seeds))
    seeds = tuple(confirm_seeds(space, max_seeds))
    runs = {c.trial.number: c for c in confirmed(study)}
    base = baseline_confirmed(study)
    candidates = tuple(int(c) for c in settings["candidates"])
    values = {c: _by_seed(runs.get(c), seeds) for c in candidates}
    resolution = race_resolution(space, settings, values, maximize)
    base_values = _by_seed(base, seeds) if space.study.baseline else None
    tests = {c: _by_seed(runs.get(c), seeds, True) for c in candidates}  # held-out values: the baseline's judge
    base_tests = _by_seed(base, seeds, True) if base_values is not None else None
    alive, dropped = list(candidates), {}
    leader: int | None = candidates[0] if candidates else None
    end, more, rounds = None, bool(space.study.baseline), 0
    for r in range(1, max_seeds + 1):
        if not alive or any(len(values[c]) < r for c in alive):
            break
        rounds = r
        step = race_step({c: values[c][:r] for c in alive}, base_values, maximize, resolution=resolution,
                         min_seeds=min_seeds, max_seeds=max_seeds,
                         tests={c: tests[c][:r] for c in alive}, baseline_tests=base_tests)
        leader = step.leader
        for c in step.dropped:
            dropped[c] = (r, step.gaps.get(c))
        alive = [c for c in alive if c not in step.dropped]
        end, more = step.end, step.baseline_more
        if end is not None:
            break
    if base_values is not None and (rounds == 0 or end is None):  # in step with the candidates' rounds
        more = len(base_values) < 1 if rounds == 0 else more and len(base_values) <= rounds
    budget = space.study.budget
    if budget is not None and rounds >= min_seeds:  # study.budget: the next round (or baseline run) must fit in it
        trials = study.get_trials(deepcopy=False)
        spent = study_cost(trials)
        flying = any(is_confirm(t) and t.state in (TrialState.WAITING, TrialState.RUNNING)
                     and t.system_attrs.get(ATTR_CONFIRM_OF) in alive for t in trials)
        if spent.full and end is None and not flying and spent.total_runs + len(alive) > budget:
            end = "budget"
        if spent.full and spent.total_runs + 1 > budget:
            more = False
    return Race(candidates, seeds, tuple(alive), dropped, rounds, leader, end, len(base_values or []),
                more and base_values is not None, resolution)


def advance_race(study: optuna.Study, space: Space, cache: Path | None = None,
                 note: Callable[[str], None] | None = None) -> list[tuple[int, int]]:
    """Queue what the race needs next: every alive candidate's next seed (while the race goes on) and the
    baseline's next seed (while it needs one); returns what was queued. Idempotent: a run already queued, running or
    finished is never queued again (two drivers asking at once may still both queue one: the runner drops the
    later twin as surplus, :func:`twin_of`)."""
    race = race_state(study, space)
    if race is None:
        return []
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    runs: list[tuple[FrozenTrial | None, int]] = []
    if race.end is None and race.rounds < len(race.seeds):
        runs += [(trials[c], race.seeds[race.rounds]) for c in race.alive if c in trials]
    if race.baseline_more and race.baseline_runs < len(race.seeds):
        runs.append((None, race.seeds[race.baseline_runs]))
    return queue_runs(study, runs, space, cache, note)


def twin_of(study: optuna.Study, run: FrozenTrial) -> int | None:
    """Another confirmation run of the same (trial, seed, PBT schedule range) that goes first (finished, or queued or
    running with a lower number: the lowest of live twins runs): ``run`` is then surplus. None when ``run`` is the one
    to run. The segments of a PBT schedule's confirmation share its trial and seed: each range is a run of its own.
    A throughput re-measurement's twins are those of its block's generation, and a standing run of a later generation
    of its seed's block replaces it (:func:`hpo.study._confirm.speed_block_retry`: a block re-made after a kill)."""
    gen = speed_generation(run)
    for t in study.get_trials(deepcopy=False):
        if t.number == run.number or not is_confirm(t) or _run_key(t) != _run_key(run):
            continue
        other = speed_generation(t)
        if gen is not None and other is not None and other != gen:
            if other > gen and t.state in (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING):
                return t.number  # its block was re-made: this run of the old one is not paired any more
            continue
        if t.state == TrialState.COMPLETE or (
                t.state in (TrialState.RUNNING, TrialState.WAITING) and t.number < run.number):
            return t.number
    return None


def _run_key(run: FrozenTrial) -> tuple[Any, Any, Any]:
    """What makes a confirmation run one run: its trial, its seed, and for a PBT schedule its range's index."""
    attrs = run.system_attrs
    return attrs.get(ATTR_CONFIRM_OF), attrs.get(ATTR_CONFIRM_SEED), attrs.get(PBT_INDEX)
