"""A section built into its schema dataclass field by field (:mod:`hpo.experiment._fields`): unknown keys refused with
the known ones listed, each value checked against its type hint, its choices, its sign and its maximum, nested
sections built the same way; every problem one line naming the dotted field and the value."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from hpo.experiment._errors import ErrorContext, SpaceError
from hpo.experiment._fields import build_section
from hpo.experiment._schema import MAX_N_JOBS, EarlyStopping, SamplerSpec, TrialSpec

CTX = ErrorContext("exp.yaml", {})


@dataclass(frozen=True)
class Inner:
    rate: float = 1.0


@dataclass(frozen=True)
class Section:
    name: str = "a"
    count: int = 1
    seed: int = 0  # one of the fields that may be 0
    tags: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    limit: float | None = None
    mode: str = field(default="x", metadata={"choices": ("x", "y")})
    inner: Inner = field(default_factory=Inner)


def _build(raw: Any) -> Any:
    return build_section(Section, raw, "sec", CTX)


def test_values_are_built_into_the_dataclass_and_missing_ones_keep_their_default() -> None:
    built = _build({"count": 3, "tags": ["a", 2], "env": {"K": 1.5, "B": True}, "limit": 2, "mode": "y",
                    "inner": {"rate": 4}})
    assert built == Section(count=3, tags=("a", "2"), env={"K": "1.5", "B": "true"}, limit=2.0, mode="y",
                            inner=Inner(4.0))
    assert isinstance(built.limit, float) and isinstance(built.inner.rate, float)
    assert _build(None) == Section() and _build({"limit": None}) == Section()


@pytest.mark.parametrize(("raw", "line"), [
    ({"cnt": 3}, "exp.yaml: sec.cnt: unknown field (value 3); known: name, count, seed, tags, env, limit, mode, inner"),
    ({"count": "3"}, "exp.yaml: sec.count: expected an integer, got '3'"),
    ({"count": True}, "exp.yaml: sec.count: expected an integer, got True"),
    ({"count": 1.0}, "exp.yaml: sec.count: expected an integer, got 1.0"),
    ({"count": 0}, "exp.yaml: sec.count: must be positive, got 0"),
    ({"seed": -1}, "exp.yaml: sec.seed: must be >= 0, got -1"),
    ({"limit": math.inf}, "exp.yaml: sec.limit: expected a finite number, got inf"),
    ({"limit": "x"}, "exp.yaml: sec.limit: expected a number, got 'x'"),
    ({"name": 5}, "exp.yaml: sec.name: expected a string, got 5"),
    ({"tags": []}, "exp.yaml: sec.tags: expected a non-empty list of strings, got []"),
    ({"tags": [{"a": 1}]}, "exp.yaml: sec.tags: expected a non-empty list of strings, got [{'a': 1}]"),
    ({"env": ["K=1"]}, "exp.yaml: sec.env: expected a mapping, got ['K=1']"),
    ({"mode": "z"}, "exp.yaml: sec.mode: 'z' is not one of x, y"),
    ({"inner": {"rate": -2}}, "exp.yaml: sec.inner.rate: must be positive, got -2.0"),
    ({"inner": 3}, "exp.yaml: sec.inner: expected a mapping, got 3"),
    ([1], "exp.yaml: sec: expected a mapping, got [1]"),
])
def test_each_bad_value_is_one_line_naming_the_field_and_the_value(raw: Any, line: str) -> None:
    with pytest.raises(SpaceError) as err:
        _build(raw)
    assert str(err.value) == line


def test_the_schema_s_own_sections_their_zero_fields_and_their_maximum() -> None:
    assert build_section(EarlyStopping, {"min_value": -1.5, "threshold": 0}, "early_stopping", CTX) == EarlyStopping(
        min_value=-1.5, threshold=0.0)  # a floor may be negative; a threshold of 0 turns the rule off
    assert build_section(SamplerSpec, {"seed": None}, "study.sampler", CTX).seed is None
    with pytest.raises(SpaceError, match=r"^exp.yaml: study.sampler.type: 'cmaes' is not one of tpe, gp, random$"):
        build_section(SamplerSpec, {"type": "cmaes"}, "study.sampler", CTX)
    assert build_section(TrialSpec, {"n_jobs": MAX_N_JOBS}, "trial", CTX).n_jobs == MAX_N_JOBS
    with pytest.raises(SpaceError, match=rf"^exp.yaml: trial.n_jobs: at most {MAX_N_JOBS}, got {MAX_N_JOBS + 1}$"):
        build_section(TrialSpec, {"n_jobs": MAX_N_JOBS + 1}, "trial", CTX)


def test_an_override_that_set_the_field_is_named_instead_of_the_file() -> None:
    ctx = ErrorContext("exp.yaml", {"sec.count": "sec.count=0"})
    with pytest.raises(SpaceError, match=r"^--override 'sec.count=0': sec.count: must be positive, got 0$"):
        build_section(Section, {"count": 0}, "sec", ctx)
