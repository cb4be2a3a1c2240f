"""Throughput studies (``study.kind: throughput``): tune how fast a run goes, never what it learns.

A throughput trial runs a few trainer steps; the first ``study.throughput.warmup_steps`` (compilation, allocator and
cache warm-up, the first weight sync) are dropped and the trial is scored on the mean of the throughput metric over
the steps after them (``objective.aggregate: mean``), the spread recorded beside it (user attrs ``throughput_std``,
``throughput_cv``, ``throughput_steps``). Only math-neutral keys may be tuned: each backend lists its own
(``Backend.speed_keys``: micro-batch sizes, token budgets, padding removal, offload, gradient checkpointing, the
rollout engine's memory and batching), ``study.throughput.neutral_keys`` adds keys of a trainer the driver does not
know, and ``verl-hpo confirm`` checks every pick: the pick and the user's config (``study.baseline``) run
interleaved on the same seeds, the speed-up is their paired throughput ratio with its interval (more seeds, up to
``max_repeats``, while the fastest pick is not separated from the user's config), and the first step's losses and
gradient norm must agree within ``tolerance``, else the pick is reported and not recommended
(:mod:`hpo.reporting._speed`). A pick never separated is not recommended either: the user keeps their own settings.

Objectives: one of the trainer's speed metrics (``Backend.speed_metrics``: tokens per second, maximized, or a step
time, minimized); with ``mode: pareto``, that first and one of its peak-memory metrics second (minimized).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ErrorFn = Callable[[str, str], Exception]


def _meta(help: str) -> dict[str, Any]:
    return {"help": help, "choices": None}


@dataclass(frozen=True)
class ThroughputSpec:
    """``study.throughput``: how a throughput trial is measured and how its pick is checked."""

    warmup_steps: int = field(default=1, metadata=_meta(
        "Trainer steps dropped at the start of every throughput trial (compilation, cache warm-up, the first weight "
        "sync); the trial is scored on the mean over the steps after them, so it must run more steps than this."))
    repeats: int = field(default=3, metadata=_meta(
        "verl-hpo confirm: runs of each pick and of the user's config (study.baseline), interleaved (the user's "
        "config, then each pick, on one seed; then the next seed); the speed-up is their paired ratio. The least: "
        "more seeds follow, up to max_repeats, while the fastest pick is not separated from the user's config."))
    max_repeats: int | None = field(default=None, metadata={**_meta(
        "verl-hpo confirm: while the fastest pick that computes the same update is not separated from the user's "
        "config (its 95% interval of the speed-up includes 1), one more seed of interleaved runs is queued, up to "
        "this many seeds in all; a pick still not separated then is reported as no setting faster than yours found "
        "on this host. null = max(repeats, 8)."), "max": 100})
    top_k: int = field(default=2, metadata=_meta("verl-hpo confirm: picks re-measured (fastest first)."))
    tolerance: float = field(default=1e-3, metadata=_meta(
        "Same-math check: every metric of math_metrics at the first step of a pick's run and of the user's "
        "config's run on the same seed must agree within tolerance x max(|a|, |b|) (+1e-6 near 0) where the two "
        "updates saw the same samples: the trainer reproduces its first step, or both runs updated on one recorded "
        "first rollout (verl: the first run of each seed records it, the others replay it). Otherwise the check is "
        "loose (the control's spread decides; it catches a change of scale)."))
    math_metrics: tuple[str, ...] | None = field(default=None, metadata=_meta(
        "Metrics of the first step compared by the same-math check; null = the trainer's (losses, gradient norm, "
        "score: Backend.math_metrics)."))
    neutral_keys: tuple[str, ...] | None = field(default=None, metadata=_meta(
        "Keys (fnmatch patterns) this study may tune beside the trainer's known speed keys: keys of a trainer the "
        "driver does not know that do not change the update; the same-math check still checks every pick."))


DEFAULT_MAX_REPEATS = 8  # study.throughput.max_repeats when null (at least repeats)


def repeat_cap(spec: ThroughputSpec, asked: int = 0) -> int:
    """The most seeds ``confirm`` re-measures a throughput study's picks on: ``max_repeats`` (null: the larger of
    ``repeats`` and :data:`DEFAULT_MAX_REPEATS`), never fewer than ``asked`` (``confirm --seeds``)."""
    cap = spec.max_repeats if spec.max_repeats is not None else max(spec.repeats, DEFAULT_MAX_REPEATS)
    return max(cap, asked)


# A measured speed (tokens per second, seconds per step) outside these bounds is not a measurement (a trainer's bug, a
# planted value): 5e-324 or 1e308 make paired ratios underflow to 0 or overflow to inf. Inside them every ratio of two
# values and its log stay finite (|log ratio| < 49).
SPEED_MIN, SPEED_MAX = 1e-9, 1e12


def speed_value_ok(value: Any) -> bool:
    """``value`` is a number a throughput measurement can be: finite, in (:data:`SPEED_MIN`, :data:`SPEED_MAX`)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and SPEED_MIN < value < SPEED_MAX


def speed_value_problem(metric: str, measured: Sequence[float], value: float) -> str | None:
    """Why a throughput trial's measured steps (``measured``: the first objective after the warm-up) and its value
    (their mean) are not a valid measurement (one line), or None."""
    bad = next((v for v in (*measured, value) if not speed_value_ok(v)), None)
    if bad is None:
        return None
    return (f"{metric} {bad:.6g} is not a valid measurement: a throughput must be finite and between {SPEED_MIN:g} "
            f"and {SPEED_MAX:g}")


