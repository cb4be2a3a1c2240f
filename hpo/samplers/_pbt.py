"""Population-based training decisions, as pure functions over the population's segments (``study.strategy: pbt``).

A member trains in segments of ``study.pbt.interval_steps`` trainer steps; each segment is one trial of the study
(:mod:`hpo.study._population` turns trials into :class:`Segment` and queues the next ones). When a member's segment
ends, :func:`decide` picks what it does next from the population's *latest* results (asynchronous: no barrier,
members may be at different steps):

* **done**: the segment reached ``total`` steps with a checkpoint.
* **rollback**: the segment was stopped by a collapse (``stop_reason=collapsed:<label>``, :mod:`hpo.analysis`):
  restart from the checkpoint it started from (the member's last healthy one) with the label's rule applied
  (:func:`rollback_rules`: lower learning rate, higher KL / entropy weight), at most ``max_rollbacks`` times in a
  row. A member with no healthy checkpoint of its own (its first segment collapsed) exploits a healthy member
  instead, or rolls back to a fresh start when there is none yet. Past ``max_rollbacks``, or after another failure
  without a checkpoint (crash, timeout, pruned, early-stopped), the member exploits a healthy top member, else
  restarts from its own start checkpoint (``retry``) while rollbacks are left. Every failed segment in a row counts
  (rollbacks, exploits and retries after a failure): past ``max_rollbacks + 1`` of them the member stops, so a
  member whose segments keep failing (a trainer that crashes on resume, a broken donor checkpoint) cannot loop.
  A segment whose start checkpoint is gone (``checkpoint`` None past step 0) cannot roll back or retry: its member
  exploits or stops. A finished segment whose end checkpoint is gone counts as failed
  (:class:`~hpo.study._population.Population` sets ``reached_end`` False after looking at the disk).
* **exploit**: the member is in the bottom ``quantile`` of the members ranked by their latest finished segment's
  value (after ``burn_in_steps``): it continues a top-``quantile`` member's newest checkpoint (the donor's step
  count included) with the donor's parameters perturbed by :func:`explore`. A donor must have steps left (a member
  that already reached ``total`` gives no segment to continue).
* **continue**: otherwise its own checkpoint, same parameters.

Randomness comes from the ``random.Random`` the caller passes (seeded per decision), so a decision is
reproducible from the study.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hpo.experiment import Param, PbtSpec, parse_rollback_rule

LR_KEYS = ("optim.lr",)
KL_KEYS = ("kl_ctrl.kl_coef", "kl_loss_coef")
ENTROPY_KEYS = ("entropy_coeff",)


@dataclass(frozen=True)
class Segment:
    """One segment (trial) of a member, as the decisions see it."""

    number: int
    member: int
    seq: int  # the member's segment count (rollbacks included)
    start: int
    end: int
    params: dict[str, Any]
    finished: bool = True
    value: float | None = None  # the segment's objective value (finite), when it has one
    reached_end: bool = False  # ran to ``end`` and saved its checkpoint there
    collapse: str | None = None  # nan | kl_blowup | entropy_collapse
    source: int | None = None  # the trial whose end checkpoint it continued (None: from scratch)
    checkpoint: str | None = None  # the path it continued from (the start checkpoint its copy was made of)
    rollbacks: int = 0  # rollbacks / retries in a row that led to this segment
    action: str = "start"


@dataclass(frozen=True)
class Decision:
    """What a member does next: ``action`` from ``start`` with ``params``, continuing the end checkpoint of trial
    ``source`` (or, for ``rollback`` / ``retry``, the path ``checkpoint``; None for both: from scratch)."""

    action: str  # continue | exploit | rollback | retry
    start: int
    end: int
    params: dict[str, Any]
    source: int | None = None
    checkpoint: str | None = None
    donor: int | None = None
    rollbacks: int = 0
    why: str = ""
    moved: dict[str, Any] = field(default_factory=dict)


def sample(params: Sequence[Param], rng: random.Random) -> dict[str, Any]:
    """An initial member's parameters: each drawn from its distribution (log-uniform for log params)."""
    return {p.name: _draw(p, rng) for p in params}


def initial_population(params: Sequence[Param], n: int, rng: random.Random, init: str = "lhs"
                       ) -> list[dict[str, Any]]:
    """``n`` members' starting parameters. ``random``: each drawn independently (:func:`sample`). ``lhs``: a Latin
    hypercube: each numeric parameter's range (its log for log parameters) cut into ``n`` equal strata, member i
    drawn uniformly inside stratum ``perm[i]`` of an independent random permutation per parameter, so every stratum
    holds exactly one member (on an int or step grid, rounding can merge neighbours); a categorical's choices are
    dealt in turn (each appears ``n // len(choices)`` or one more times), in a shuffled order."""
    if init == "random":
        return [sample(params, rng) for _ in range(n)]
    cols: dict[str, list[Any]] = {}
    for p in params:
        perm = list(range(n))
        rng.shuffle(perm)
        if p.type == "categorical":
            choices = list(p.choices or ())
            cols[p.name] = [choices[k % len(choices)] for k in perm]
            continue
        assert p.low is not None and p.high is not None
        lo, hi = (math.log(p.low), math.log(p.high)) if p.log else (float(p.low), float(p.high))
        if p.type == "int" and not p.log:  # strata of the integer range, each integer equally likely overall
            lo, hi = lo - 0.5, hi + 0.5
        u = [(k + rng.random()) / n for k in perm]
        x = [lo + v * (hi - lo) for v in u]
        cols[p.name] = [_clip(p, math.exp(v) if p.log else v) for v in x]
    return [{p.name: cols[p.name][i] for p in params} for i in range(n)]


