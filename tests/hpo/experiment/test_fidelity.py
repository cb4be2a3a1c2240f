"""``study.fidelity`` as the experiment file gives it (:mod:`hpo.experiment._fidelity`): the proxy's overrides (never a
tuned key, never a secret), its promotion counts, the transfer rules (float parameters only), and the rules a proxy
search needs of the rest of the study. What needs the trainer is the backends' check."""

from __future__ import annotations

from typing import Any

import pytest

from hpo.experiment._errors import SpaceError
from hpo.experiment._fidelity import FidelitySpec, ProxySpec, TransferRule, check_fidelity, parse_fidelity
from hpo.experiment._schema import Param

PARAMS = (Param("lr", "optim.lr", "float", low=1e-6, high=1e-3, log=True),
          Param("bs", "data.batch", "int", low=8, high=32))


def _error(where: str, msg: str) -> SpaceError:
    return SpaceError(f"{where}: {msg}")


def _parse(raw: Any) -> FidelitySpec:
    return parse_fidelity(raw, PARAMS, _error)


def test_no_section_or_no_proxy_is_no_proxy() -> None:
    assert _parse(None) == FidelitySpec() == _parse({"proxy": None})


def test_a_proxy_with_its_defaults_and_its_transfer_rules() -> None:
    spec = _parse({"proxy": {"overrides": {"model.path": "/m/small", "+model.hidden": 64}}})
    assert spec.proxy == ProxySpec(overrides={"model.path": "/m/small", "+model.hidden": 64}, promote=4,
                                   promote_steps=None, transfer={})
    spec = _parse({"proxy": {"overrides": {"model.path": "/m"}, "promote": 2, "promote_steps": 5,
                             "transfer": {"lr": {"multiply": 0.5}}}})
    assert spec.proxy is not None and spec.proxy.transfer == {"lr": TransferRule(multiply=0.5)}
    assert (spec.proxy.promote, spec.proxy.promote_steps, spec.proxy.confirm_top) == (2, 5, 1)
    top = _parse({"proxy": {"overrides": {"m": 1}, "promote": 3, "confirm_top": 3}}).proxy
    assert top is not None and top.confirm_top == 3
    assert spec.proxy.tie_seeds == 1  # the proxy's tied best settings run once more on the proxy by default
    ties = _parse({"proxy": {"overrides": {"m": 1}, "tie_seeds": 0}}).proxy
    assert ties is not None and ties.tie_seeds == 0
    rule = _parse({"proxy": {"overrides": {"m": 1}, "transfer": {"lr": {"scale_by": "hidden_ratio"}}}}).proxy
    assert rule is not None and rule.transfer["lr"].text() == "scale_by hidden_ratio"
    assert TransferRule(multiply=0.25).text() == "multiply 0.25"


