"""Which seeds a confirmation run may take and what it sets: the seed keys of the trainer, every seed a tuning trial ran
(or could have run) with, the fresh seeds after them, the held-out split, and the top distinct search trials."""

from __future__ import annotations

import math
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpo.backends import backend_of
from hpo.experiment import Space, SpaceError
from hpo.record import (
    ATTR_CONFIRM_OF,
    ATTR_CONFIRM_SEED,
    is_confirm,
    is_failed,
    is_proxy,
)

BASELINE_OF = -1  # hpo:confirm_of of a baseline run (no trial of the search)
MAX_TUNED_SEEDS = 100_000  # a tuned integer seed range larger than this is treated as "any seed" (refused)




def heldout_overrides(space: Space) -> dict[str, Any]:
    """What a confirmation run adds to be measured on the held-out test split (:mod:`hpo.experiment._heldout`):
    the trainer's ``confirmation`` says (verl_core ``data.test_files``: ``study.confirm.test_files``, else the
    built-in task's test split when ``data.val_files`` is ``builtin:<task>``; verl: ``data.val_files`` replaced by
    ``study.confirm.test_files``); {} for a trainer without the feature."""
    confirmation = backend_of(space).confirmation
    return {} if confirmation is None else confirmation.heldout_overrides(space)


def heldout_note(space: Space) -> str:
    """One line on where confirmation runs measure the held-out value ("" when they do not)."""
    confirmation = backend_of(space).confirmation
    return "" if confirmation is None else confirmation.heldout_note(space)


def heldout_metric_of(space: Space) -> str | None:
    """The metric a confirmation run's held-out value is read from: ``study.confirm.test_metric``, else verl_core's
    ``test/...`` twin of the objective's metric, or verl's objective metric itself when ``data.val_files`` is swapped
    for the test file; None without a held-out split."""
    confirmation = backend_of(space).confirmation
    return None if confirmation is None else confirmation.heldout_metric(space)


def confirm_overrides(space: Space, seed: int, baseline: bool = False) -> dict[str, Any]:
    """Everything a confirmation run sets beyond the tuned values: the baseline's overrides (baseline runs), every
    seed key, the held-out split."""
    held = heldout_overrides(space) if space.study.kind != "throughput" else {}  # a speed run measures no data
    return {**(space.study.baseline if baseline else {}), **seed_overrides(space, seed), **held}


def seed_keys(space: Space) -> tuple[str, ...]:
    """The trainer keys of a run's seeds: ``study.confirm.seed_key``, else the trainer's (its ``confirmation``
    feature's ``seed_keys``: ``trainer.seed`` for verl_core, every seed of a verl run, each checked to exist in verl
    0.9.1's composed config). SpaceError (one line) for a trainer without seed keys and no ``seed_key``."""
    if space.study.confirm.seed_key:
        return (space.study.confirm.seed_key,)
    backend = backend_of(space)
    if backend.confirmation is None or not backend.confirmation.seed_keys:
        raise SpaceError(f"{space.source}: study.confirm.seed_key: needed: trial.backend {space.trial.backend} names "
                         "no seed keys, so a confirmation run cannot be given a fresh seed; set the trainer key of "
                         "its seed")
    return tuple(backend.confirmation.seed_keys)


def seed_key(space: Space) -> str:
    """The first of :func:`seed_keys` (the one shown with a confirmation run)."""
    return seed_keys(space)[0]


def seed_overrides(space: Space, seed: int) -> dict[str, int]:
    """What a confirmation run with ``seed`` sets: every seed key to it."""
    return {key: int(seed) for key in seed_keys(space)}


def tuning_seeds(space: Space) -> set[int]:
    """Every seed a tuning trial of ``space`` ran (or could have run) with, under any of its seed keys."""
    seeds: set[int] = set()
    for key in seed_keys(space):
        seeds |= _tuning_seeds(space, key)
    return seeds


def _tuning_seeds(space: Space, key: str) -> set[int]:
    seeds: set[int] = set()
    fixed = next((k for k in space.overrides if k.lstrip("+") == key), None)
    if fixed is not None:
        if space.overrides[fixed] is not None:
            seeds.add(int(space.overrides[fixed]))
    else:
        confirmation = backend_of(space).confirmation
        default = None if confirmation is None else confirmation.default_seed(space, key)
        if default is not None:
            seeds.add(default)
    for p in space.params:
        if p.key.lstrip("+") != key:
            continue
        if p.type == "categorical":
            seeds.update(int(c) for c in p.choices or () if isinstance(c, (int, float)))
        elif p.low is not None and p.high is not None:
            if p.high - p.low > MAX_TUNED_SEEDS:
                raise ValueError(f"params.{p.name}: the seed {key} is tuned over {p.low}..{p.high}; no fresh seed "
                                 "is left for confirmation")
            seeds.update(range(int(p.low), int(p.high) + 1))
    return seeds


def confirm_seeds(space: Space, n: int) -> list[int]:
    """The first ``n`` confirmation seeds: ``seed_base`` upwards, skipping tuning seeds."""
    used, s = tuning_seeds(space), space.study.confirm.seed_base
    out: list[int] = []
    while len(out) < n:
        if s not in used:
            out.append(s)
        s += 1
    return out


def _sign(study: optuna.Study) -> float:
    return 1.0 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else -1.0


def top_trials(study: optuna.Study, k: int) -> list[FrozenTrial]:
    """The ``k`` best search trials with distinct parameters (COMPLETE, finite, feasible, not failed: a timed-out
    throughput trial's finite value is no measurement), best first; a proxy
    search's are its target runs (``study.fidelity.proxy``: a proxy value is not a target value)."""
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if not is_confirm(t) and not is_proxy(t) and not is_failed(t) and t.values is not None
            and all(math.isfinite(v) for v in t.values) and all(v <= 0 for v in t.constraints.values())]
    done.sort(key=lambda t: (-_sign(study) * float(t.values[0]), t.number))
    out: list[FrozenTrial] = []
    seen: list[dict[str, Any]] = []
    for t in done:
        if t.params not in seen:
            seen.append(t.params)
            out.append(t)
        if len(out) == k:
            break
    return out


def present_runs(study: optuna.Study) -> set[tuple[Any, Any]]:
    """(confirmed trial, seed) of every confirmation run queued, running or finished (not failed-and-retried)."""
    return {(t.system_attrs[ATTR_CONFIRM_OF], t.system_attrs.get(ATTR_CONFIRM_SEED))
            for t in study.get_trials(deepcopy=False) if is_confirm(t)
            and t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)}
