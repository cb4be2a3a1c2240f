"""Queueing confirmation runs (the baseline's reused from this host where kept), and what ``study.budget`` keeps for
them while the search runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpo.backends import backend_of
from hpo.experiment import Space
from hpo.record import (
    ATTR_BASELINE,
    ATTR_CONFIRM_OF,
    ATTR_CONFIRM_SEED,
    full_steps,
    is_confirm,
    study_cost,
)
from hpo.samplers import promote_steps, unmeasured_setting
from hpo.study._confirm._baselines import Note, baseline_key, baseline_run, cached_baseline
from hpo.study._confirm._seeds import BASELINE_OF, confirm_seeds, present_runs, top_trials


def queue_runs(study: optuna.Study, runs: list[tuple[FrozenTrial | None, int]],
               space: Space | None = None, cache: Path | None = None, note: Note | None = None,
               attrs: Mapping[tuple[int, int], Mapping[str, Any]] | None = None) -> list[tuple[int, int]]:
    """Queue a run per (trial, seed) not present yet (None: the baseline); returns what was queued. A baseline run
    this host already ran for the same experiment, seed and trainer version (``cache``: :func:`baseline_cache`) is
    added finished, from there, instead of queued (user attr ``baseline_reused``). ``attrs``: more system attrs of the
    run of (trial, seed) (a continuation of a promoted run: :mod:`hpo.study._continuation`)."""
    present = present_runs(study)
    queued = []
    key = baseline_key(space) if space is not None and cache is not None else None
    for t, seed in runs:
        of = BASELINE_OF if t is None else t.number
        if (of, seed) in present:
            continue
        kept = cached_baseline(cache, key, seed, space, note, study._storage) \
            if t is None and cache is not None and key else None
        if kept is not None:
            study.add_trial(baseline_run(seed, kept["intermediate_values"], kept["user_attrs"], kept["value"]))
        elif t is None:
            study.add_trial(optuna.create_trial(
                state=TrialState.WAITING, params={}, distributions={},
                system_attrs={ATTR_CONFIRM_OF: BASELINE_OF, ATTR_CONFIRM_SEED: seed, ATTR_BASELINE: True}))
        else:
            study.add_trial(optuna.create_trial(
                state=TrialState.WAITING, params=t.params, distributions=t.distributions,
                system_attrs={ATTR_CONFIRM_OF: t.number, ATTR_CONFIRM_SEED: seed,
                              **(attrs or {}).get((t.number, seed), {})}))
        present.add((of, seed))
        queued.append((of, seed))
    return queued


def confirm_reserve(space: Space, cache: Path | None = None, trials: Sequence[FrozenTrial] = (),
                    check: Any = None) -> float:
    """The least full runs the confirmation needs (what a ``study.budget`` keeps for it): ``top_k`` candidates and
    the baseline on ``min_seeds`` seeds when racing (``seeds`` when not), less the baseline runs this host keeps.

    A racing proxy search (``study.fidelity.proxy``) whose check has not failed (``check``: the study's
    :data:`~hpo.record.ATTR_FIDELITY_CHECK`, None before it is made) races ``confirm_top`` settings instead (one more
    where the check kept a catch-up the proxy never measured: :func:`~hpo.samplers.unmeasured_setting`), the first
    seed of each continuing its promoted run: ``(full - promote_steps) / full`` of a run where the trainer continues
    runs and a full run's length is known from ``trials`` (else a whole run). After a failed check the race takes the
    top ``top_k`` target runs and only those of promoted settings continue (:mod:`hpo.study._continuation`), which
    the search cannot know: they count as whole runs (a continuation only costs less)."""
    conf = space.study.confirm
    n = conf.min_seeds if conf.race else conf.seeds
    base = 0
    if space.study.baseline:
        key = baseline_key(space) if cache is not None else None
        base = sum(1 for seed in confirm_seeds(space, n)
                   if cache is None or cached_baseline(cache, key, seed, space, note=lambda _: None) is None)
    proxy = space.study.fidelity.proxy
    if proxy is None or not conf.race or isinstance(check, dict) and check.get("holds") is not True:
        return float(conf.top_k * n + base)
    first, full = 1.0, full_steps(trials)
    resumable = backend_of(space).resumable
    if full and resumable is not None and resumable.save_at is not None:
        first = max(0.0, (full - promote_steps(space, trials)) / full)
    return (proxy.confirm_top + (unmeasured_setting(check) is not None)) * (n - 1 + first) + base


def search_over_budget(trials: list[FrozenTrial], space: Space, cache: Path | None,
                       starting: int = 0, check: Any = None) -> tuple[float, float] | None:
    """``study.budget`` for the search: (what the study spent, in full runs, and what it keeps for the confirmation,
    :func:`confirm_reserve`; ``check``: a proxy search's check, None before it) once the search has no room left,
    None while it has (or without a budget, or before a full run's length is known).

    Room is what the budget leaves after the study's steps (a running trial's up to its last evaluation) and the
    confirmation's least, less one evaluation interval (the largest gap between two evaluations a search trial
    logged, from step 0) for every running search trial and each of ``starting`` trials about to start: a trial is
    only checked at its evaluations, so that interval is what it may still run before its next check. The search
    stops asking for trials, and stops a running one (``stop_reason=budget``), once there is none: it never spends
    past ``budget`` less the reserve."""
    budget = space.study.budget
    if budget is None:
        return None
    cost = study_cost(trials)
    if not cost.full:
        return None
    search = [t for t in trials if not is_confirm(t)]
    gap = 0
    for t in search:
        steps = [0, *sorted(t.intermediate_values)]
        gap = max([gap, *(b - a for a, b in zip(steps, steps[1:]))])
    running = sum(1 for t in search if t.state == TrialState.RUNNING)
    reserve = confirm_reserve(space, cache, trials, check)
    spent = cost.search_steps + cost.confirm_steps
    if spent + reserve * cost.full + (running + starting) * (gap or cost.full) <= budget * cost.full:
        return None
    return spent / cost.full, reserve


def queue_confirmations(study: optuna.Study, space: Space, top_k: int, n_seeds: int,
                        cache: Path | None = None, note: Note | None = None) -> list[tuple[int, int]]:
    """Queue the missing (trial, seed) runs of the top ``top_k`` trials (and the baseline's, reused from ``cache``
    where this host has them); returns what was queued. (A racing confirmation queues round by round instead:
    :func:`hpo.study._compare.start_race`.)"""
    seeds = confirm_seeds(space, n_seeds)
    runs: list[tuple[FrozenTrial | None, int]] = [(t, seed) for t in top_trials(study, top_k) for seed in seeds]
    if space.study.baseline:  # the same seeds for the setting a user would have run anyway
        runs += [(None, seed) for seed in seeds]
    return queue_runs(study, runs, space, cache, note)


def pending(study: optuna.Study) -> int:
    """Confirmation runs queued or running."""
    return sum(1 for t in study.get_trials(deepcopy=False)
               if is_confirm(t) and t.state in (TrialState.WAITING, TrialState.RUNNING))
