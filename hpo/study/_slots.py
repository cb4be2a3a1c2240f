"""How the study's target of finished trials is counted and claimed, by every driver of the study at once.

"Finished" trials, which count towards ``study.n_trials``: COMPLETE, PRUNED, and FAIL with a recorded result
(``on_failure: fail``). Confirmation trials (:mod:`hpo.study._confirm`) never count towards it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpo.record import ATTR_RECOVERING, ATTR_RETRY_HISTORY, ATTR_RETRY_OF, chain_root, is_confirm, is_finished


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
