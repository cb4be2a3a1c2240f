"""A section of an experiment file built into its schema dataclass field by field (:func:`build_section`): unknown
keys refused, each value checked against the field's type hint (numbers finite, lists of strings, mappings), its
``choices`` metadata and its sign (positive, or >= 0 for the fields listed), and nested sections built the same
way. Each problem is one :class:`~hpo.experiment._errors.SpaceError` line naming the dotted field and the value.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

from hpo.experiment._errors import ErrorContext
from hpo.experiment._schema import format_value


def _type_label(tp: Any) -> str:
    if tp is float:
        return "a number"
    if tp is int:
        return "an integer"
    if tp is bool:
        return "true or false"
    if tp is str:
        return "a string"
    return str(tp)


def _check_scalar(value: Any, tp: Any, where: str, ctx: ErrorContext) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = next(a for a in args if a is not type(None))
        return _check_scalar(value, inner, where, ctx)
    if origin is tuple:
        if not isinstance(value, list) or not value or not all(isinstance(v, (str, int)) for v in value):
            raise ctx.error(where, f"expected a non-empty list of strings, got {value!r}")
        return tuple(str(v) for v in value)
    if origin is dict:
        if not isinstance(value, dict):
            raise ctx.error(where, f"expected a mapping, got {value!r}")
        return {str(k): format_value(v) for k, v in value.items()}
    ok = (
        (tp is bool and isinstance(value, bool))
        or (tp is int and isinstance(value, int) and not isinstance(value, bool))
        or (tp is float and isinstance(value, (int, float)) and not isinstance(value, bool))
        or (tp is str and isinstance(value, str))
    )
    if not ok:
        raise ctx.error(where, f"expected {_type_label(tp)}, got {value!r}")
    if tp is float and not math.isfinite(value):
        raise ctx.error(where, f"expected a finite number, got {value!r}")
    return float(value) if tp is float else value


def build_section(cls: type, raw: Any, where: str, ctx: ErrorContext) -> Any:
    """``raw`` (the mapping at field ``where``; None = every default) as an instance of the dataclass ``cls``."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ctx.error(where, f"expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in raw:
        if key not in names:
            raise ctx.error(f"{where}.{key}", f"unknown field (value {raw[key]!r}); known: {', '.join(names)}")
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            continue
        tp, sub = hints[f.name], f"{where}.{f.name}"
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            kwargs[f.name] = build_section(tp, raw[f.name], sub, ctx)
            continue
        value = _check_scalar(raw[f.name], tp, sub, ctx)
        choices = f.metadata.get("choices")
        if choices is not None and value not in choices:
            raise ctx.error(sub, f"{value!r} is not one of {', '.join(choices)}")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0 and f.name not in (
            "seed", "n_warmup_steps", "n_startup_trials", "max_retry", "gpus_per_trial", "threshold", "min_value",
            "preflight_margin", "n_warmup_evals", "min_delta", "seed_base", "hacking_min_drop", "plateau_min_delta",
            "keep_checkpoints", "burn_in_steps", "resample_probability", "max_rollbacks", "warmup_steps",
            "resolution",  # study.confirm.resolution 0: a preference only between equal means
        ):
            raise ctx.error(sub, f"must be positive, got {value!r}")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0 and f.name != "min_value":
            raise ctx.error(sub, f"must be >= 0, got {value!r}")
        most = f.metadata.get("max")
        if most is not None and isinstance(value, (int, float)) and not isinstance(value, bool) and value > most:
            raise ctx.error(sub, f"at most {most}, got {value!r}")
        kwargs[f.name] = value
    return cls(**kwargs)
