"""The metric names verl 0.9.1 logs (``hpo/backends/verl/_metric_names.py``): which names a run logs, training
namespaces and validation means, spreads and best/worst-of-n in verl's ``val-core`` / ``val-aux`` form (the core
variable ``acc`` unless the reward function's dict has none), and the examples shown when a name is not one. Whether
an experiment's objective names one: ``test_check.py``."""

from __future__ import annotations

import pytest

from hpo.backends.verl import val_core_metric, verl_metric_examples, verl_metric_ok
from tests.hpo.backends.verl.conftest import VAL


@pytest.mark.parametrize(("metric", "val_n", "sources", "ok"), [
    (VAL, None, None, True),
    (VAL, 1, ("openai/gsm8k",), True),
    ("val-core/openai/gsm8k/reward/mean@1", None, None, True),  # a reward function's dict without acc
    ("val-aux/openai/gsm8k/reward/mean@1", None, None, True),  # with acc: reward is aux
    ("val-aux/openai/gsm8k/acc/std@4", 4, None, True),
    ("val-core/openai/gsm8k/reward/mean@4", 1, None, False),  # verl logs mean@<val_kwargs.n>
    ("val-core/openai/gsm8k/reward/mean@4", 4, None, True),
    ("val-aux/openai/gsm8k/reward/std@4", 4, None, True),
    ("val-aux/openai/gsm8k/reward/std@1", 1, None, False),  # no spread of one sample
    ("val-core/openai/gsm8k/reward/std@4", 4, None, False),  # std is aux, not core
    ("val-core/openai/gsm8k/reward/best@4/mean", 4, None, True),
    ("val-aux/openai/gsm8k/reward/worst@2/std", 4, None, True),
    ("val-core/openai/gsm8k/reward/best@8/mean", 4, None, False),
    ("val-core/lighteval/MATH/reward/mean@1", 1, ("openai/gsm8k",), False),  # not a source of the data
    ("val-aux/num_turns/mean", 1, None, True),
    ("critic/score/mean", 1, None, True),
    ("actor/entropy", 1, None, True),
    ("timing_s/gen", 1, None, True),
    ("eval/reward_mean", 1, None, False),  # verl_core's name: verl never logs it
    ("eval/reward_std", None, None, False),
    ("val-core/openai/gsm8k/reward/mean1", None, None, False),
    ("val/test_score/openai/gsm8k", None, None, False),  # verl's pre-0.3 name
    ("critic/", None, None, False),
])
def test_verl_metric_ok(metric: str, val_n: int | None, sources: tuple[str, ...] | None, ok: bool) -> None:
    assert verl_metric_ok(metric, val_n, sources) is ok


def test_the_core_variable_decides_what_is_core_and_what_is_aux() -> None:
    """verl 0.9.1 records a float score as ``acc`` too and makes ``acc`` the core variable; only a reward function
    returning a dict without ``acc`` leaves ``reward`` in val-core."""
    reward = "val-core/openai/gsm8k/reward/mean@1"
    assert verl_metric_ok(VAL, 1, None, "acc") and not verl_metric_ok(reward, 1, None, "acc")
    assert verl_metric_ok(reward, 1, None, "reward") and not verl_metric_ok(VAL, 1, None, "reward")
    assert not verl_metric_ok("val-aux/openai/gsm8k/acc/mean@1", 1, None, "acc")  # the core mean is val-core
    assert verl_metric_ok("val-aux/openai/gsm8k/reward/mean@1", 1, None, "acc")
    assert val_core_metric() == VAL and val_core_metric("mine", 4, "reward") == "val-core/mine/reward/mean@4"
    assert verl_metric_examples(1, ("ds",), "reward")[0] == "val-core/ds/reward/mean@1"
    assert verl_metric_examples(1, ("ds",), "acc")[0] == "val-core/ds/acc/mean@1"
