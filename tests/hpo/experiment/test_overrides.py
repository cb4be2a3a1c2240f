"""``--override key=value`` (:mod:`hpo.experiment._overrides`): a field of the file, a fixed trainer override, or one
trainer key under ``study.fidelity.proxy.overrides.``; the value read as hardened YAML (text that is not YAML stays
text); which field each text set returned, so an error names the override."""

from __future__ import annotations

from typing import Any

import pytest

from hpo.experiment._errors import SpaceError
from hpo.experiment._overrides import apply_overrides


def test_fields_of_the_file_and_trainer_keys_each_go_to_their_place() -> None:
    raw: dict[str, Any] = {"config": "c", "params": {"x": {"key": "a.b", "type": "float", "low": 0, "high": 1}}}
    origin = apply_overrides(raw, ["study.n_trials=4", "params.x.high=0.5", "trainer.test_freq=2",
                                   "overrides.data.path=/d", "name=with spaces"])
    assert raw["study"] == {"n_trials": 4} and raw["params"]["x"]["high"] == 0.5
    assert raw["overrides"] == {"trainer.test_freq": 2, "data.path": "/d", "name": "with spaces"}
    assert origin == {"study.n_trials": "study.n_trials=4", "params.x.high": "params.x.high=0.5",
                      "overrides.trainer.test_freq": "trainer.test_freq=2", "overrides.data.path":
                      "overrides.data.path=/d", "overrides.name": "name=with spaces"}


def test_past_the_proxy_s_overrides_the_rest_is_one_trainer_key() -> None:
    raw: dict[str, Any] = {"study": {"fidelity": {"proxy": {"overrides": {"m": "small"}}}}}
    apply_overrides(raw, ["study.fidelity.proxy.overrides.actor_rollout_ref.model.path=/models/tiny"])
    assert raw["study"]["fidelity"]["proxy"]["overrides"] == {"m": "small",
                                                              "actor_rollout_ref.model.path": "/models/tiny"}


def test_past_the_baseline_the_rest_is_one_trainer_key() -> None:
    """study.baseline maps dotted trainer keys to values: an override of one of them must not nest it."""
    raw: dict[str, Any] = {"study": {"baseline": {"algorithm.kl_ctrl.kl_coef": 0.001}}}
    origin = apply_overrides(raw, ["study.baseline.actor_rollout_ref.actor.optim.lr=1e-6"])
    assert raw["study"]["baseline"] == {"algorithm.kl_ctrl.kl_coef": 0.001, "actor_rollout_ref.actor.optim.lr": 1e-6}
    assert origin == {"study.baseline.actor_rollout_ref.actor.optim.lr":
                      "study.baseline.actor_rollout_ref.actor.optim.lr=1e-6"}
    apply_overrides(raw, ["study.baseline=null"])  # the field itself is still a field
    assert raw["study"]["baseline"] is None


def test_values_are_yaml_and_text_that_is_not_yaml_stays_text() -> None:
    raw: dict[str, Any] = {"overrides": None}
    apply_overrides(raw, ["a=[1, 2]", "b=true", "c=", "d=: not yaml [", "e=1.0e-3", "f=null"])
    assert raw["overrides"] == {"a": [1, 2], "b": True, "c": "", "d": ": not yaml [", "e": 0.001, "f": None}


@pytest.mark.parametrize(("text", "said"), [
    ("study.n_trials", "--override 'study.n_trials': expected key=value"),
    ("=3", "--override '=3': expected key=value"),
    ("a={x: 1, x: 2}", "--override 'a={x: 1, x: 2}': line 1: invalid YAML (duplicate key 'x')"),
    ("a=&x [*x]", "--override 'a=&x [*x]': line 1: invalid YAML (alias *x inside the value of &x (a cycle))"),
])
def test_a_bad_override_is_one_line_naming_it(text: str, said: str) -> None:
    with pytest.raises(SpaceError) as err:
        apply_overrides({}, [text])
    assert str(err.value) == said


def test_overrides_that_are_not_a_mapping_are_left_for_the_parser_to_refuse() -> None:
    raw: dict[str, Any] = {"overrides": ["a=1"]}
    assert apply_overrides(raw, ["b=2"]) == {"overrides.b": "b=2"}
    assert raw["overrides"] == ["a=1"]  # parse_space then says "overrides: expected a mapping"
