"""One trial's live state: each metrics line's objective values go to Optuna, and the pruner, the plateau rule, the
spread rule (``early_stopping``), the run diagnosis, a promoted run's steps and the study's budget decide whether the
trial stops (the ``stop_reason``s of :mod:`hpo.study._trial._outcome`)."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable
from typing import Any

from optuna.trial import Trial, TrialState

from hpo.analysis import Diagnoser
from hpo.execution import is_finite
from hpo.experiment import SPEED_MAX, SPEED_MIN, EarlyStopping, Scored, Space, speed_value_ok

TIMEOUT_MARGIN = 1e-3  # a timed-out throughput trial is told this much slower than the slowest finished one


@dataclasses.dataclass
class Watch:
    """Reports objective values to Optuna and decides pruning / convergence, one metrics line at a time."""

    trial: Trial
    space: Space
    total_steps: int | None
    on_eval: Callable[[int, float], None]
    diagnoser: Diagnoser | None = None
    prune: bool = True  # False for confirmation runs
    early_stop: bool = True  # the early_stopping rules (plateau, spread); False: confirmation runs' full budget
    test_metric: str | None = None  # a confirmation run's held-out metric (its last value: test_value)
    test_value: float | None = None
    # study.budget: asked at each evaluation before the last; True stops the trial (stop_reason=budget)
    over_budget: Callable[[], bool] | None = None
    # study.fidelity.proxy: a promoted target run stops at its first evaluation at or past this step
    # (stop_reason=promote_steps; its value is the aggregate there, whatever the trainer logged after it)
    stop_at: int | None = None
    stopped_at: int | None = None
    # study.kind throughput: evaluations up to this step are warm-up (not measured); the first training step's
    # math_metrics are kept for the same-math check (hpo.reporting._speed)
    warmup_steps: int | None = None
    math_metrics: tuple[str, ...] = ()
    step_time: str | None = None  # the trainer's step-time metric (its backend's metrics.step_time): time saved
    first_step: dict[str, float] | None = None
    value: float | None = None
    streak: int = 0
    step_times: list[float] = dataclasses.field(default_factory=list)
    scored: Scored | None = None
    curve: dict[int, float] = dataclasses.field(default_factory=dict)
    # evaluations by step: (objective values, or None when one is NaN/inf; weighted-score parts; the line)
    evals: dict[int, tuple[list[float] | None, dict[str, float], dict[str, Any]]] = dataclasses.field(
        default_factory=dict)

    @property
    def history(self) -> list[list[float]]:
        """The finite evaluations in step order (what the aggregate and the plateau rule read)."""
        return [raw for _, (raw, _, _) in sorted(self.evals.items()) if raw is not None]

    def __call__(self, step: int, data: dict[str, Any]) -> str | None:
        if self.stopped_at is not None and step > self.stopped_at:  # logged before the stop reached the trainer
            return "promote_steps"
        t = data.get(self.step_time) if self.step_time is not None else None
        if isinstance(t, (int, float)) and is_finite(t):
            self.step_times.append(float(t))
        decision = None
        objective = self.space.objective
        if self.test_metric is not None and is_finite(data.get(self.test_metric)):
            self.test_value = float(data[self.test_metric])
        if self.math_metrics and step > 0 and (self.first_step is None or step < self.first_step["step"]) \
                and any(m in data for m in self.math_metrics):
            self.first_step = {"step": step, **{m: float(data[m]) for m in self.math_metrics
                                                if m in data and is_finite(data[m])}}
        evaluated = objective.evaluate(data)
        if evaluated is not None and self.warmup_steps is not None and step <= self.warmup_steps:
            evaluated = None  # a warm-up step: compilation and caches, not the config's speed
        if evaluated is not None and step not in self.evals:  # a resumed trainer re-logs steps: count each once
            raw, parts = evaluated
            finite = all(is_finite(v) for v in raw)
            self.evals[step] = ([float(v) for v in raw] if finite else None, parts, dict(data))
            last = max(self.evals)  # the trial's last evaluation is its highest step, whatever the line order
            last_raw, last_parts, last_data = self.evals[last]
            history = self.history
            if last_raw is not None:
                values = objective.aggregated(history)
                self.value = values[0]
                self.scored = Scored(values, last_parts, last_data)
            else:
                self.value, self.scored = math.nan, None
            if finite and step == last:
                self.on_eval(step, values[0])
                if self._report_and_prune(step, values[0]):
                    decision = "pruned"
        es: EarlyStopping = self.space.early_stopping
        if not self.early_stop:
            es = dataclasses.replace(es, enabled=False)
        if decision is None and es.enabled and evaluated is not None and self._plateaued(es):
            decision = "plateau"
        if decision is None and es.enabled and es.metric is not None and es.metric in data \
                and is_finite(data[es.metric]):
            self.streak = self.streak + 1 if float(data[es.metric]) < es.threshold else 0
            if self.streak >= es.patience and self.value is not None and math.isfinite(self.value):
                decision = "converged" if self._reached_floor(self.value, es.min_value) else "collapsed"
        if self.diagnoser is not None:
            label = self.diagnoser.update(step, data)
            if decision is None and label is not None:
                decision = f"collapsed:{label}"
        if decision is None and self.stop_at is not None and step >= self.stop_at \
                and step == max(self.evals, default=-1) and self.evals[step][0] is not None \
                and (self.total_steps is None or step < self.total_steps):
            decision, self.stopped_at = "promote_steps", step
        if decision is None and self.over_budget is not None and self.evals.get(step, (None,))[0] is not None \
                and step == max(self.evals) and (self.total_steps is None or step < self.total_steps) \
                and self.over_budget():
            decision = "budget"  # the last: a trial that stops anyway for another reason is not the budget's
        return decision

    def throughput_spread(self) -> dict[str, float | int | None]:
        """The measured steps' first objective: its standard deviation, coefficient of variation and count."""
        xs = [h[0] for h in self.history]
        if not xs:
            return {}
        std = statistics.stdev(xs) if len(xs) > 1 else 0.0
        mean = sum(xs) / len(xs)
        return {"throughput_std": round(std, 6), "throughput_cv": round(std / mean, 6) if mean else None,
                "throughput_steps": len(xs)}

    def timed_out_values(self, slowest: float | None) -> tuple[list[float], float | None]:
        """A throughput trial stopped at its time limit: its values to tell, slower than ``slowest`` (the slowest
        finished trial's first objective) by :data:`TIMEOUT_MARGIN`, or at its partial rate (the mean over the steps
        it measured) where that is slower still; before any trial finished (``slowest`` None), the slowest a
        measurement can be (:data:`~hpo.experiment._throughput.SPEED_MIN`, ``SPEED_MAX`` for a step time), so no
        later trial is ranked below it by the sampler. Also the partial rate (None: no measured step). Reports rank
        it below every finished trial whatever it got (:func:`hpo.record.is_failed`)."""
        partial = self.scored.values[0] if self.scored is not None and speed_value_ok(self.scored.values[0]) \
            else None
        faster_higher = self.space.objective.direction_literal == "maximize"
        floor = 2 * SPEED_MIN if faster_higher else SPEED_MAX / 2
        if slowest is None:
            value = floor
        else:
            cap = slowest * (1 - TIMEOUT_MARGIN if faster_higher else 1 + TIMEOUT_MARGIN)
            value = cap if partial is None else (min if faster_higher else max)(partial, cap)
        value = min(max(value, 2 * SPEED_MIN), SPEED_MAX / 2)
        worst = self.space.objective.worst
        rest = (list(self.scored.values[1:]) if self.scored is not None else
                list(worst[1:]) if isinstance(worst, list) else [])
        return [value, *rest], partial

    def _plateaued(self, es: EarlyStopping) -> bool:
        """The last ``plateau_evals`` evaluations (first objective) did not beat the best before them by more
        than ``plateau_min_delta``."""
        n = es.plateau_evals
        if n is None or len(self.history) <= n:
            return False
        sign = 1.0 if self.space.objective.direction_literal == "maximize" else -1.0
        before = max(sign * h[0] for h in self.history[:-n])
        recent = max(sign * h[0] for h in self.history[-n:])
        return recent <= before + es.plateau_min_delta

    def _reached_floor(self, value: float, floor: float) -> bool:
        """A small spread at a good objective value is convergence; at a poor one, a collapsed policy."""
        if self.space.objective.direction_literal == "maximize":
            return value >= floor
        return value <= floor

    def _report_and_prune(self, step: int, value: float) -> bool:
        """Record the intermediate value and ask the pruner. Single-objective: ``trial.report`` and
        Optuna's pruner. Optuna cannot report multi-objective curves, so a pareto study records its first
        objective's curve (user attr ``curve``) and prunes by the median rule: the trial's best value so
        far against the median of finished trials' values at the same step."""
        spec = self.space.study.pruner
        self.curve[step] = value
        warm = self.prune and len(self.history) > spec.n_warmup_evals
        if not self.space.objective.multi:
            self.trial.report(value, step)
            return warm and spec.type != "none" and self.trial.should_prune()
        self.trial.set_user_attr("curve", {str(k): v for k, v in sorted(self.curve.items())})
        if not warm or step < spec.n_warmup_steps or spec.type != "median":
            return False
        finished = self.trial.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        complete = [t for t in finished if t.state == TrialState.COMPLETE]
        if len(complete) < max(1, spec.n_startup_trials):
            return False
        others = [float(t.user_attrs["curve"][str(step)]) for t in finished
                  if str(step) in t.user_attrs.get("curve", {})]
        if len(others) < max(1, spec.n_min_trials):
            return False
        median = statistics.median(others)
        if self.space.objective.direction_literal == "maximize":
            return max(self.curve.values()) < median
        return min(self.curve.values()) > median

    def compute_saved_s(self, last_step: int | None, wall_s: float) -> float | None:
        """Remaining steps x mean step time (measured by the trainer, else wall time per step)."""
        if self.total_steps is None or last_step is None:
            return None
        left = max(0, self.total_steps - last_step)
        if self.step_times:
            per = sum(self.step_times) / len(self.step_times)
        else:
            per = wall_s / max(1, last_step)
        return round(left * per, 3)