def _draw(p: Param, rng: random.Random) -> Any:
    if p.type == "categorical":
        return rng.choice(list(p.choices or ()))
    assert p.low is not None and p.high is not None
    if p.type == "int":
        if p.log:
            n = int(round(math.exp(rng.uniform(math.log(p.low), math.log(p.high)))))
        else:
            n = rng.randint(int(p.low), int(p.high))
        return _clip(p, n)
    v = math.exp(rng.uniform(math.log(p.low), math.log(p.high))) if p.log else rng.uniform(p.low, p.high)
    return _clip(p, v)


def _clip(p: Param, v: Any) -> Any:
    """``v`` inside the parameter's range and on its step grid."""
    if p.type == "categorical":
        return v
    assert p.low is not None and p.high is not None
    v = min(max(v, p.low), p.high)
    if p.step is not None:
        v = p.low + round((v - p.low) / p.step) * p.step
        v = min(max(v, p.low), p.high)
    if p.type == "int":
        return int(round(v))
    return float(v)


def perturb(p: Param, value: Any, up: bool, spec: PbtSpec) -> Any:
    """One explore move of ``value``: floats times ``perturb_up`` / ``perturb_down`` (a shift in log space, which
    is what a multiplicative factor is for a log parameter; a linear float at 0 moves by the factor's share of its
    range); ints and categoricals to the neighbouring value (ints on a log scale by the factor)."""
    factor = spec.perturb_up if up else spec.perturb_down
    if p.type == "categorical":
        choices = list(p.choices or ())
        i = choices.index(value) if value in choices else 0
        return choices[min(max(i + (1 if up else -1), 0), len(choices) - 1)]
    assert p.low is not None and p.high is not None
    if p.type == "int":
        if p.log:
            moved = int(round(value * factor))
            if moved == value:
                moved = value + (1 if up else -1)
            return _clip(p, moved)
        return _clip(p, int(value) + (1 if up else -1) * int(p.step or 1))
    if value == 0 and not p.log:
        return _clip(p, (factor - 1.0) * (p.high - p.low) if up else 0.0)
    return _clip(p, float(value) * factor)


def explore(donor: dict[str, Any], params: Sequence[Param], spec: PbtSpec, rng: random.Random) -> dict[str, Any]:
    """The donor's parameters with the explored ones resampled (probability ``resample_probability``) or
    perturbed up or down (even odds)."""
    out = dict(donor)
    names = set(spec.explore) if spec.explore is not None else {p.name for p in params}
    for p in params:
        if p.name not in names or p.name not in out:
            continue
        if rng.random() < spec.resample_probability:
            out[p.name] = _draw(p, rng)
        else:
            out[p.name] = perturb(p, out[p.name], rng.random() < 0.5, spec)
    return out


def rollback_rules(params: Sequence[Param], spec: PbtSpec) -> dict[str, list[tuple[str, float]]]:
    """Per collapse label, the (parameter, factor) moves of a rollback: ``study.pbt.rollback`` when given, else
    the safe way for each tuned knob by its trainer key: learning rates x0.5 on every label, KL coefficients x2
    on ``kl_blowup``, entropy coefficients x2 on ``entropy_collapse``."""
    if spec.rollback is not None:
        return {label: parse_rollback_rule(rule) for label, rule in spec.rollback.items()}
    lrs = [(p.name, 0.5) for p in params if p.key.endswith(LR_KEYS) and p.type != "categorical"]
    kls = [(p.name, 2.0) for p in params if p.key.endswith(KL_KEYS) and p.type != "categorical"]
    ents = [(p.name, 2.0) for p in params if p.key.endswith(ENTROPY_KEYS) and p.type != "categorical"]
    return {"nan": lrs, "kl_blowup": lrs + kls, "entropy_collapse": lrs + ents}


def apply_rule(values: dict[str, Any], rule: list[tuple[str, float]], params: Sequence[Param]) -> dict[str, Any]:
    by_name = {p.name: p for p in params}
    out = dict(values)
    for name, factor in rule:
        p = by_name.get(name)
        if p is None or p.type == "categorical" or name not in out:
            continue
        moved = out[name] * factor
        if out[name] == 0 and factor > 1 and p.low is not None and p.high is not None:
            moved = (factor - 1.0) * 0.1 * (p.high - p.low) if p.high > p.low else p.high  # off zero, gently
        out[name] = _clip(p, moved)
    return out


