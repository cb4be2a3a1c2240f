"""Objectives of an experiment: what a trial is scored by, from the metrics of one evaluation line.

Three modes (``objective.mode``), all data in YAML, never code:

* ``single`` (default): one ``metric`` and a ``direction``; no ``metric``: the trainer's default objective
  (``Backend.metrics.objective``, filled in when the experiment is loaded; verl_core's ``eval/reward_mean``).
* ``weighted``: ``score = sum_i weight_i * transform_i(metric_i)`` with ``direction`` (usually maximize).
  Transforms: ``identity`` (x), ``excess`` (max(0, x - threshold)), ``deficit`` (max(0, threshold - x)).
  The well-known ``0.6*reward_mean - 0.2*toxicity_mean - 0.2*max(0, latency_p95 - 0.8)`` is::

      terms:
        - {name: reward, metric: eval/reward_mean, weight: 0.6}
        - {name: toxicity, metric: eval/toxicity_mean, weight: -0.2}
        - {name: slow, metric: eval/latency_p95, weight: -0.2, transform: excess, threshold: 0.8}

  Each weighted term is stored on the trial as user attribute ``score/<name>`` (and ``score/total``).
* ``pareto``: ``objectives``, a list of ``{metric, direction}``: a true multi-objective Optuna study.

``aggregate`` (any mode): how a trial's evaluations become its value: ``last`` (the final evaluation, the
default), ``best`` (the best evaluation so far: a run that peaks and then degrades keeps its peak) or
``mean_last_k`` (the mean of the last ``k`` evaluations: averages evaluation noise, at no extra cost) or ``mean``
(every evaluation: a throughput study's steps after its warm-up, :mod:`hpo.experiment._throughput`). The
value reported to the pruner at each evaluation is the same aggregate of the evaluations so far, so pruning and
the final value rank trials alike. Applied to each objective (or to the weighted score), never to constraints.

``constraints`` (any mode): ``{metric, op: "<=" | ">=", value}``; stored with ``trial.set_constraint`` as
``metric - value`` (``<=``) or ``value - metric`` (``>=``), feasible when <= 0, so infeasible trials never
count as best. A failed trial gets the worst value in every objective and +inf in every constraint.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

MODES = ("single", "weighted", "pareto")
DIRECTIONS = ("maximize", "minimize")
TRANSFORMS = ("identity", "excess", "deficit")
OPS = ("<=", ">=")
AGGREGATES = ("last", "best", "mean_last_k", "mean")
ErrorFn = Callable[[str, str], Exception]


@dataclass(frozen=True)
class Term:
    """One weighted term: ``weight * transform(metric)``."""

    name: str
    metric: str
    weight: float
    transform: str = "identity"
    threshold: float = 0.0

    def value(self, x: float) -> float:
        if self.transform == "excess":
            x = max(0.0, x - self.threshold)
        elif self.transform == "deficit":
            x = max(0.0, self.threshold - x)
        return self.weight * x


@dataclass(frozen=True)
class Target:
    """One objective of a pareto study."""

    name: str
    metric: str
    direction: str


@dataclass(frozen=True)
class Constraint:
    name: str
    metric: str
    op: str
    value: float

    def violation(self, x: float) -> float:
        """<= 0 when satisfied."""
        return x - self.value if self.op == "<=" else self.value - x


@dataclass(frozen=True)
class Objective:
    """A parsed ``objective`` section."""

    mode: str = "single"
    metric: str = ""  # "": unset, the trainer's default objective (its backend fills it in after parsing)
    direction: str = "maximize"
    terms: tuple[Term, ...] = ()
    objectives: tuple[Target, ...] = ()
    constraints: tuple[Constraint, ...] = ()
    aggregate: str = "last"
    k: int = 3

    def aggregated(self, history: list[list[float]]) -> list[float]:
        """The trial's value(s) from its evaluations so far (oldest first; each a list of objective values)."""
        if not history:
            return []
        if self.aggregate == "last":
            return list(history[-1])
        columns = list(zip(*history, strict=True))
        if self.aggregate == "mean_last_k":
            return [sum(c[-self.k:]) / len(c[-self.k:]) for c in columns]
        if self.aggregate == "mean":
            return [sum(c) / len(c) for c in columns]
        return [max(c) if d == "maximize" else min(c) for c, d in zip(columns, self.directions, strict=True)]

    @property
    def multi(self) -> bool:
        return self.mode == "pareto"

    @property
    def directions(self) -> list[str]:
        return [t.direction for t in self.objectives] if self.multi else [self.direction]

    @property
    def direction_literal(self) -> Literal["maximize", "minimize"]:
        """Direction of the (first) objective: the curve pruning and progress use."""
        return "minimize" if self.directions[0] == "minimize" else "maximize"

    @property
    def names(self) -> list[str]:
        """Objective names for ``study.set_metric_names`` (dashboards, tables)."""
        if self.multi:
            return [t.name for t in self.objectives]
        return ["score" if self.mode == "weighted" else self.metric]

    @property
    def label(self) -> str:
        """A short description for headers."""
        if self.mode == "single":
            return f"{self.direction} {self.metric}{self._agg_text}"
        if self.mode == "weighted":
            parts = " ".join(f"{t.weight:+g}*{_term_text(t)}" for t in self.terms)
            return f"{self.direction} {parts}{self._agg_text}"
        return "pareto: " + ", ".join(f"{t.direction} {t.metric}" for t in self.objectives) + self._agg_text

    @property
    def _agg_text(self) -> str:
        if self.aggregate == "last":
            return ""
        if self.aggregate == "mean":
            return " (mean over the measured steps)"
        return " (best evaluation)" if self.aggregate == "best" else f" (mean of last {self.k} evaluations)"

    @property
    def primary_metric(self) -> str:
        """The metric that stands for "validation reward" (the diagnosis watches it): the single metric, the
        first pareto objective, or the weighted term with the largest weight."""
        if self.mode == "weighted":
            return max(self.terms, key=lambda t: t.weight).metric
        return self.objectives[0].metric if self.multi else self.metric

    @property
    def metrics(self) -> list[str]:
        """Every metric the objective and constraints read."""
        if self.mode == "single":
            out = [self.metric]
        elif self.mode == "weighted":
            out = [t.metric for t in self.terms]
        else:
            out = [t.metric for t in self.objectives]
        return list(dict.fromkeys(out + [c.metric for c in self.constraints]))

    @property
    def worst(self) -> float | list[float]:
        """The value(s) a failed trial completes with."""
        vals = [float("-inf") if d == "maximize" else float("inf") for d in self.directions]
        return vals if self.multi else vals[0]

    def evaluate(self, data: Mapping[str, Any]) -> tuple[list[float], dict[str, float]] | None:
        """Objective value(s) and weighted parts from one metrics line; None when a metric is missing."""
        needed = [t.metric for t in self.terms] if self.mode == "weighted" else (
            [t.metric for t in self.objectives] if self.multi else [self.metric])
        if any(m not in data for m in needed):
            return None
        vals = {m: _num(data[m]) for m in needed}
        if self.mode == "single":
            return [vals[self.metric]], {}
        if self.mode == "weighted":
            parts = {f"score/{t.name}": t.value(vals[t.metric]) for t in self.terms}
            total = sum(parts.values())
            parts["score/total"] = total
            return [total], parts
        return [vals[t.metric] for t in self.objectives], {}

    def constraint_values(self, data: Mapping[str, Any] | None) -> dict[str, float]:
        """Constraint violations (<= 0 feasible); +inf when the metric never arrived."""
        out = {}
        for c in self.constraints:
            x = None if data is None else data.get(c.metric)
            v = c.violation(_num(x)) if x is not None else math.inf
            out[c.name] = math.inf if math.isnan(v) else v
        return out


