"""The stored record: what a stored trial is, read from attributes that shared storage may have filled with
anything."""

from __future__ import annotations

from typing import Any

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState, create_trial

from hpo.record import (
    ATTR_CONFIRM_OF,
    ATTR_HEARTBEAT,
    ATTR_RESULT,
    ATTR_RETRY_HISTORY,
    chain_root,
    is_confirm,
    is_finished,
    retry_history,
    runs_steps,
)


def _trial(state: TrialState, number: int = 7, system: dict[str, Any] | None = None,
           user: dict[str, Any] | None = None) -> FrozenTrial:
    t = create_trial(state=state, value=1.0 if state == TrialState.COMPLETE else None,
                     system_attrs=system or {}, user_attrs=user or {})
    t.number = number
    return t


@pytest.mark.parametrize(("state", "system", "user", "finished"), [
    (TrialState.COMPLETE, {}, {}, True),
    (TrialState.PRUNED, {}, {}, True),
    (TrialState.FAIL, {ATTR_RESULT: {"values": None}}, {}, True),  # on_failure: fail, recorded by its driver
    (TrialState.FAIL, {}, {"fail_reason": "crash"}, True),
    (TrialState.FAIL, {ATTR_HEARTBEAT: 1.0}, {"fail_reason": "crash"}, False),  # failed by recovery: its retry counts
    (TrialState.FAIL, {}, {"stop_reason": "interrupted"}, False),
    (TrialState.COMPLETE, {ATTR_CONFIRM_OF: 3}, {}, False),  # a confirmation run never counts towards the target
])
def test_what_counts_as_finished(state: TrialState, system: dict[str, Any], user: dict[str, Any],
                                 finished: bool) -> None:
    assert is_finished(_trial(state, system=system, user=user)) is finished


@pytest.mark.parametrize(("history", "chain", "root"), [
    (None, [], 7), ([2, 5], [2, 5], 2), ("2,5", [], 7), ([None, "x", 4, True], [4], 4), ({"a": 1}, [], 7),
])
def test_a_retry_chain_read_from_hostile_storage(history: Any, chain: list[int], root: int) -> None:
    t = _trial(TrialState.RUNNING, system={} if history is None else {ATTR_RETRY_HISTORY: history})
    assert retry_history(t) == chain and chain_root(t) == root


def test_the_study_loop_writes_what_the_record_reads(tmp_path: Any) -> None:
    """Keys written by Optuna's retry callback and the driver's confirmation queue are the ones read here."""
    from hpo.study._recovery import queue_retry

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}")
    trial = study.ask()
    study.tell(trial, state=TrialState.FAIL)
    queue_retry(study, study.get_trials()[0], max_retry=None)
    retry = study.get_trials()[-1]
    assert retry_history(retry) == [0] and chain_root(retry) == 0 and not is_confirm(retry)
    assert not runs_steps(retry.system_attrs)
