"""What a run holds, from the study's storage: chains (a trial and its retries), job types, the outcome at the end,
metric names MLflow accepts."""

from __future__ import annotations

import math

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from hpo.study._confirm import ATTR_CONFIRM_OF
from hpo.tracking._content import ATTR_JOB_TYPE, chain_info, finished, job_type, metric_key


def _trial(number: int, state: TrialState = TrialState.COMPLETE, value: float | None = 0.5,
           system: dict[str, object] | None = None, user: dict[str, object] | None = None) -> optuna.trial.FrozenTrial:
    t = create_trial(state=state, value=value if state == TrialState.COMPLETE else None, params={"x": 0.3},
                     distributions={"x": FloatDistribution(0, 1)}, user_attrs=user or {}, system_attrs=system or {})
    t.number = number
    return t


def test_a_retry_belongs_to_its_first_trial_s_chain() -> None:
    first, retry = _trial(3), _trial(7, system={"failed_trial": 5, "retry_history": [3, 5]})
    assert chain_info(first).root == 3 and chain_info(first).attempts == (3,)
    info = chain_info(retry)
    assert info.root == 3 and info.trial == 7 and info.attempts == (3, 5, 7) and info.params == {"x": 0.3}


def test_job_types_tune_confirm_and_named() -> None:
    assert job_type(_trial(0)) == "tune"
    assert job_type(_trial(1, system={ATTR_CONFIRM_OF: 0, "hpo:confirm_seed": 1000})) == "confirm"
    assert job_type(_trial(2, system={ATTR_JOB_TYPE: "pbt"})) == "pbt"
    assert job_type(_trial(3, system={ATTR_JOB_TYPE: "Bad Name!"})) == "tune"
    assert job_type(_trial(4, system={"pbt:member": 2, "pbt:seq": 1})) == "pbt"  # a population member's segment
    assert job_type(_trial(5, system={"pbt:member": 2, ATTR_CONFIRM_OF: 4})) == "confirm"  # a schedule's confirmation


def test_the_outcome_at_the_end() -> None:
    ok = finished(_trial(0, user={"peak_memory_gb": 1.5, "wall_time_s": 12.0, "diagnosis": "healthy",
                                  "diagnosis_evidence": {"kl": [1, 2]}}), ["eval/reward_mean"])
    assert ok.status == "FINISHED" and ok.numbers == {"objective/eval/reward_mean": 0.5, "peak_memory_gb": 1.5,
                                                      "wall_time_s": 12.0}
    assert ok.words["outcome"] == "ok" and ok.words["diagnosis_evidence"] == '{"kl": [1, 2]}'
    oom = finished(_trial(1, value=-math.inf, user={"fail_reason": "oom", "stderr_tail": "x" * 9000}),
                   ["eval/reward_mean"])
    assert oom.status == "FAILED" and oom.words["fail_reason"] == "oom" and oom.words["outcome"] == "oom"
    assert oom.words["objective/eval/reward_mean"] == "-inf" and "stderr_tail" not in oom.words
    stopped = finished(_trial(2, state=TrialState.FAIL, user={"stop_reason": "interrupted"}), ["v"])
    assert stopped.status == "KILLED" and stopped.words["outcome"] == "interrupted"
    pruned = finished(_trial(3, state=TrialState.PRUNED, user={"stop_reason": "pruned"}), ["v"])
    assert pruned.status == "FINISHED" and pruned.words["outcome"] == "pruned"


def test_metric_names_mlflow_accepts() -> None:
    assert metric_key("val-core/openai/gsm8k/reward/mean@4") == "val-core/openai/gsm8k/reward/mean_at_4"
    assert metric_key("critic/score/mean") == "critic/score/mean"
    assert metric_key("/a//b/../c?") == "_/a/_/b/_/c_"


def test_a_large_space_logs_its_most_important_parameters() -> None:
    """Importances of a space of 1,200 parameters: the 50 most important (one MLflow batch takes 1,000 metrics)."""
    import random

    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    from hpo.tracking._content import MAX_IMPORTANCES, study_update

    study = optuna.create_study(direction="maximize")
    dists = {f"p{i}": FloatDistribution(0.0, 1.0) for i in range(1200)}
    rng = random.Random(0)
    for _ in range(20):
        params = {k: rng.random() for k in dists}
        study.add_trial(create_trial(params=params, distributions=dists, value=params["p7"]))
    upd = study_update(study, with_importances=True)
    assert len(upd.importances) == MAX_IMPORTANCES
    values = list(upd.importances.values())
    assert values == sorted(values, reverse=True)