@pytest.mark.parametrize(("proxy", "line"), [
    ("small", "study.fidelity.proxy: expected a mapping with overrides"),
    ({}, "study.fidelity.proxy.overrides: expected a non-empty mapping of trainer keys"),
    ({"overrides": {"m": 1}, "promot": 2}, "study.fidelity.proxy.promot: unknown field; known: overrides, promote,"),
    ({"overrides": {"optim.lr": 1e-4}}, "study.fidelity.proxy.overrides.optim.lr: 'optim.lr' is tuned by param"),
    ({"overrides": {"+data.batch": 8}}, "study.fidelity.proxy.overrides.+data.batch: 'data.batch' is tuned by"),
    ({"overrides": {"hub_token": "hf_x"}}, "study.fidelity.proxy.overrides.hub_token: names a secret"),
    ({"overrides": {"a b": 1}}, "study.fidelity.proxy.overrides: key 'a b' is not a dotted trainer key"),
    ({"overrides": {"model": {"path": "x"}}}, "study.fidelity.proxy.overrides.model: expected a value, got a mapping"),
    ({"overrides": {"m": 1}, "promote": 1}, "study.fidelity.proxy.promote: expected an integer >= 2, got 1"),
    ({"overrides": {"m": 1}, "promote": True}, "study.fidelity.proxy.promote: expected an integer >= 2, got True"),
    ({"overrides": {"m": 1}, "promote_steps": 0}, "study.fidelity.proxy.promote_steps: expected an integer >= 1"),
    ({"overrides": {"m": 1}, "confirm_top": 0}, "study.fidelity.proxy.confirm_top: expected an integer >= 1, got 0"),
    ({"overrides": {"m": 1}, "confirm_top": "2"}, "study.fidelity.proxy.confirm_top: expected an integer >= 1"),
    ({"overrides": {"m": 1}, "tie_seeds": -1}, "study.fidelity.proxy.tie_seeds: expected an integer >= 0, got -1"),
    ({"overrides": {"m": 1}, "tie_seeds": 1.5}, "study.fidelity.proxy.tie_seeds: expected an integer >= 0, got 1.5"),
    ({"overrides": {"m": 1}, "promote": 2, "confirm_top": 3}, "study.fidelity.proxy.confirm_top: 3 is more than "
                                                              "promote=2 (the race's field is taken from the promoted"),
    ({"overrides": {"m": 1}, "transfer": {"wd": {"multiply": 2}}}, "study.fidelity.proxy.transfer.wd: not a "
                                                                   "parameter (known: bs, lr)"),
    ({"overrides": {"m": 1}, "transfer": {"bs": {"multiply": 2}}}, "study.fidelity.proxy.transfer.bs: parameter "
                                                                   "'bs' is int: a transfer rule scales a float"),
    ({"overrides": {"m": 1}, "transfer": {"lr": {"multiply": 0}}}, "study.fidelity.proxy.transfer.lr.multiply: "
                                                                   "expected a finite number > 0, got 0"),
    ({"overrides": {"m": 1}, "transfer": {"lr": {"scale_by": "depth"}}}, "study.fidelity.proxy.transfer.lr.scale_by: "
                                                                         "'depth' is not one of hidden_ratio"),
    ({"overrides": {"m": 1}, "transfer": {"lr": {"multiply": 2, "scale_by": "hidden_ratio"}}},
     "study.fidelity.proxy.transfer.lr: expected {multiply: <factor>} or {scale_by: hidden_ratio}"),
])
def test_each_bad_proxy_is_one_line_naming_its_field(proxy: Any, line: str) -> None:
    with pytest.raises(SpaceError) as err:
        _parse({"proxy": proxy})
    assert str(err.value).startswith(line), str(err.value)


def test_a_section_that_is_not_a_mapping_or_names_another_kind_is_refused() -> None:
    with pytest.raises(SpaceError, match=r"^study.fidelity: expected a mapping like \{proxy"):
        _parse(["proxy"])
    with pytest.raises(SpaceError, match=r"^study.fidelity.steps: unknown field; known: proxy$"):
        _parse({"steps": 10})


def test_what_a_proxy_search_needs_of_the_rest_of_the_study() -> None:
    spec = _parse({"proxy": {"overrides": {"m": 1}, "promote": 3}})
    check_fidelity(spec, "optuna", "learning", False, "successive_halving", 3, _error)
    check_fidelity(FidelitySpec(), "pbt", "throughput", True, "hyperband", 1, _error)  # no proxy: no rule
    for args, said in ((("pbt", "learning", False, "median", 8), "not supported with study.strategy pbt"),
                       (("optuna", "throughput", False, "none", 8), "not supported with a throughput study"),
                       (("optuna", "learning", True, "median", 8), "not supported with objective mode pareto"),
                       (("optuna", "learning", False, "hyperband", 8), "not supported with pruner type hyperband"),
                       (("optuna", "learning", False, "median", 2), "3 is more than study.n_trials=2")):
        with pytest.raises(SpaceError) as err:
            check_fidelity(spec, *args, _error)  # type: ignore[arg-type]
        assert said in str(err.value) and str(err.value).startswith("study.fidelity.proxy")