def is_speed_key(key: str, patterns: Iterable[str]) -> bool:
    """``key`` (a leading ``+`` ignored) matches one of the fnmatch ``patterns``."""
    bare = key.lstrip("+")
    return any(fnmatch.fnmatchcase(bare, p.lstrip("+")) for p in patterns)


def throughput_defaults(raw: dict[str, Any]) -> None:
    """Fill in place what a throughput study means by default where the file is silent: no pruner (a trial is a few
    steps), no early stopping, the mean over the measured steps (of the trainer's first speed metric)."""
    study = raw.get("study")
    if not isinstance(study, dict) or study.get("kind") != "throughput":
        return
    if isinstance(study.get("pruner"), dict) or study.get("pruner") is None:
        study["pruner"] = {"type": "none", **(study.get("pruner") or {})}
    if raw.get("early_stopping") is None:
        raw["early_stopping"] = {"enabled": False}
    objective = raw.get("objective")
    if objective is None:  # the metric: the trainer's first speed metric (Backend.with_defaults)
        raw["objective"] = {"aggregate": "mean"}
    elif isinstance(objective, dict) and "aggregate" not in objective:
        objective["aggregate"] = "mean"


def check_speed_objective(objective: Any, speed: Mapping[str, str], memory: Sequence[str], error: ErrorFn) -> None:
    """The objective of a throughput study: one of the trainer's ``speed`` metrics (metric -> the direction a faster
    run moves it: ``Backend.speed_metrics``) in that direction, optionally with one of its ``memory`` metrics
    minimized as a second pareto objective."""
    speed_names = ", ".join(f"{m} ({d})" for m, d in speed.items())
    targets = [(f"objective.objectives[{i}]", t.metric, t.direction) for i, t in enumerate(objective.objectives)] \
        if objective.multi else [("objective", objective.metric, objective.direction)]
    if objective.mode == "weighted":
        raise error("objective.mode", f"weighted is not a throughput objective; a throughput study is scored on one "
                    f"of {speed_names}, optionally with peak memory as a second pareto objective")
    where, metric, direction = targets[0]
    if metric not in speed:
        raise error(f"{where}.metric", f"{metric!r} is not a throughput metric; a throughput study is scored on one "
                    f"of {speed_names}")
    if direction != speed[metric]:
        faster = "higher" if speed[metric] == "maximize" else "lower"
        raise error(f"{where}.direction", f"{direction}: a faster run has a {faster} {metric}; use {speed[metric]}")
    for where, metric, direction in targets[1:]:
        if metric not in memory or direction != "minimize":
            raise error(f"{where}.metric", f"{metric!r} ({direction}): a throughput study's second objective is peak "
                        f"memory, minimized: one of {', '.join(memory)}")


def check_throughput(objective: Any, pruner_type: str, early_stopping: bool, strategy: str, speed_from: str | None,
                     spec: ThroughputSpec, error: ErrorFn) -> None:
    """A throughput study's schema rules (its metrics, keys and trial length are its backend's: ``hpo.backends``)."""
    if objective.aggregate != "mean":
        raise error("objective.aggregate", f"{objective.aggregate}: a throughput trial is scored on the mean over its "
                    "steps after study.throughput.warmup_steps (aggregate: mean)")
    if objective.constraints:
        raise error("objective.constraints", "not used by a throughput study (memory is its pre-flight's and its "
                    "second objective's)")
    if pruner_type != "none":
        raise error("study.pruner.type", f"{pruner_type}: a throughput trial is a few steps long and its warm-up steps "
                    "are not measured; use none")
    if early_stopping:
        raise error("early_stopping.enabled", "true: a throughput trial runs all its steps; set it to false")
    if strategy != "optuna":
        raise error("study.strategy", f"{strategy}: a throughput study samples with optuna")
    if speed_from is not None:
        raise error("study.speed_from", f"{speed_from!r}: only a learning study takes its speed settings from a "
                    "throughput study")
    if spec.tolerance <= 0:
        raise error("study.throughput.tolerance", f"must be positive, got {spec.tolerance}")
    if spec.max_repeats is not None and spec.max_repeats < spec.repeats:
        raise error("study.throughput.max_repeats", f"{spec.max_repeats} is fewer than study.throughput.repeats "
                    f"({spec.repeats}): confirm re-measures on repeats seeds first, then up to max_repeats")


def check_speed_keys(keys: Iterable[tuple[str, str]], patterns: tuple[str, ...], trainer: str,
                     error: ErrorFn) -> None:
    """Every tuned (or baseline) key must be math-neutral: one of the trainer's ``patterns`` (its
    ``Backend.speed_keys`` and ``study.throughput.neutral_keys``). ``keys``: (field, key)."""
    for where, key in keys:
        if not is_speed_key(key, patterns):
            known = ", ".join(patterns[:6]) + (", ..." if len(patterns) > 6 else "")
            raise error(where, f"{key!r} changes what the model learns, not only how fast; a throughput study tunes "
                        f"only {trainer}'s math-neutral keys ({known}; study.throughput.neutral_keys adds others)")