def _term_text(t: Term) -> str:
    if t.transform == "excess":
        return f"max(0,{t.metric}-{t.threshold:g})"
    if t.transform == "deficit":
        return f"max(0,{t.threshold:g}-{t.metric})"
    return t.metric


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _short(metric: str) -> str:
    return metric.rsplit("/", 1)[-1]


# ----------------------------------------------------------------------------- parsing
def _mapping(raw: Any, where: str, error: ErrorFn, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise error(where, f"expected a mapping, got {raw!r}")
    for k in raw:
        if k not in allowed:
            raise error(f"{where}.{k}", f"unknown field (value {raw[k]!r}); known: {', '.join(allowed)}")
    return raw


def _str(raw: dict[str, Any], key: str, where: str, error: ErrorFn, choices: tuple[str, ...] | None = None,
         default: str | None = None) -> str:
    v = raw.get(key, default)
    if v is None:
        raise error(f"{where}.{key}", "required" + (f" ({' or '.join(choices)})" if choices else ""))
    if not isinstance(v, str) or not v:
        raise error(f"{where}.{key}", f"expected a string, got {v!r}")
    if choices is not None and v not in choices:
        raise error(f"{where}.{key}", f"{v!r} is not one of {', '.join(choices)}")
    return v


def _float(raw: dict[str, Any], key: str, where: str, error: ErrorFn, default: float | None = None) -> float:
    v = raw.get(key, default)
    if v is None:
        raise error(f"{where}.{key}", "required (a number)")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise error(f"{where}.{key}", f"expected a finite number, got {v!r}")
    return float(v)


def _list(raw: Any, where: str, error: ErrorFn) -> list[Any]:
    if not isinstance(raw, list) or not raw:
        raise error(where, f"expected a non-empty list, got {raw!r}")
    return raw


def _unique(names: list[str], where: str, error: ErrorFn) -> None:
    seen: set[str] = set()
    for i, n in enumerate(names):
        if n in seen:
            raise error(f"{where}[{i}].name", f"duplicate name {n!r}")
        seen.add(n)


_FIELDS = ("mode", "metric", "direction", "terms", "objectives", "constraints", "aggregate", "k")


def parse_objective(raw: Any, error: ErrorFn) -> Objective:
    """Validate the ``objective`` section (metric names are checked against the trainer elsewhere)."""
    raw = _mapping({} if raw is None else raw, "objective", error, _FIELDS)
    mode = _str(raw, "mode", "objective", error, MODES, default="single")
    misplaced = {"single": ("terms", "objectives"), "weighted": ("metric", "objectives"),
                 "pareto": ("metric", "direction", "terms")}[mode]
    for key in misplaced:
        if key in raw:
            raise error(f"objective.{key}", f"not used with mode {mode} (value {raw[key]!r})")
    constraints = tuple(_parse_constraint(c, i, error) for i, c in enumerate(raw.get("constraints") or []))
    if "constraints" in raw and not isinstance(raw["constraints"], list):
        raise error("objective.constraints", f"expected a list, got {raw['constraints']!r}")
    _unique([c.name for c in constraints], "objective.constraints", error)
    aggregate = _str(raw, "aggregate", "objective", error, AGGREGATES, default="last")
    k = 3 if raw.get("k") is None else raw["k"]  # null = unset (so an override can switch the aggregate away)
    if aggregate != "mean_last_k" and raw.get("k") is not None:
        raise error("objective.k", f"only with aggregate mean_last_k (value {k!r})")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise error("objective.k", f"expected a positive integer, got {k!r}")
    if mode == "single":
        metric = "" if raw.get("metric") is None else _str(raw, "metric", "objective", error)
        return Objective(mode, metric,
                         _str(raw, "direction", "objective", error, DIRECTIONS, default="maximize"),
                         constraints=constraints, aggregate=aggregate, k=k)
    if mode == "weighted":
        terms = []
        for i, t in enumerate(_list(raw.get("terms"), "objective.terms", error)):
            where = f"objective.terms[{i}]"
            t = _mapping(t, where, error, ("name", "metric", "weight", "transform", "threshold"))
            metric = _str(t, "metric", where, error)
            transform = _str(t, "transform", where, error, TRANSFORMS, default="identity")
            if transform == "identity" and "threshold" in t:
                raise error(f"{where}.threshold", f"only with transform excess or deficit (value {t['threshold']!r})")
            threshold = _float(t, "threshold", where, error) if transform != "identity" else 0.0
            terms.append(Term(_str(t, "name", where, error, default=_short(metric)), metric,
                              _float(t, "weight", where, error), transform, threshold))
        _unique([t.name for t in terms], "objective.terms", error)
        return Objective(mode, direction=_str(raw, "direction", "objective", error, DIRECTIONS, default="maximize"),
                         terms=tuple(terms), constraints=constraints, aggregate=aggregate, k=k)
    targets = []
    for i, t in enumerate(_list(raw.get("objectives"), "objective.objectives", error)):
        where = f"objective.objectives[{i}]"
        t = _mapping(t, where, error, ("name", "metric", "direction"))
        metric = _str(t, "metric", where, error)
        targets.append(Target(_str(t, "name", where, error, default=_short(metric)), metric,
                              _str(t, "direction", where, error, DIRECTIONS)))
    if len(targets) < 2:
        raise error("objective.objectives", f"pareto needs at least 2 objectives, got {len(targets)}")
    _unique([t.name for t in targets], "objective.objectives", error)
    return Objective(mode, objectives=tuple(targets), constraints=constraints, aggregate=aggregate, k=k)


def _parse_constraint(raw: Any, i: int, error: ErrorFn) -> Constraint:
    where = f"objective.constraints[{i}]"
    raw = _mapping(raw, where, error, ("name", "metric", "op", "value"))
    metric = _str(raw, "metric", where, error)
    op = _str(raw, "op", where, error, OPS)
    return Constraint(_str(raw, "name", where, error, default=_short(metric)), metric, op,
                      _float(raw, "value", where, error))


def check_metrics(objective: Objective, produced: Callable[[str], bool], known: list[str],
                  error: ErrorFn) -> None:
    """Every metric the objective reads must be one the trainer logs (``produced``)."""
    places: list[tuple[str, str]] = []
    if objective.mode == "single":
        places.append(("objective.metric", objective.metric))
    places += [(f"objective.terms[{i}].metric", t.metric) for i, t in enumerate(objective.terms)]
    places += [(f"objective.objectives[{i}].metric", t.metric) for i, t in enumerate(objective.objectives)]
    places += [(f"objective.constraints[{i}].metric", c.metric) for i, c in enumerate(objective.constraints)]
    for where, metric in places:
        if not produced(metric):
            raise error(where, f"unknown metric {metric!r}: the trainer's evaluations log {', '.join(known)}")


@dataclass
class Scored:
    """The latest evaluation of a trial: objective values, weighted parts, constraint violations."""

    values: list[float] = field(default_factory=list)
    parts: dict[str, float] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
