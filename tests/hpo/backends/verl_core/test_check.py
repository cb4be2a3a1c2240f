"""The ``verl_core`` trainer's check of an experiment (``hpo/backends/verl_core/_check.py``, through
:func:`hpo.backends.load_space`): every fixed, tuned and baseline key is one of the trainer's, the driver's own key is
neither fixed nor tuned, the objective is a metric the trainer logs, the baseline is a config the trainer accepts, and
a tuned value the trainer refuses together with the others is named with why. Each is one line naming the field."""

from __future__ import annotations

import pytest

from hpo.backends import load_space
from hpo.backends.verl_core._check import rejected
from hpo.experiment import SpaceError


@pytest.mark.parametrize(("override", "said"), [
    ("foo.bar=1", "overrides.foo.bar: unknown trainer key (value 1)"),
    ("params.kl_coef.key=algorithm.kl_ctrl.nope", "params.kl_coef.key: unknown trainer key 'algorithm.kl_ctrl.nope'"),
    ("study.baseline={foo.baz: 2}", "study.baseline.foo.baz: unknown trainer key (value 2)"),
    ("trainer.default_local_dir=/x", "overrides.trainer.default_local_dir: trainer.default_local_dir is set by the "
                                     "driver"),
    ("objective.metric=eval/rewrd_mean", "objective.metric: unknown metric 'eval/rewrd_mean': the trainer's "
                                         "evaluations log eval/reward_mean, eval/reward_std, "),
    ("study.baseline={trainer.total_training_steps: -3}", "study.baseline: rejected by the trainer: "
                                                          "trainer.total_training_steps=-3 must be positive"),
])
def test_each_key_metric_and_baseline_is_the_trainer_s(override: str, said: str) -> None:
    with pytest.raises(SpaceError) as err:
        load_space("kl_lr", [override])
    assert str(err.value).startswith(f"--override {override!r}: {said}") and "\n" not in str(err.value)


def test_a_fixed_value_refused_with_every_tuned_value_names_a_parameter_and_why() -> None:
    with pytest.raises(SpaceError) as err:
        load_space("kl_lr", ["data.train_batch_size=7"])
    assert str(err.value) == (
        "search_spaces/kl_lr.yaml: params.kl_coef: value 0.01 is rejected by the trainer with every combination of "
        "the tuned keys' values: actor_rollout_ref.actor.ppo_mini_batch_size=32 is larger than "
        "data.train_batch_size=7")


def test_tuned_values_are_refused_together_only_where_the_trainer_refuses_them() -> None:
    space = load_space("kl_lr")
    assert rejected(space, {}) is None and rejected(space, {"kl_coef": 0.1, "actor_lr": 1e-5}) is None
    assert rejected(space, {"kl_coef": -1.0, "actor_lr": 1e-5}) == "algorithm.kl_ctrl.kl_coef=-1.0 must be >= 0"
