"""What a search must never see and what confirmation compares against: the held-out test split's metric names, the
checks that keep it out of a search, and ``study.baseline`` (the setting a user would have run anyway).

The held-out split is a trainer's: its backend's ``confirmation`` names the keys that select it (``heldout_keys``;
verl_core: ``data.test_files``, whose built-in tasks ship one, ``builtin:arith`` -> 225 problems disjoint from the 225
validation and the 450 training ones) and how its metric names change on it (``heldout_prefixes``, a validation prefix
-> its test prefix, the empty prefix for any other metric; verl_core: ``eval/reward_mean`` -> ``test/reward_mean``).
It is evaluated only by ``verl-hpo confirm``'s runs, once at their last step. A search trial
never gets it, and an experiment may neither set a held-out key as a fixed override, a parameter or a baseline key
nor score trials by a held-out metric: :func:`check_no_test_split`, which the backends' check calls with their own
keys (this layer knows no trainer).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Prefixes = Mapping[str, str]  # a validation metric's prefix -> its name's prefix on the test split


def heldout_metric(metric: str, prefixes: Prefixes) -> str | None:
    """The name ``metric`` (a validation metric) has on the test split, by the first prefix it starts with (None:
    no prefix matches)."""
    for old, new in prefixes.items():
        if metric.startswith(old):
            return new + metric[len(old):]
    return None


def is_heldout_metric(metric: str, prefixes: Prefixes) -> bool:
    tests = tuple(v for v in prefixes.values() if v)
    return bool(tests) and metric.startswith(tests)


Error = Callable[[str, str], Exception]


def check_no_test_split(overrides: Mapping[str, Any], param_keys: Mapping[str, str], metrics: Sequence[str],
                        error: Error, keys: Sequence[str], prefixes: Prefixes,
                        baseline: Mapping[str, Any] | None = None) -> None:
    """Refuse an experiment whose search would see the held-out split: one of the trainer's held-out ``keys`` fixed,
    tuned or in ``study.baseline``, or an objective metric measured on it (``param_keys``: trainer key -> parameter
    name; ``prefixes``: the trainer's test-split names)."""
    held = set(keys)
    for key in overrides:
        if key.lstrip("+") in held:
            raise error(f"overrides.{key}", "the held-out test split is for verl-hpo confirm only (a search never "
                        "sees it); set study.confirm.test_files instead")
    for key, name in param_keys.items():
        if key.lstrip("+") in held:
            raise error(f"params.{name}.key", f"{key.lstrip('+')} cannot be tuned: the test split is for verl-hpo "
                        "confirm only")
    for m in metrics:
        if is_heldout_metric(m, prefixes):
            raise error("objective.metric", f"{m!r} is measured on the held-out test split, which a search never "
                        "sees; score trials by a validation metric (confirm reports the test value)")
    for key in baseline or {}:
        if key.lstrip("+") in held:
            raise error(f"study.baseline.{key}", "the test split is set by verl-hpo confirm (study.confirm.test_files)")


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
        out[key] = value
    return out
