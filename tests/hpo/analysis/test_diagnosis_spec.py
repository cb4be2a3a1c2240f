"""The ``diagnosis:`` section as a typed spec (:mod:`hpo.analysis._diagnosis_spec`): a flat section of scalars with
help, each label's stop switch, and every threshold checked, each problem naming its field and value (a spec with
one is refused by the diagnoser). The rules themselves: ``test_diagnosis.py``. Moved here from there."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import pytest

from hpo.analysis._diagnosis import LABELS, Diagnoser
from hpo.analysis._diagnosis_spec import DiagnosisSpec
from hpo.backends.verl_core._names import METRICS

OBJ = "eval/reward_mean"


def test_spec_is_a_flat_section_of_scalars_with_help() -> None:
    hints = typing.get_type_hints(DiagnosisSpec)
    for f in dataclasses.fields(DiagnosisSpec):
        assert hints[f.name] in (bool, int, float), f.name
        assert f.metadata["help"] and f.metadata["choices"] is None
        if f.name.startswith("stop_on_"):
            assert f.name.removeprefix("stop_on_") in LABELS
    assert {lb for lb in LABELS if DiagnosisSpec().stops(lb)} == {"nan", "kl_blowup", "entropy_collapse"}
    assert DiagnosisSpec().validate() == []


@pytest.mark.parametrize(("changes", "problem"), [
    ({"entropy_fraction": 1.0}, ("entropy_fraction", "must be in (0, 1), got 1.0")),
    ({"entropy_fraction": 0.0}, ("entropy_fraction", "must be in (0, 1), got 0.0")),
    ({"kl_factor": 1.0}, ("kl_factor", "must be > 1, got 1.0")),
    ({"kl_floor": 0.0}, ("kl_floor", "must be > 0, got 0.0")),
    ({"clip_ratio_threshold": 1.5}, ("clip_ratio_threshold", "must be in (0, 1], got 1.5")),
    ({"hacking_min_drop": -0.1}, ("hacking_min_drop", "must be >= 0, got -0.1")),
    ({"kl_patience": 0}, ("kl_patience", "must be >= 1, got 0")),
    ({"kl_factor": float("inf")}, ("kl_factor", "must be finite, got inf")),
])
def test_validate_names_the_field_and_value(changes: dict[str, Any], problem: tuple[str, str]) -> None:
    spec = DiagnosisSpec(**changes)
    assert spec.validate() == [problem]
    with pytest.raises(ValueError, match=problem[0]):
        Diagnoser(spec, OBJ, True, METRICS)


def test_health_thresholds_are_validated() -> None:
    bad = dict(DiagnosisSpec(gen_fraction=1.5, util_low=99.0).validate())
    assert "gen_fraction" in bad and "util_high" in bad


def test_every_problem_is_said_and_a_field_is_said_once() -> None:
    problems = DiagnosisSpec(kl_factor=float("nan"), kl_patience=0, sync_fraction=0.0).validate()
    assert problems == [("kl_factor", "must be finite, got nan"), ("kl_patience", "must be >= 1, got 0"),
                        ("sync_fraction", "must be in (0, 1], got 0.0")]
    assert DiagnosisSpec(stop_on_length_clipping=True).stops("length_clipping")
    assert not DiagnosisSpec().stops("no_such_label")
