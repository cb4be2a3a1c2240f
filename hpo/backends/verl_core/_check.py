"""The ``verl_core`` trainer's check of an experiment: the config name, every trainer key, the objective's metrics,
the baseline and the corners of the space, with ``verl_core.config`` (torch-free)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from hpo.experiment import shown_value
from hpo.experiment._objective import check_metrics
from hpo.experiment._space import Space, SpaceError, format_value, located_error

# the memory metrics verl_core logs every step (perf/max_memory_allocated_gb on CUDA only)
VERL_CORE_MEMORY_METRICS = ("perf/cpu_memory_used_gb", "perf/max_memory_allocated_gb")

MAX_CORNER_CHECKS = 64
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
        base = load_config(space.config, fixed)
    except ConfigError as err:
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
    # Each parameter alone at its ends / choices, then all parameters jointly at their corners.
    for p in space.params:
        for v in p.corner_values():
            try:
                load_config(space.config, space.trainer_overrides({p.name: v}))
            except ConfigError as err:
                raise ctx.error(f"params.{p.name}", f"value {v!r} is rejected by the trainer: {err}") from None
    combos = list(itertools.islice(itertools.product(*(p.corner_values() for p in space.params)),
                                   MAX_CORNER_CHECKS))
    for combo in combos:
        values = {p.name: v for p, v in zip(space.params, combo, strict=True)}
        try:
            load_config(space.config, space.trainer_overrides(values))
        except ConfigError as err:
            shown = ", ".join(f"{k}={v!r}" for k, v in values.items())
            raise ctx.error("params", f"the combination {shown} is rejected by the trainer: {err}") from None


