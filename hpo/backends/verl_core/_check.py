"""The ``verl_core`` trainer's check of an experiment: the config name, every trainer key, the objective's metrics
and the baseline, with ``verl_core.config`` (torch-free); and which tuned values it refuses together (:func:`rejected`:
each value of the space is then checked against the other parameters' values, :mod:`hpo.experiment._combos`, and a
trial drawing a refused combination is skipped as infeasible)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from hpo.experiment import (
    MAX_COMBINATIONS,
    Space,
    SpaceError,
    candidates,
    check_combinations,
    check_metrics,
    format_value,
    located_error,
    shown_value,
)

# the memory metrics verl_core logs every step (perf/max_memory_allocated_gb on CUDA only)
VERL_CORE_MEMORY_METRICS = ("perf/cpu_memory_used_gb", "perf/max_memory_allocated_gb")

# Trainer keys the driver sets itself for every trial (so a space must not).
DRIVER_KEYS = ("trainer.default_local_dir",)


class _Located:
    def __init__(self, space: Space, origin: dict[str, str]) -> None:
        self.space, self.origin = space, origin

    def error(self, where: str, msg: str) -> SpaceError:
        return located_error(self.space, self.origin, where, msg)


def check_driver_keys(space: Space, origin: Mapping[str, str]) -> None:
    """A key the driver sets on every trial may be neither fixed nor tuned."""
    seen = {p.key: p.name for p in space.params}
    for k in DRIVER_KEYS:
        if k in space.overrides or k in seen:
            where = f"overrides.{k}" if k in space.overrides else f"params.{seen[k]}.key"
            raise located_error(space, dict(origin), where, f"{k} is set by the driver")


def check_trainer(space: Space, origin: Mapping[str, str] | None = None) -> None:
    """Check the config name, every trainer key and the corners of the space with ``verl_core.config``."""
    from verl_core.config import ConfigError, known_keys, load_config

    ctx = _Located(space, dict(origin or {}))
    keys = set(known_keys())
    try:
        load_config(space.config, [])
    except ConfigError as err:
        raise ctx.error("config", f"{space.config!r}: {err}") from None
    for k, v in space.overrides.items():
        if k not in keys:
            raise ctx.error(f"overrides.{k}", f"unknown trainer key (value {shown_value(k, v)})")
    for p in space.params:
        if p.key not in keys:
            raise ctx.error(f"params.{p.name}.key", f"unknown trainer key {p.key!r}")
    fixed = space.trainer_overrides({})
    try:
        base = _base_config(space, fixed)
    except ConfigError as err:
        check_combinations(space.params, lambda values: rejected(space, values), ctx.error)  # two values that clash
        bad = next((k for k in space.overrides if f"'{k}" in str(err) or f"{k}=" in str(err)), None)
        raise ctx.error(f"overrides.{bad}" if bad else "overrides", str(err)) from None
    for k, v in space.study.baseline.items():
        if k not in keys:
            raise ctx.error(f"study.baseline.{k}", f"unknown trainer key (value {shown_value(k, v)})")
    if space.study.baseline:
        try:
            load_config(space.config, [*fixed, *(f"{k}={format_value(v)}" for k, v in space.study.baseline.items())])
        except ConfigError as err:
            raise ctx.error("study.baseline", f"rejected by the trainer: {err}") from None
    from verl_core.config import eval_metric_names, produces_metric

    known = eval_metric_names(base)
    if space.study.kind == "throughput":  # scored on every training step's own perf/ and timing_s/ metrics
        from hpo.backends.verl_core._names import SPEED_METRICS

        known = [*SPEED_METRICS, *VERL_CORE_MEMORY_METRICS]
    speed = space.study.kind == "throughput"
    check_metrics(space.objective, lambda m: m in known or not speed and produces_metric(base, m), known, ctx.error)
    # the tuned keys' values are checked together, each against the others' (VerlCoreBackend.infeasible and
    # hpo.experiment._combos, after this check): a micro-batch is valid when some mini-batch of the space takes it


def _base_config(space: Space, fixed: list[str]) -> Any:
    """The config with the fixed overrides; where they are refused alone only because of a key the space tunes (a
    batch of 8 prompts against the config's mini-batch of 32, which every trial replaces), with the first combination
    of tuned values that verl_core accepts (:func:`accepted_values`). ConfigError (the fixed overrides' own) when none
    does."""
    from verl_core.config import ConfigError, load_config

    try:
        return load_config(space.config, fixed)
    except ConfigError as err:
        values = accepted_values(space)
        if values is None:
            raise err from None
    return load_config(space.config, space.trainer_overrides(values))


def fixed_config(space: Space) -> Any:
    """The config every trial shares: the fixed overrides, with tuned values verl_core accepts where those are refused
    alone (:func:`accepted_values`; what a trial does not tune, such as its seed or validation files, is the same in
    every trial). ConfigError when no combination is accepted."""

    return _base_config(space, space.trainer_overrides({}))


def accepted_values(space: Space) -> dict[str, Any] | None:
    """Tuned values verl_core accepts with the fixed overrides: none ({}) when those pass alone, else the first
    combination of the parameters' candidate values that does (at most MAX_COMBINATIONS tried); None when none does."""
    if rejected(space, {}) is None:
        return {}
    for combo in itertools.islice(itertools.product(*(candidates(p) for p in space.params)), MAX_COMBINATIONS):
        values = {p.name: v for p, v in zip(space.params, combo, strict=True)}
        if rejected(space, values) is None:
            return values
    return None


def rejected(space: Space, values: Mapping[str, Any]) -> str | None:
    """Why verl_core's config refuses the tuned ``values`` (by parameter name) on the fixed overrides (one line), or
    None: ``verl_core.config.load_config`` is torch-free and checks every derived batch size."""
    from verl_core.config import ConfigError, load_config

    try:
        load_config(space.config, space.trainer_overrides(dict(values)))
    except ConfigError as err:
        return str(err)
    return None
