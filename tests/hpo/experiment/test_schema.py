"""The experiment's typed schema (:mod:`hpo.experiment._schema`): a parameter's Optuna distribution and the corner
values checked against the trainer, a space's overrides as a trial's argv holds them (secrets as references, a proxy
run's transfer scale applied to floats only), and values written as the right-hand side of a dotted override."""

from __future__ import annotations

import math

import optuna
import yaml

from hpo.experiment._schema import Param, Space, format_value


def test_format_value_round_trips_through_yaml() -> None:
    for v in (1e-06, 0.05, 3, True, False, None, "kl", [1, 2]):
        assert yaml.safe_load(format_value(v)) == v or (isinstance(v, float) and math.isclose(
            float(format_value(v)), v))


def test_format_value_writes_yaml_scalars_not_python_reprs() -> None:
    assert [format_value(v) for v in (True, None, 0.1, 7, "x", (1, "a", None), [])] == [
        "true", "null", "0.1", "7", "x", "[1,a,null]", "[]"]


def test_each_parameter_type_is_optuna_s_distribution() -> None:
    assert Param("lr", "a", "float", low=1e-6, high=1e-3, log=True).distribution() == \
        optuna.distributions.FloatDistribution(1e-6, 1e-3, log=True)
    assert Param("w", "a", "float", low=0.0, high=1.0, step=0.25).distribution() == \
        optuna.distributions.FloatDistribution(0.0, 1.0, step=0.25)
    assert Param("bs", "a", "int", low=32.0, high=128.0, step=32.0).distribution() == \
        optuna.distributions.IntDistribution(32, 128, step=32)
    assert Param("p", "a", "categorical", choices=("kl", None)).distribution() == \
        optuna.distributions.CategoricalDistribution(["kl", None])


def test_corner_values_are_the_reachable_ends_or_every_choice() -> None:
    assert Param("x", "a", "float", low=0.1, high=0.9).corner_values() == [0.1, 0.9]
    assert Param("n", "a", "int", low=1, high=10, step=4).corner_values() == [1, 9]  # 10 is off the grid
    assert Param("n", "a", "int", low=5, high=5).corner_values() == [5]
    assert Param("c", "a", "categorical", choices=(1, 2, 3)).corner_values() == [1, 2, 3]


def _space(**kw: object) -> Space:
    params = (Param("lr", "optim.lr", "float", low=1e-6, high=1e-3), Param("bs", "data.bs", "int", low=8, high=32),
              Param("on", "algo.on", "categorical", choices=(True, False)))
    return Space(name="s", source="s.yaml", config="tiny", overrides={"trainer.steps": 5, "hub_token": "hf_x",
                                                                       "api_key": "${oc.env:MY_KEY}"},
                 params=params, **kw)  # type: ignore[arg-type]


def test_a_trial_s_overrides_hold_secrets_as_references_then_the_tuned_values() -> None:
    space = _space()
    assert space.fixed_overrides() == {"trainer.steps": 5, "hub_token": "${oc.env:VERL_HPO_SECRET_HUB_TOKEN}",
                                       "api_key": "${oc.env:MY_KEY}"}  # a reference already: passed as it is
    assert space.trainer_overrides({"lr": 1e-4, "on": False}) == [
        "trainer.steps=5", "hub_token=${oc.env:VERL_HPO_SECRET_HUB_TOKEN}", "api_key=${oc.env:MY_KEY}",
        "optim.lr=0.0001", "algo.on=false"]
    assert space.param("bs").key == "data.bs"
    assert space.overrides["hub_token"] == "hf_x"  # the value itself stays in the space, for the trial's env


def test_a_proxy_run_s_scale_applies_to_its_float_values_only() -> None:
    space = _space(scale={"lr": 0.5, "on": 2.0})
    assert space.scaled(space.param("lr"), 1e-4) == 5e-5
    assert space.scaled(space.param("on"), True) is True  # a bool is no number to scale
    assert space.scaled(space.param("bs"), 16) == 16  # no rule for it
    assert "optim.lr=5e-05" in space.trainer_overrides({"lr": 1e-4})
    assert _space() == _space(scale={"lr": 0.5})  # the scale is no part of the experiment's identity
