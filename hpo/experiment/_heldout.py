"""What a search must never see and what confirmation compares against: the held-out test split's metric names, the
checks that keep it out of a search, and ``study.baseline`` (the setting a user would have run anyway).

The test split (verl_core's ``data.test_files``; the built-in tasks ship one, ``builtin:arith`` -> 225 problems
disjoint from the 225 validation and the 450 training ones) is evaluated only by ``verl-hpo confirm``'s runs, once at
their last step, and logged as ``test/*`` (``eval/reward_mean`` -> ``test/reward_mean``; ``val-core/...`` ->
``test-core/...``). A search trial never gets ``data.test_files``, and an experiment may neither set it as a fixed
override or parameter nor score trials by a ``test/*`` metric: :func:`check_no_test_split`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

TEST_KEY = "data.test_files"  # verl_core's key of the held-out split (confirmation runs only)
TEST_PREFIXES = {"eval/": "test/", "val-core/": "test-core/", "val-aux/": "test-aux/"}  # verl_core.validation's


def heldout_metric(metric: str) -> str:
    """The name ``metric`` (a validation metric) has on the test split; mirrors
    ``verl_core.validation.heldout_metric_name``."""
    for old, new in TEST_PREFIXES.items():
        if metric.startswith(old):
            return new + metric[len(old):]
    return "test/" + metric


def is_heldout_metric(metric: str) -> bool:
    return metric.startswith(tuple(TEST_PREFIXES.values()))


Error = Callable[[str, str], Exception]


def check_no_test_split(overrides: Mapping[str, Any], param_keys: Mapping[str, str], metrics: Sequence[str],
                        error: Error) -> None:
    """Refuse an experiment whose search would see the held-out split: ``data.test_files`` fixed or tuned, or an
    objective metric measured on it (``param_keys``: trainer key -> parameter name)."""
    for key in overrides:
        if key.lstrip("+") == TEST_KEY:
            raise error(f"overrides.{key}", "the held-out test split is for verl-hpo confirm only (a search never "
                        "sees it); set study.confirm.test_files instead")
    for key, name in param_keys.items():
        if key.lstrip("+") == TEST_KEY:
            raise error(f"params.{name}.key", f"{TEST_KEY} cannot be tuned: the test split is for verl-hpo confirm "
                        "only")
    for m in metrics:
        if is_heldout_metric(m):
            raise error("objective.metric", f"{m!r} is measured on the held-out test split, which a search never "
                        "sees; score trials by a validation metric (confirm reports the test value)")


def parse_baseline(raw: Any, error: Error) -> dict[str, Any]:
    """``study.baseline``: ``{dotted trainer key: value}``, the overrides of the setting a user would run without
    a search (on top of the experiment's fixed overrides; a tuned key it does not name keeps the config's value).
    Values stay YAML scalars (or lists) so each backend writes them in its own syntax."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not raw:
        raise error("study.baseline", f"expected a non-empty mapping of dotted trainer keys to values, got {raw!r}")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not key or any(c.isspace() or c == "=" for c in key):
            raise error("study.baseline", f"key {key!r} is not a dotted trainer key")
        if isinstance(value, dict):
            raise error(f"study.baseline.{key}", f"expected a value, got a mapping {value!r}")
        if key.lstrip("+") == TEST_KEY:
            raise error(f"study.baseline.{key}", "the test split is set by verl-hpo confirm (study.confirm.test_files)")
        out[key] = value
    return out
