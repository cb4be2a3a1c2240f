"""Racing confirmation (``study.confirm.race``): the race's decision after a round (:func:`race_step`), its settings
kept in the study (:func:`start_race`), its state replayed from the finished runs (:func:`race_state`), its next
round queued (:func:`advance_race`), and which of two twin confirmation runs goes first (:func:`twin_of`). The rules:
:mod:`hpo.study._compare`.
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

from hpo.experiment import Space
from hpo.record import ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED, ATTR_CONTINUES, ATTR_RACE, PBT_INDEX, is_confirm, study_cost
from hpo.study._compare._intervals import Difference, improvement, paired
from hpo.study._confirm import (
    Confirmed,
    baseline_confirmed,
    confirm_seeds,
    confirmed,
    queue_runs,
    speed_generation,
)
from hpo.study._continuation import PROXY_RACE, continued, proxy_race, top_k_race


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
    candidate on the first call). A proxy search whose proxy held races its field instead of the top ``top_k``
    (:func:`hpo.study._continuation.proxy_race`: ``confirm_top`` promoted runs); in both fields a candidate whose
    setting was promoted (:func:`hpo.study._continuation.continued_runs`) has its first seed continue the promoted
    run (system attr :data:`~hpo.record.ATTR_CONTINUES`)."""
    if ATTR_RACE not in study._storage.get_study_system_attrs(study._study_id):
        conf = space.study.confirm
        proxy = proxy_race(study, space)  # the proxy held: its field, first seeds continuing the promoted runs
        if proxy:
            candidates = list(proxy["field"])
        else:  # the top_k, first seeds of promoted settings among them continuing their promoted runs
            candidates, proxy = top_k_race(study, space, top_k)
        if not candidates:  # nothing finished with a finite value yet: no race (and no baseline) to run
            return []
        study._storage.set_study_system_attr(study._study_id, ATTR_RACE, {
            "candidates": candidates, "max_seeds": int(n_seeds), "min_seeds": min(conf.min_seeds, int(n_seeds)),
            "resolution": conf.resolution, **({PROXY_RACE: proxy} if proxy else {})})
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
    (``values``: candidate -> its values; the tie rule's default too, :func:`hpo.study._compare.verdict`)."""
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
    settings = study._storage.get_study_system_attrs(study._study_id).get(ATTR_RACE)
    proxy = settings.get(PROXY_RACE) if isinstance(settings, dict) else None
    attrs = {(c, race.seeds[0]): {ATTR_CONTINUES: n} for c, n in continued(proxy).items()}
    return queue_runs(study, runs, space, cache, note, attrs)


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
