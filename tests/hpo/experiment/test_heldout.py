"""The held-out test split kept out of a search (:mod:`hpo.experiment._heldout`): a validation metric's name on the
test split, an experiment that would fix, tune or score by the split refused (by the trainer's own keys and
prefixes, passed in), and ``study.baseline`` read as dotted trainer keys to values."""

from __future__ import annotations

from typing import Any

import pytest

from hpo.experiment._errors import SpaceError
from hpo.experiment._heldout import check_no_test_split, heldout_metric, is_heldout_metric, parse_baseline

PREFIXES = {"eval/": "test/", "val-core/": "test-core/"}  # a trainer's validation -> test names
KEYS = ("data.test_files",)


def _error(where: str, msg: str) -> SpaceError:
    return SpaceError(f"{where}: {msg}")


def _refusal(**kw: Any) -> str | None:
    args: dict[str, Any] = {"overrides": {}, "param_keys": {}, "metrics": ["eval/reward_mean"], "baseline": None}
    args.update(kw)
    try:
        check_no_test_split(args["overrides"], args["param_keys"], args["metrics"], _error, KEYS, PREFIXES,
                            args["baseline"])
    except SpaceError as err:
        return str(err)
    return None


def test_a_validation_metric_s_name_on_the_test_split() -> None:
    assert heldout_metric("eval/reward_mean", PREFIXES) == "test/reward_mean"
    assert heldout_metric("val-core/gsm8k/acc", PREFIXES) == "test-core/gsm8k/acc"
    assert heldout_metric("train/loss", PREFIXES) is None
    assert heldout_metric("score", {"": "test/"}) == "test/score"  # the empty prefix: any other metric
    assert is_heldout_metric("test/reward_mean", PREFIXES) and not is_heldout_metric("eval/reward_mean", PREFIXES)
    assert not is_heldout_metric("test/x", {"eval/": ""})  # a trainer with no test names: nothing is held out


def test_a_search_that_would_see_the_test_split_is_refused_where_it_would() -> None:
    assert _refusal() is None
    assert _refusal(overrides={"+data.test_files": "t.parquet"}).startswith("overrides.+data.test_files: the held-out "
                                                                               "test split is for verl-hpo confirm")
    assert _refusal(param_keys={"data.test_files": "split"}) == (
        "params.split.key: data.test_files cannot be tuned: the test split is for verl-hpo confirm only")
    assert _refusal(metrics=["eval/reward_mean", "test/reward_mean"]).startswith(
        "objective.metric: 'test/reward_mean' is measured on the held-out test split")
    assert _refusal(baseline={"data.test_files": "x"}).startswith("study.baseline.data.test_files: the test split")
    assert _refusal(overrides={"data.train_files": "x"}, param_keys={"algo.lr": "lr"}, baseline={"algo.lr": 1}) is None


def test_the_baseline_is_dotted_trainer_keys_to_values() -> None:
    assert parse_baseline(None, _error) == {}
    assert parse_baseline({"algo.lr": 1e-5, "algo.sched": [1, 2], "x": None}, _error) == {
        "algo.lr": 1e-5, "algo.sched": [1, 2], "x": None}
    for raw, said in (({}, "study.baseline: expected a non-empty mapping"), ([1], "study.baseline: expected"),
                      ({"a b": 1}, "study.baseline: key 'a b' is not a dotted trainer key"),
                      ({"a=b": 1}, "study.baseline: key 'a=b' is not"), ({1: 1}, "study.baseline: key 1 is not"),
                      ({"algo": {"lr": 1}}, "study.baseline.algo: expected a value, got a mapping")):
        with pytest.raises(SpaceError) as err:
            parse_baseline(raw, _error)
        assert str(err.value).startswith(said), (raw, str(err.value))
