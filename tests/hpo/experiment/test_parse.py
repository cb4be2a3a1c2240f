"""An experiment's raw mapping validated into a :class:`Space` (:mod:`hpo.experiment._parse`), with no trainer in the
way: the top-level fields and fixed overrides, each tuned parameter's distribution by Optuna's rules, the rules
between fields of ``study``, PBT's rules and its rollback rule. Every problem is one line naming the file (or the
``--override``), the field and the value."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from hpo.experiment._errors import SpaceError
from hpo.experiment._parse import parse_rollback_rule, parse_space
from hpo.experiment._schema import Param

BASE: dict[str, Any] = {
    "config": "tiny",
    "overrides": {"trainer.steps": 10, "hub_token": "hf_secret"},
    "params": {"lr": {"key": "optim.lr", "type": "float", "low": 1e-6, "high": 1e-3, "log": True},
               "bs": {"key": "data.bs", "type": "int", "low": 8, "high": 32, "step": 8},
               "pen": {"key": "algo.penalty", "type": "categorical", "choices": ["kl", None, 2]}},
}


def _raw(**changes: Any) -> dict[str, Any]:
    """BASE with ``a__b=v`` set (``v`` None: the field removed)."""
    raw = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        node = raw
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return raw


def _line(raw: dict[str, Any], origin: dict[str, str] | None = None) -> str:
    with pytest.raises(SpaceError) as err:
        parse_space(raw, "exp.yaml", "exp", origin)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_valid_mapping_is_a_space_with_every_default_filled_in() -> None:
    raw = _raw()
    space = parse_space(raw, "exp.yaml", "exp")
    assert (space.name, space.source, space.config, space.raw) == ("exp", "exp.yaml", "tiny", raw)
    assert space.params == (Param("lr", "optim.lr", "float", low=1e-6, high=1e-3, log=True),
                            Param("bs", "data.bs", "int", low=8, high=32, step=8),
                            Param("pen", "algo.penalty", "categorical", choices=("kl", None, 2)))
    assert space.overrides == {"trainer.steps": 10, "hub_token": "hf_secret"}
    assert space.study.n_trials == 10 and space.study.strategy == "optuna" and space.trial.executor == "local"
    assert space.objective.mode == "single" and space.objective.direction == "maximize"
    assert space.early_stopping.enabled and space.tracking.mlflow is None and space.study.baseline == {}


@pytest.mark.parametrize(("changes", "line"), [
    ({"paramz": 1}, "exp.yaml: paramz: unknown field (value 1); known: config, overrides, params, objective,"),
    ({"api_token": "x"}, "exp.yaml: api_token: unknown field (value <a secret, not shown>)"),
    ({"config": None}, "exp.yaml: config: expected a trainer config name or path, got None"),
    ({"overrides": [1]}, "exp.yaml: overrides: expected a mapping of dotted trainer keys to values, got [1]"),
    ({"overrides__trainer": {"steps": 1}}, "exp.yaml: overrides.trainer: expected a value, got a mapping"),
    ({"overrides__hub_token": ["a", "b"]}, "exp.yaml: overrides.hub_token: 'hub_token' names a secret: it takes one "
                                            "value (a string), got a list (its content is not shown)"),
    ({"params": {}}, "exp.yaml: params: expected a non-empty mapping of parameters, got {}"),
    ({"params__tok": {"key": "hf.token", "type": "categorical", "choices": ["a"]}},
     "exp.yaml: params.tok.key: 'hf.token' names a secret"),
    ({"params__lr2": {"key": "optim.lr", "type": "float", "low": 0.1, "high": 1.0}},
     "exp.yaml: params.lr2.key: 'optim.lr' is already tuned by parameter 'lr'"),
    ({"overrides__optim.lr": 1e-4}, "exp.yaml: params.lr.key: 'optim.lr' is also a fixed override (0.0001)"),
    ({"trial__devices": []}, "exp.yaml: trial.devices: expected a non-empty list of strings, got []"),
])
def test_top_level_fields_and_fixed_overrides(changes: dict[str, Any], line: str) -> None:
    assert _line(_raw(**changes)).startswith(line)


@pytest.mark.parametrize(("param", "line"), [
    ("notamapping", "params.p: expected a mapping like {key: ..., type: float, low: ..., high: ...}"),
    ({"key": "a", "type": "float", "low": 0, "high": 1, "lo": 1}, "params.p.lo: unknown field (value 1); known: key,"),
    ({"type": "float", "low": 0, "high": 1}, "params.p.key: expected a dotted trainer key, got None"),
    ({"key": "a", "type": "double", "low": 0, "high": 1}, "params.p.type: 'double' is not one of float, int,"),
    ({"key": "a", "type": "float", "low": 0, "high": 1, "log": "yes"}, "params.p.log: expected true or false"),
    ({"key": "a", "type": "categorical", "choices": [1], "low": 0}, "params.p.low: not allowed with type categorical"),
    ({"key": "a", "type": "categorical", "choices": []}, "params.p.choices: expected a non-empty list, got []"),
    ({"key": "a", "type": "categorical", "choices": [[1]]}, "params.p.choices: choice [1] is not a scalar"),
    ({"key": "a", "type": "categorical", "choices": [1, 1]}, "params.p.choices: duplicate choices in [1, 1]"),
    ({"key": "a", "type": "float", "low": 0, "high": 1, "choices": [1]}, "params.p.choices: only for type categ"),
    ({"key": "a", "type": "float", "high": 1}, "params.p.low: required for type float"),
    ({"key": "a", "type": "int", "low": 1.5, "high": 4}, "params.p.low: expected an integer, got 1.5"),
    ({"key": "a", "type": "float", "low": True, "high": 4}, "params.p.low: expected a number, got True"),
    ({"key": "a", "type": "float", "low": 0, "high": float("nan")}, "params.p.high: expected a finite number, got nan"),
    ({"key": "a", "type": "float", "low": 2, "high": 1}, "params.p: low=2 is greater than high=1"),
    ({"key": "a", "type": "float", "low": 0, "high": 1, "log": True}, "params.p.low: log scale needs low > 0"),
    ({"key": "a", "type": "float", "low": 0.1, "high": 1, "log": True, "step": 0.1}, "params.p.step: log and step "
                                                                                    "are exclusive"),
    ({"key": "a", "type": "int", "low": 1, "high": 4, "step": 0}, "params.p.step: must be positive, got 0"),
])
def test_a_parameter_follows_optuna_s_distribution_rules(param: Any, line: str) -> None:
    assert _line(_raw(params={"p": param})).startswith(f"exp.yaml: {line}")


def test_a_parameter_name_is_a_readable_identifier() -> None:
    good = {"key": "a", "type": "int", "low": 1, "high": 2}
    assert parse_space(_raw(params={"lr.actor-1_x": good}), "exp.yaml", "exp").params[0].name == "lr.actor-1_x"
    assert _line(_raw(params={"1lr": good})) == "exp.yaml: params.1lr: parameter names start with a letter and use " \
                                                "letters, digits, _ . -"


@pytest.mark.parametrize(("changes", "line"), [
    ({"study": {"heartbeat_interval": 10, "grace_period": 19}}, "study.grace_period: 19 is under twice "
                                                                "study.heartbeat_interval=10"),
    ({"study": {"budget": 0.5}}, "study.budget: 0.5: must be at least 1 full-run equivalent"),
    ({"study": {"confirm": {"race": True, "seeds": 3, "min_seeds": 4}}}, "study.confirm.min_seeds: 4: a race needs "
                                                                         "2 <= min_seeds <= study.confirm.seeds=3"),
    ({"objective": {"metric": "eval/acc"}, "study": {"confirm": {"test_metric": "eval/acc"}}},
     "study.confirm.test_metric: 'eval/acc': must name the held-out metric, not the objective's"),
    ({"objective": {"mode": "pareto", "objectives": [{"metric": "a", "direction": "maximize"},
                                                     {"metric": "b", "direction": "minimize"}]},
      "study": {"pruner": {"type": "hyperband"}}}, "study.pruner.type: 'hyperband' is not supported with objective "
                                                    "mode pareto"),
    ({"objective": {"mode": "pareto", "objectives": [{"metric": "a", "direction": "maximize"},
                                                     {"metric": "b", "direction": "minimize"}]},
      "study": {"pruner": {"patience": 2}}}, "study.pruner.patience: not supported with objective mode pareto"),
])
def test_the_rules_between_fields_of_study(changes: dict[str, Any], line: str) -> None:
    assert _line(_raw(**changes)).startswith(f"exp.yaml: {line}")


@pytest.mark.parametrize(("pbt", "line"), [
    ({"population": 1}, "study.pbt.population: at least 2 members, got 1"),
    ({"quantile": 0.75}, "study.pbt.quantile: must be in (0, 0.5], got 0.75"),
    ({"resample_probability": 1.5}, "study.pbt.resample_probability: must be in [0, 1], got 1.5"),
    ({"perturb_down": 1.1}, "study.pbt: perturb_down=1.1 must be < 1 < perturb_up=1.25"),
    ({"explore": ["lr", "wd"]}, "study.pbt.explore: 'wd' is not a parameter (known: bs, lr, pen)"),
    ({"rollback": {"oom": "lr*0.5"}}, "study.pbt.rollback.oom: unknown collapse label (value 'lr*0.5'); known: nan,"),
    ({"rollback": {"nan": "lr/2"}}, "study.pbt.rollback.nan: expected 'name*factor ...' with positive factors"),
    ({"rollback": {"nan": "wd*0.5"}}, "study.pbt.rollback.nan: 'wd' is not a parameter (known: bs, lr, pen)"),
])
def test_pbt_s_rules(pbt: dict[str, Any], line: str) -> None:
    assert _line(_raw(study={"strategy": "pbt", "pbt": pbt})).startswith(f"exp.yaml: {line}")
    ok = parse_space(_raw(study={"strategy": "pbt", "pbt": {"explore": ["lr"], "rollback": {"nan": "lr*0.5"}}}),
                     "exp.yaml", "exp")
    assert ok.study.pbt.explore == ("lr",) and ok.study.pbt.rollback == {"nan": "lr*0.5"}


def test_a_rollback_rule_is_names_and_positive_factors() -> None:
    assert parse_rollback_rule("lr*0.5 kl*2") == [("lr", 0.5), ("kl", 2.0)]
    assert parse_rollback_rule("lr*0.5,kl*2") == [("lr", 0.5), ("kl", 2.0)]
    assert parse_rollback_rule("") == []
    for bad in ("lr", "lr*0", "lr*-1", "*2", "lr*inf", "lr*x"):
        with pytest.raises(ValueError):
            parse_rollback_rule(bad)


def test_a_field_an_override_set_is_blamed_on_the_override() -> None:
    raw = _raw(params__lr__high=1e-9)
    line = _line(raw, {"params.lr.high": "params.lr.high=1e-9"})
    assert line == "--override 'params.lr.high=1e-9': params.lr: low=1e-06 is greater than high=1e-09"


def test_study_baseline_s_secrets_are_held_as_references_from_the_start() -> None:
    space = parse_space(_raw(study={"baseline": {"hub_token": "hf_x", "optim.lr": 1e-4}}), "exp.yaml", "exp")
    assert space.study.baseline == {"hub_token": "${oc.env:VERL_HPO_SECRET_BASELINE_HUB_TOKEN}", "optim.lr": 1e-4}
