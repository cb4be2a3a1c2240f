"""Asynchronous successive halving over retry chains (:class:`hpo.samplers.ChainHalvingPruner`): promotions with
known answers on synthetic curves, on a real (in-memory) Optuna study."""

from __future__ import annotations

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from hpo.samplers import ChainHalvingPruner

X = {"x": FloatDistribution(0.0, 1.0)}


def _study() -> optuna.Study:
    return optuna.create_study(direction="maximize", pruner=ChainHalvingPruner(min_resource=2, reduction_factor=3),
                               sampler=optuna.samplers.RandomSampler(seed=0))


def _reach(study: optuna.Study, curve: dict[int, float], trial: optuna.Trial | None = None) -> tuple[bool, int]:
    """Report ``curve`` step by step until pruned; (pruned, last step)."""
    t = trial or study.ask(X)
    for step, value in sorted(curve.items()):
        t.report(value, step)
        if t.should_prune():
            study.tell(t, state=TrialState.PRUNED)
            return True, step
    study.tell(t, curve[max(curve)])
    return False, max(curve)


def test_rungs_promote_the_top_third_as_values_arrive() -> None:
    """Rungs at steps 2, 6 (min_resource x 3^k). The first trial is promoted alone; then a trial passes rung k only
    with a value in the top 1/3 of the values recorded there (the best one while fewer than 3 are)."""
    study = _study()
    assert _reach(study, {2: 0.5, 6: 0.6, 8: 0.7}) == (False, 8)  # alone at both rungs: promoted
    assert _reach(study, {2: 0.4, 6: 0.9}) == (True, 2)  # below 0.5 at rung 0
    assert _reach(study, {2: 0.8, 6: 0.5, 8: 0.9}) == (True, 6)  # best at rung 0, below 0.6 at rung 1
    assert _reach(study, {0: 0.0, 1: 0.1, 2: 0.85, 6: 0.95, 8: 0.99}) == (False, 8)  # steps before a rung: no say
    rung0 = sorted(t.system_attrs["completed_rung_0"] for t in study.trials)
    assert rung0 == [0.4, 0.5, 0.8, 0.85]


def test_an_interrupted_attempt_counts_once_through_its_retry() -> None:
    """Trial 1 reached rung 0 with 0.9 and was interrupted; its retry carries that rung. A newcomer at 0.75 is in the
    top third of the 6 chains' values (0.9, 0.75, 0.7, ...) and promoted; counting the interrupted attempt too (7
    values, 0.9 twice) would prune it."""
    study = _study()
    _reach(study, {2: 0.5, 4: 0.5})
    a = study.ask(X)
    a.report(0.9, 2)
    assert not a.should_prune()
    study.tell(a, state=TrialState.FAIL)  # its driver died
    frozen = study.trials[a.number]
    study.add_trial(create_trial(state=TrialState.WAITING, params=frozen.params, distributions=frozen.distributions,
                                 system_attrs={**frozen.system_attrs, "failed_trial": a.number}))
    retry = study.ask(X)
    assert retry.number != a.number and study.trials[retry.number].system_attrs["completed_rung_0"] == 0.9
    for v in (0.6, 0.55, 0.7):
        assert _reach(study, {2: v}) == (True, 2)
    assert _reach(study, {2: 0.75, 4: 0.8}) == (False, 4)
    plain = optuna.create_study(direction="maximize", storage=optuna.storages.InMemoryStorage(),
                                pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=2, reduction_factor=3))
    for t in study.trials[:-1]:
        plain.add_trial(t)
    assert _reach(plain, {2: 0.75, 4: 0.8}) == (True, 2)  # Optuna's own counts the 0.9 twice
