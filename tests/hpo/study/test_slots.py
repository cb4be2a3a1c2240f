"""How a study's target of finished trials is counted and claimed by every driver of the study at once
(``hpo/study/_slots.py``), on real Optuna studies: what counts as finished (a confirmation run never does), which
trials hold a place in the target (a retry holds its original's), and the new trial each driver may admit, so that
drivers asking at the same moment agree on which of them is surplus."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState, create_trial

from hpo.record import ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED, ATTR_RECOVERING, ATTR_RETRY_HISTORY, ATTR_RETRY_OF
from hpo.study import n_finished
from hpo.study._slots import Slots, position

optuna.logging.set_verbosity(optuna.logging.WARNING)


def study_of(*trials: tuple[TrialState, dict[str, Any], dict[str, Any]]) -> optuna.Study:
    """A study holding ``(state, system_attrs, user_attrs)`` trials, numbered in order."""
    study = optuna.create_study()
    for state, system, user in trials:
        value = {"value": 0.5} if state == TrialState.COMPLETE else {}
        study.add_trial(create_trial(state=state, system_attrs=system, user_attrs=user, **value))
    return study


CONFIRM = {ATTR_CONFIRM_OF: 0, ATTR_CONFIRM_SEED: 1001}


def test_finished_trials_count_and_confirmation_runs_never_do() -> None:
    study = study_of((TrialState.COMPLETE, {}, {}), (TrialState.PRUNED, {}, {}),
                     (TrialState.FAIL, {}, {"fail_reason": "crash"}),  # on_failure: fail, its result recorded
                     (TrialState.FAIL, {}, {"stop_reason": "interrupted"}),  # its retry is what counts
                     (TrialState.RUNNING, {}, {}), (TrialState.WAITING, {}, {}),
                     (TrialState.COMPLETE, CONFIRM, {}))
    assert n_finished(study) == 3
    slots = Slots.count(study.get_trials(), max_retry=None)
    assert (slots.finished, slots.waiting) == (3, 1)
    assert slots.held == {0, 1, 2, 4, 5}  # the interrupted trial's place is its retry's; a confirmation holds none


def test_a_retry_holds_its_original_s_place_and_a_dead_driver_s_trial_holds_it_until_retried() -> None:
    study = study_of((TrialState.COMPLETE, {}, {}),
                     (TrialState.FAIL, {ATTR_RECOVERING: True}, {}),  # a dead driver's: its retry is due
                     (TrialState.FAIL, {ATTR_RECOVERING: True}, {}),
                     (TrialState.WAITING, {ATTR_RETRY_OF: 2, ATTR_RETRY_HISTORY: [2]}, {}))
    trials = study.get_trials()
    assert [position(t) for t in trials] == [0, 1, 2, 2]
    slots = Slots.count(trials, max_retry=None)
    assert slots.held == {0, 1, 2} and slots.waiting == 1
    # out of retries: trial 1's place is free again
    spent = study_of((TrialState.FAIL, {ATTR_RECOVERING: True, ATTR_RETRY_HISTORY: [7, 8]}, {}))
    assert Slots.count(spent.get_trials(), max_retry=2).held == set()
    assert Slots.count(spent.get_trials(), max_retry=3).held == {7}


def test_a_new_trial_is_admitted_only_while_fewer_than_the_target_are_held_before_it() -> None:
    """A target of 4 with places 0-2 held: trials 3, 4 and 5 asked at once each count the places before their own
    number; once trial 3 holds its place, 4 and 5 are surplus, whichever driver asked first. A place held after a
    trial's number never shuts it out."""
    slots = Slots(finished=2, held={0, 1, 2}, waiting=0)
    assert [slots.admits(n, target=4) for n in (3, 4, 5)] == [True, True, True]  # each alone sees 3 before it
    slots.held |= {3}  # trial 3 holds its place
    assert [slots.admits(n, target=4) for n in (4, 5)] == [False, False]
    assert Slots(finished=0, held={5, 6, 7, 8}, waiting=0).admits(2, target=1)


def test_a_proxy_search_waits_for_tie_runs_another_driver_queued_after_its_snapshot(tmp_path: Any) -> None:
    """Driver A read the study's trials (its snapshot: the 4 proxy trials, no tie run yet); driver B then queued the
    round's tie runs. A's stage must see them pending (read again) and promote nothing: a promotion decided from the
    snapshot would rank the tied settings without their other seeds, and it is kept once for every driver."""
    import yaml

    from hpo.experiment import read_space
    from hpo.record import ATTR_FIDELITY, ATTR_PROMOTION, PROXY
    from hpo.samplers import start_ties
    from hpo.study._slots import proxy_stage

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({
        "config": "tiny_arith", "params": {"x": {"key": "fake.x", "type": "float", "low": 0.0, "high": 1.0}},
        "early_stopping": {"plateau_min_delta": 0.01},
        "study": {"n_trials": 4, "fidelity": {"proxy": {"overrides": {"m": "small"}, "promote": 2,
                                                        "tie_seeds": 1}}}}))
    space = read_space(str(path))[0]
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", direction="maximize")
    dist: dict[str, optuna.distributions.BaseDistribution] = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}
    for i, v in enumerate((0.5, 0.930, 0.925, 0.1)):
        study.add_trial(create_trial(value=v, params={"x": i / 10}, distributions=dist,
                                     system_attrs={ATTR_FIDELITY: PROXY}, user_attrs={"last_step": 10}))
    snapshot = study.get_trials(deepcopy=False)  # driver A's
    assert start_ties(study, space, [1000]) == [(1, 1000), (2, 1000)]  # driver B
    stage = proxy_stage(study, space, snapshot, 4, {})
    assert not stage.done and not stage.full  # the tie runs wait for the next ask; nothing is decided before them
    assert ATTR_PROMOTION not in study._storage.get_study_system_attrs(study._study_id)
