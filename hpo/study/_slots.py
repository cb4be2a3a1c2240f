"""How the study's target of finished trials is counted and claimed, by every driver of the study at once.

"Finished" trials, which count towards ``study.n_trials``: COMPLETE, PRUNED, and FAIL with a recorded result
(``on_failure: fail``). Confirmation trials (:mod:`hpo.study._confirm`) never count towards it.

A proxy search (``study.fidelity.proxy``) has three targets in turn (:func:`proxy_stage`): ``study.n_trials`` proxy
trials, one target run per promoted setting, and, when the proxy does not hold, ``study.n_trials`` trials of a search
on the target; each trial claims a slot among its own kind (:func:`same_kind`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpo.experiment import Space, SpaceError
from hpo.record import (
    ATTR_FIDELITY_CHECK,
    ATTR_RECOVERING,
    ATTR_RETRY_HISTORY,
    ATTR_RETRY_OF,
    chain_root,
    is_confirm,
    is_finished,
    is_promoted,
    is_proxy,
    is_tie_run,
)
from hpo.samplers import promotion, promotion_pending, record_check, start_promotion, start_ties, ties_pending
from hpo.study._confirm import confirm_seeds


def n_finished(study: optuna.Study) -> int:
    return sum(is_finished(t) for t in study.get_trials(deepcopy=False))


def position(t: FrozenTrial) -> int:
    """The place in the study's target a trial claims: its own number, or for a retry its first original's."""
    return chain_root(t)


@dataclasses.dataclass
class Slots:
    """How the study's target of finished trials is claimed.

    Every trial that is finished, running, waiting, or failed with its retry pending (recovery marked it
    ``hpo:recovering``) holds its :func:`position`. A new trial is admitted when fewer than ``target``
    positions before its own number are held, so drivers that ask at the same moment agree on which of
    them is surplus; a retry inherits its original's position and is never surplus."""

    finished: int
    held: set[int]
    waiting: int

    @classmethod
    def count(cls, trials: Sequence[FrozenTrial], max_retry: int | None) -> Slots:
        retried = {t.system_attrs.get(ATTR_RETRY_OF) for t in trials}
        held: set[int] = set()
        finished = waiting = 0
        for t in trials:
            if is_confirm(t):
                continue  # outside the search's target (see the module docstring)
            if is_finished(t):
                finished += 1
            elif t.state == TrialState.RUNNING:
                pass  # holds its position, like the rest
            elif t.state == TrialState.WAITING:
                waiting += 1
            elif not (t.state == TrialState.FAIL and ATTR_RECOVERING in t.system_attrs and t.number not in retried
                      and (max_retry is None or len(t.system_attrs.get(ATTR_RETRY_HISTORY, [])) < max_retry)):
                continue
            held.add(position(t))
        return cls(finished, held, waiting)

    def admits(self, number: int, target: int) -> bool:
        return sum(p < number for p in self.held) < target


# ----------------------------------------------------------------------------- study.fidelity.proxy
def same_kind(trials: Sequence[FrozenTrial], like: FrozenTrial) -> list[FrozenTrial]:
    """A proxy search's trials that share ``like``'s place in a target: its proxy trials (``study.n_trials`` of
    them), its tie runs (queued), its promoted target runs (one per promoted setting, queued), or its target
    search's (a fallback's ``study.n_trials``)."""
    return [t for t in trials if is_proxy(t) == is_proxy(like) and is_promoted(t) == is_promoted(like)
            and is_tie_run(t) == is_tie_run(like) and not is_confirm(t)]


def _target_search(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    return [t for t in trials if not is_proxy(t) and not is_promoted(t) and not is_confirm(t)]


@dataclasses.dataclass(frozen=True)
class Stage:
    """Where a proxy search stands for a job about to ask for a trial: ``done`` (nothing left to ask), ``full``
    (every slot held: wait), the proxy's ``check`` once it is made, and whether the search is on the target
    (``fallback``: the study's budget applies to it)."""

    done: bool
    full: bool
    check: dict[str, Any] | None = None
    fallback: bool = False


def proxy_stage(study: optuna.Study, space: Space, trials: Sequence[FrozenTrial], target: int,
                factors: dict[str, float]) -> Stage:
    """A proxy search's stages (:mod:`hpo.samplers._promotion`, :mod:`hpo.samplers._check`): its ``target`` proxy
    trials; then the tie runs of the best settings it cannot tell apart (``tie_seeds``); then its best settings'
    target runs (each stage queued once, whoever gets here first); then the check, which ends the search (the proxy
    holds) or starts a search of ``target`` trials on the target."""
    retry = space.study.max_retry
    slots = Slots.count([t for t in trials if is_proxy(t) and not is_confirm(t) and not is_tie_run(t)], retry)
    if slots.finished < target:
        return Stage(False, not slots.waiting and len(slots.held) >= target)
    if start_ties(study, space, _tie_seeds(space)):  # queued here: the next ask pops them
        return Stage(False, False)
    # read again: runs another driver queued after ``trials`` was read are pending too (never decide without them)
    waiting, running = ties_pending(study.get_trials(deepcopy=False))
    if waiting or running:
        return Stage(False, not waiting)
    if start_promotion(study, space):  # queued here: the next ask pops them
        return Stage(False, False)
    waiting, running = promotion_pending(study.get_trials(deepcopy=False))
    if waiting or running:
        return Stage(False, not waiting)
    check = record_check(study, space, factors, promotion(study) or {})
    if check.get("holds"):
        return Stage(True, False, check)
    slots = Slots.count(_target_search(trials), retry)
    if slots.finished >= target:
        return Stage(True, False, check, True)
    return Stage(False, not slots.waiting and len(slots.held) >= target, check, True)


def _tie_seeds(space: Space) -> list[int]:
    """The seeds a tie run takes: the race's first ``tie_seeds`` (none where the study has no fresh seed to give)."""
    proxy = space.study.fidelity.proxy
    try:
        return confirm_seeds(space, proxy.tie_seeds) if proxy is not None and proxy.tie_seeds else []
    except (SpaceError, ValueError):
        return []


def proxy_search_over(study: optuna.Study, target: int, max_retry: int | None) -> bool:
    """A proxy search has nothing left to run: its check holds, or its target search has ``target`` trials."""
    check = study.user_attrs.get(ATTR_FIDELITY_CHECK)
    if not isinstance(check, dict):
        return False
    return bool(check.get("holds")) or Slots.count(_target_search(study.get_trials(deepcopy=False)),
                                                   max_retry).finished >= target
