"""Model-size fidelity for the sampler and the pruner (:mod:`hpo.samplers._fidelity`) on a real SQLite study: a new
trial's fidelity is decided and recorded when Optuna creates it (proxy until the study's check says otherwise, a
confirmation run on the target, a queued trial keeping its own), and each fidelity's sampler and the pruner see only
the trials of that fidelity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

from hpo.record import ATTR_CONFIRM_OF, ATTR_FIDELITY, ATTR_FIDELITY_CHECK, PROXY, TARGET
from hpo.samplers._fidelity import FidelityPruner, FidelitySampler, FidelityView, search_fidelity, with_fidelity

DIST = {"x": FloatDistribution(0.0, 1.0)}


class Seeing(optuna.samplers.RandomSampler):
    """A random sampler that records the trial numbers the study it is given holds, at each suggestion."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.saw: list[list[int]] = []

    def sample_independent(self, study: Any, trial: FrozenTrial, name: str, dist: Any) -> Any:
        self.saw.append([t.number for t in study.get_trials(deepcopy=False)])
        return super().sample_independent(study, trial, name, dist)


class SeeingPruner(optuna.pruners.BasePruner):
    def __init__(self) -> None:
        self.saw: list[list[int]] = []

    def prune(self, study: Any, trial: FrozenTrial) -> bool:
        self.saw.append([t.number for t in study.get_trials(deepcopy=False)])
        return False


def _study(tmp_path: Path) -> optuna.Study:
    """Trials 0, 1 on the proxy, 2 on the target, 3 a confirmation run (the target whatever it was tagged)."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", direction="maximize")
    for i, attrs in enumerate([{ATTR_FIDELITY: PROXY}, {ATTR_FIDELITY: PROXY}, {ATTR_FIDELITY: TARGET},
                               {ATTR_FIDELITY: PROXY, ATTR_CONFIRM_OF: 0}]):
        study.add_trial(create_trial(value=i / 10, params={"x": i / 10}, distributions=DIST, system_attrs=attrs))
    return study


def test_a_view_shows_one_fidelity_s_trials_only(tmp_path: Path) -> None:
    study = _study(tmp_path)
    proxy, target = FidelityView(study, PROXY), FidelityView(study, TARGET)
    assert [t.number for t in proxy.trials] == [0, 1]
    assert [t.number for t in target.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))] == [2, 3]
    assert [t.number for t in target._get_trials(deepcopy=False, use_cache=False)] == [2, 3]
    assert proxy.study_name == study.study_name and proxy.direction == study.direction  # the rest is the study's


def test_new_trials_are_the_proxy_s_until_the_check_says_it_does_not_hold(tmp_path: Path) -> None:
    study = _study(tmp_path)
    proxy_s, target_s = Seeing(), Seeing()
    study.sampler = FidelitySampler(proxy_s, target_s)
    assert search_fidelity(study) == PROXY
    t = study.ask()
    t.suggest_float("x", 0.0, 1.0)
    assert study.trials[t.number].system_attrs[ATTR_FIDELITY] == PROXY  # recorded before it runs
    assert proxy_s.saw == [[0, 1, 4]] and target_s.saw == []
    study.tell(t, 0.5)
    study.set_user_attr(ATTR_FIDELITY_CHECK, {"holds": True})
    assert search_fidelity(study) == PROXY
    study.set_user_attr(ATTR_FIDELITY_CHECK, {"holds": False})
    assert search_fidelity(study) == TARGET
    t = study.ask()
    t.suggest_float("x", 0.0, 1.0)
    assert study.trials[t.number].system_attrs[ATTR_FIDELITY] == TARGET
    assert target_s.saw == [[2, 3, 5]]  # never the proxy's values


def test_a_queued_trial_keeps_its_fidelity_and_a_confirmation_run_is_the_target_s(tmp_path: Path) -> None:
    study = _study(tmp_path)
    proxy_s, target_s = Seeing(), Seeing()
    study.sampler = FidelitySampler(proxy_s, target_s)
    for attr, value in ((ATTR_FIDELITY, TARGET), (ATTR_CONFIRM_OF, 1)):  # a promoted setting; a confirmation run
        study.enqueue_trial({})
        study._storage.set_trial_system_attr(study.trials[-1]._trial_id, attr, value)
        trial = study.ask()
        trial.suggest_float("x", 0.0, 1.0)  # no queued value: its fidelity's sampler is asked
        study.tell(trial, 0.9)
    assert proxy_s.saw == [] and target_s.saw == [[2, 3, 4], [2, 3, 4, 5]]
    assert ATTR_FIDELITY not in study.trials[5].system_attrs  # a confirmation run is the target's without a tag


def test_the_pruner_compares_a_trial_with_its_own_fidelity_only(tmp_path: Path) -> None:
    study = _study(tmp_path)
    inner = SeeingPruner()
    pruner = FidelityPruner(inner)
    assert pruner.prune(study, study.trials[0]) is False and pruner.prune(study, study.trials[2]) is False
    assert inner.saw == [[0, 1], [2, 3]]


def test_a_driver_gives_the_study_its_fidelity_sampler_and_pruner_once(tmp_path: Path) -> None:
    study = _study(tmp_path)
    with_fidelity(study, optuna.samplers.RandomSampler(seed=1))
    sampler, pruner = study.sampler, study.pruner
    assert isinstance(sampler, FidelitySampler) and isinstance(pruner, FidelityPruner)
    with_fidelity(study, optuna.samplers.RandomSampler(seed=2))  # a resume in the same process: not wrapped twice
    assert study.sampler is sampler and study.pruner is pruner
