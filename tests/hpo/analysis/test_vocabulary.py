"""A trainer's metric vocabulary (:mod:`hpo.analysis._vocabulary`): the diagnosis reads a trainer's metrics under the
names its backend gives, never verl's unless told; a name the trainer does not log switches off the rule that needs
it and nothing else. (The rules themselves: ``test_diagnosis.py``.)"""

from __future__ import annotations

import dataclasses
import math

import pytest

from hpo.analysis import Diagnoser, DiagnosisSpec, MetricNames

TOY = MetricNames(objective="toy/quality", score="toy/train_score", entropy="toy/ent", kl=("toy/kl_a", "toy/kl_b"))


def test_the_finite_watch_is_the_named_entropy_kl_terms_and_score() -> None:
    assert TOY.finite == ("toy/ent", "toy/kl_a", "toy/kl_b", "toy/train_score")
    assert MetricNames().finite == () and MetricNames(kl=("k",)).finite == ("k",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        TOY.entropy = "other"  # type: ignore[misc]


def _diagnoser(names: MetricNames) -> Diagnoser:
    return Diagnoser(DiagnosisSpec(), "toy/quality", True, names, gpu=False)


def test_a_non_finite_value_under_the_trainer_s_own_name_is_nan() -> None:
    diag = _diagnoser(TOY)
    assert diag.update(1, {"toy/ent": 0.7, "toy/kl_b": 0.01}) is None
    assert diag.update(2, {"toy/kl_b": math.inf}) == "nan"
    assert diag.evidence()["nan"]["metric"] == "toy/kl_b"
    assert _diagnoser(TOY).update(2, {"actor/entropy": math.nan}) is None  # verl's name means nothing to this one


def test_an_unlogged_name_switches_its_rule_off_and_leaves_the_others() -> None:
    """Entropy falling to nothing collapses a trainer that names its entropy; a trainer that names none never gets
    the label from a metric that happens to share a name, while its non-finite objective is still ``nan``."""
    def falling(names: MetricNames) -> list[str | None]:
        diag = _diagnoser(names)
        return [diag.update(s, {"toy/ent": 0.8 if s < 5 else 0.001}) for s in range(30)]

    assert "entropy_collapse" in falling(TOY)
    silent = dataclasses.replace(TOY, entropy=None)
    assert set(falling(silent)) == {None}
    diag = _diagnoser(silent)
    assert diag.update(1, {"toy/quality": math.nan}) == "nan"