def latest(segments: Sequence[Segment]) -> dict[int, Segment]:
    """Each member's newest segment (highest ``seq``; among equal seqs the highest number)."""
    out: dict[int, Segment] = {}
    for s in segments:
        cur = out.get(s.member)
        if cur is None or (s.seq, s.number) > (cur.seq, cur.number):
            out[s.member] = s
    return out


def ranked(segments: Sequence[Segment], maximize: bool, burn_in: int = 0) -> list[Segment]:
    """The members' latest *finished, healthy* results (ran to their end with a value), best first: the
    population PBT compares a member against. A member whose latest finished segment failed is not ranked."""
    done = [s for s in segments if s.finished]
    out = [s for s in latest(done).values() if s.reached_end and s.value is not None and s.end >= burn_in]
    out.sort(key=lambda s: (-s.value if maximize else s.value, s.number))  # type: ignore[operator]
    return out


def decide(seg: Segment, segments: Sequence[Segment], params: Sequence[Param], spec: PbtSpec, total: int,
           maximize: bool, rng: random.Random) -> Decision | None:
    """What member ``seg.member`` does after its finished segment ``seg``, given every segment of the study (the
    population's latest results among them); None when the member is done (or has nothing left to try)."""
    interval = spec.interval_steps
    if seg.reached_end:
        if seg.end >= total:
            return None
        order = ranked(segments, maximize, spec.burn_in_steps)
        k = max(1, int(len(order) * spec.quantile)) if len(order) >= 2 else 0
        bottom = {s.member for s in order[len(order) - k:]} if k else set()
        top = [s for s in order[:k] if s.member != seg.member and s.end < total]  # a donor with steps left
        if seg.member in bottom and top and seg.end >= spec.burn_in_steps:
            donor = rng.choice(top)
            new = explore(donor.params, params, spec, rng)
            return Decision("exploit", donor.end, min(donor.end + interval, total), new, source=donor.number,
                            donor=donor.number, why=f"bottom {k}/{len(order)}: value {seg.value} vs donor "
                            f"{donor.value}")
        return Decision("continue", seg.end, min(seg.end + interval, total), dict(seg.params), source=seg.number)
    # no checkpoint at the segment's end: a collapse rolls back, anything else exploits or retries, at most
    # max_rollbacks + 1 failed segments in a row (rollbacks, exploits and retries all count: a member whose every
    # segment fails, a broken donor checkpoint or a trainer that crashes on resume, must not loop for ever)
    healthy = [s for s in ranked(segments, maximize) if s.member != seg.member and s.end < total]
    restartable = seg.checkpoint is not None or seg.start == 0  # its start checkpoint is there, or it began afresh
    if seg.collapse is not None and seg.rollbacks < spec.max_rollbacks and restartable and (
            seg.checkpoint is not None or not healthy):
        rule = rollback_rules(params, spec).get(seg.collapse, [])
        new = apply_rule(seg.params, rule, params)
        moved = {n: new[n] for n in new if new[n] != seg.params.get(n)}
        return Decision("rollback", seg.start, seg.end, new, source=seg.source, checkpoint=seg.checkpoint,
                        rollbacks=seg.rollbacks + 1, why=f"collapsed:{seg.collapse}", moved=moved)
    if seg.rollbacks > spec.max_rollbacks:
        return None
    if healthy:
        k = max(1, int(len(healthy) * spec.quantile))
        donor = rng.choice(healthy[:k])
        new = explore(donor.params, params, spec, rng)
        return Decision("exploit", donor.end, min(donor.end + interval, total), new, source=donor.number,
                        donor=donor.number, rollbacks=seg.rollbacks + 1, why=f"no checkpoint at step {seg.end}"
                        + (f" (collapsed:{seg.collapse}, {seg.rollbacks} rollbacks)" if seg.collapse else ""))
    if seg.rollbacks < spec.max_rollbacks and restartable:
        return Decision("retry", seg.start, seg.end, dict(seg.params), source=seg.source, checkpoint=seg.checkpoint,
                        rollbacks=seg.rollbacks + 1, why="no checkpoint and no healthy member")
    return None


def lineage(segments: Sequence[Segment], number: int) -> list[Segment]:
    """The chain of segments whose checkpoints led to trial ``number``'s, oldest first (collapsed segments that
    were rolled back are not in it: their successor continued the same checkpoint they started from)."""
    by_number = {s.number: s for s in segments}
    chain: list[Segment] = []
    cur = by_number.get(number)
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = by_number.get(cur.source) if cur.source is not None else None
    return chain[::-1]


def schedule(chain: Sequence[Segment]) -> list[dict[str, Any]]:
    """A lineage's hyperparameter schedule: ``{"start", "end", "params"}`` per step range, adjacent ranges with the
    same parameters merged."""
    out: list[dict[str, Any]] = []
    for s in chain:
        if out and out[-1]["params"] == s.params and out[-1]["end"] == s.start:
            out[-1]["end"] = s.end
        else:
            out.append({"start": s.start, "end": s.end, "params": dict(s.params)})
    return out
