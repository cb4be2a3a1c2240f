"""The same-math check of a throughput study's picks: the first training step's metrics of a pick's run and of the
user's config's run on one seed, compared strictly where both updates saw the same samples (the trainer reproduces
its first step, or both runs updated on one recorded first rollout: :mod:`hpo.study._confirm._first_rollout`) and
loosely, by the control's run-to-run spread, where they did not. :mod:`hpo.reporting._speed` applies it per seed."""

from __future__ import annotations

import math
from typing import Any

from optuna.trial import FrozenTrial


def first_step(t: FrozenTrial) -> dict[str, Any] | None:
    """A run's ``first_step`` user attr with only its finite numbers (a stored text or a list is not compared)."""
    first = t.user_attrs.get("first_step")
    if not isinstance(first, dict):
        return None
    return {str(k): v for k, v in first.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


NOISE_FACTOR = 3.0  # a metric may differ by this many times what two runs of the user's config on one seed differ by
LOOSE_FLOOR = 0.5  # ... and at least by this share of its value when the trainer's first step does not reproduce
UNCOMPARABLE = 0.5  # a metric that moved more than this share between the user's two runs is not compared


def math_disagreements(pick: dict[str, Any], base: dict[str, Any], tolerance: float,
                       noise: dict[str, float] | None = None, replayed: bool = False) -> list[str]:
    """The first-step metrics (``first_step`` user attrs) that differ beyond what is allowed, or that only one run
    logged (``step``: where each was taken).

    Strict (``replayed``: both runs updated on one recorded first rollout, :mod:`hpo.study._confirm._first_rollout`;
    or ``noise`` None or all 0: the trainer reproduces its first step): each metric within ``tolerance x max(|a|,
    |b|, 1)``, relative above 1 and absolute below: a policy loss near 0 is a cancellation of per-token terms of
    size ~1 (GRPO's normalized advantages), which verl's bf16 log-probs in another micro-batch order move by ~1e-4.
    Loose (two runs of the user's config on one seed differ, and the runs were not replayed: an asynchronous rollout
    samples differently run to run): a metric may also differ by ``max(NOISE_FACTOR x noise, LOOSE_FLOOR)`` of its
    value, and one that moved by more than :data:`UNCOMPARABLE` between the user's own two runs (a loss near 0) is
    not compared: the check then catches a change of the update's scale or form (a loss aggregation switch moves the
    gradient norm several-fold), not a small one."""
    noise = noise or {}
    loose = not replayed and any(r > 1e-9 for r in noise.values())
    out = []
    for m in sorted((set(pick) | set(base)) - {"step"}):
        a, b = pick.get(m), base.get(m)
        if a is None or b is None:
            out.append(f"{m} logged by {'the pick' if b is None else 'your config'} only")
            continue
        a, b = float(a), float(b)
        if loose:
            if noise.get(m, 0.0) > UNCOMPARABLE:
                continue
            allowed = tolerance * max(1.0, abs(b)) + max(NOISE_FACTOR * noise.get(m, 0.0), LOOSE_FLOOR) * abs(b)
        else:
            allowed = tolerance * max(1.0, abs(a), abs(b))
        if not abs(a - b) <= allowed:
            out.append(f"{m} {a:.6g} vs {b:.6g}")
    if pick.get("step") != base.get("step") and "step" in pick and "step" in base:
        out.append(f"first step {pick['step']} vs {base['step']}")
    return out


def run_noise(base: dict[str, Any], control: dict[str, Any]) -> dict[str, float]:
    """Per metric, how far the user's config's two runs on one seed differ at the first step, relative to the first
    run's value (``|a - b| / max(1e-12, |a|)``): 0 everywhere where the trainer reproduces its first step."""
    return {m: abs(float(control[m]) - float(base[m])) / max(1e-12, abs(float(base[m])))
            for m in set(base) & set(control) - {"step"}}
