"""How a trial that ran (or was refused before its launch) is recorded: its run attrs, and the values to tell or
TrialPruned / TrialFailed for each way it ended (the outcome list below; :class:`hpo.study._trial.TrialRunner` runs
the trial and calls these).

Trial outcomes (user attrs of every trial: ``peak_memory_gb``, ``wall_time_s``, ``exit_code``,
``first_metric_s``, ``last_step``, ``trial_dir``, ``worker``):

* ran to the end            -> COMPLETE, value = the objective's aggregate of its evaluations (``objective.aggregate``:
  the last one by default)
* ``stop_reason=converged|collapsed`` -> COMPLETE, value = the aggregate so far, ``compute_saved_s``
  (early stopping: the spread metric stayed small with the objective above / below ``min_value``)
* ``stop_reason=plateau`` -> the same: the objective stopped improving (``early_stopping.plateau_evals``)
* ``stop_reason=promote_steps`` -> the same: a proxy setting's target run reached its short budget
  (``study.fidelity.proxy.promote_steps``; never pruned)
* ``stop_reason=collapsed:<label>`` -> the same, stopped by the diagnosis (:mod:`hpo.analysis._diagnosis`: ``nan``,
  ``entropy_collapse``, ``kl_blowup``); with no finite evaluation yet, the worst value. Every trial also gets
  ``diagnosis`` (one label), ``diagnosis_labels`` and ``diagnosis_evidence``.
* ``stop_reason=pruned``    -> PRUNED (Optuna stores the last reported value), ``compute_saved_s``
* ``stop_reason=budget``    -> the same: ``study.budget`` left the search no room for the trial's next evaluation
  interval (:func:`hpo.study._confirm.search_over_budget`)
* ``fail_reason=timeout`` of a throughput search trial -> COMPLETE, slower than the slowest finished trial (or at its
  partial rate, ``timeout_rate``, where slower still; before any trial finished, the slowest valid measurement): a
  slow setting, not a broken one; ranked below every finished trial by the reports (with ``on_failure: fail``, FAIL
  as below)
* ``fail_reason=oom|timeout|bad_metrics|killed|crash`` -> COMPLETE with the worst value (``-inf``/``+inf``), or FAIL
  with ``on_failure: fail``; ``stderr_tail`` (and ``error``) say why. ``oom`` only when it is one (the
  driver's cap, a final MemoryError / CUDA OOM, or a kernel OOM kill confirmed); another signal death is
  ``killed`` (see :func:`hpo.execution._runner.classify_exit`); ``bad_metrics`` when the metrics path is not a regular
  file (a FIFO, a device). A bad metrics line is never a failure: it is skipped and counted (``metrics_bad_lines``)
* ``fail_reason=dropped_rows`` -> the same: the trainer said it dropped more rows of its data than
  ``$VERL_HPO_MAX_DROPPED_ROWS`` (default 10; ``Backend.dropped_row_patterns``), ``error`` naming the first one's
  exception. A trial whose trainer dropped any gets ``dropped_rows`` (the count) and ``dropped_rows_error``; a log over
  its cap (``$VERL_HPO_LOG_CAP_MIB``) ``logs_cut`` (log -> bytes cut); the driver says both in a line.
* interrupted (Ctrl-C, SIGTERM, SIGHUP, driver death) -> FAIL without a recorded result; a WAITING copy with
  the same parameters is queued, so ``resume`` (or any worker) runs it first. So is a run that failed because the
  host could not start the trainer in time (``fail_reason=host``, :attr:`~hpo.backends.Backend.host_failure_lines`:
  Ray's node on a busy host), up to ``study.max_retry`` (3 where unlimited); past it, a crash like any other. Trials
  of a dead driver are found by every other driver of the study (:mod:`hpo.study._recovery`: a dead pid where pids
  are comparable, else a stale heartbeat).
* ``fail_reason=infeasible`` -> not launched: the trainer refuses the sampled values together
  (:meth:`~hpo.backends.Backend.infeasible`: a micro-batch larger than the mini-batch it divides; each value is valid
  with other values of the space, or the space was refused at load); recorded like a failure (the worst value, so
  the sampler learns to avoid the region), ``error`` the trainer's reason; never counted as a crash
* ``fail_reason=predicted_oom`` -> not launched: the memory estimate does not fit the trial's budget
  (:mod:`hpo.backends._preflight`); recorded like a failure, with ``predicted_memory_gb`` and ``memory_budget_gb``
* ``stop_reason=surplus`` -> FAIL, never run: several drivers asked at once and the target was taken
  (:mod:`hpo.study._driver`).
* ``stop_reason=driver_error`` -> FAIL, queued again: the driver could not run the trial (a launch or disk error).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from hpo.execution import RunResult, max_dropped_rows, read_tail
from hpo.experiment import Scored, Space, speed_value_ok, speed_value_problem
from hpo.record import is_confirm, is_failed
from hpo.study._errors import TrialFailed
from hpo.study._watch import Watch

# a stop decided by the Watch (or ``collapsed:<label>``)
STOPS = ("pruned", "budget", "converged", "collapsed", "plateau", "promote_steps")


def frozen_trial(study: optuna.Study, number: int) -> FrozenTrial:
    """A copy of trial ``number`` (one trial copied, not the study: a deep copy of every trial grows with
    trials x parameters)."""
    return copy.deepcopy(next(t for t in study.get_trials(deepcopy=False) if t.number == number))


def run_attrs(result: RunResult, watch: Watch, launch_overhead_s: float | None,
              device_wait_s: float) -> dict[str, Any]:
    """The user attrs of a trial whose process ran (whatever its outcome)."""
    attrs: dict[str, Any] = {
        "peak_memory_gb": round(result.peak_memory_gb, 4), "wall_time_s": round(result.wall_time_s, 3),
        "exit_code": result.exit_code, "last_step": result.last_step, "total_steps": watch.total_steps,
        "first_metric_s": None if result.first_metric_s is None else round(result.first_metric_s, 3),
        # driver time between a device being free and the trainer being spawned (files, config)
        "launch_overhead_s": None if launch_overhead_s is None else round(launch_overhead_s, 4),
        "device_wait_s": round(device_wait_s, 3),
        # how the memory cap and peak were taken: cgroup-v2 | cgroup-v1 (kernel-enforced) | poll (VmHWM)
        "memory_mechanism": result.memory_mechanism,
        "cgroup_peak_gb": None if result.cgroup_peak_gb is None else round(result.cgroup_peak_gb, 4),
        "leftovers_killed": result.leftovers_killed,
    }
    if result.host_busy is not None:  # other processes' share of the host's CPU while it ran (hpo.execution)
        attrs.update(host_busy=round(result.host_busy, 4), trial_cpu_s=round(result.trial_cpu_s or 0.0, 3))
    if watch.test_value is not None:  # a confirmation run's held-out value (hpo.study._confirm)
        attrs.update(test_value=watch.test_value, test_metric=watch.test_metric)
    if watch.warmup_steps is not None:  # a throughput trial: its measured steps' spread, its first step's math
        attrs.update(watch.throughput_spread())
        if watch.first_step is not None:
            attrs["first_step"] = watch.first_step
    if result.dropped_rows:  # rows the trainer went on without (Backend.dropped_row_patterns)
        attrs.update(dropped_rows=result.dropped_rows, dropped_rows_error=result.dropped_rows_error)
    if result.logs_cut:  # log -> bytes cut from its middle ($VERL_HPO_LOG_CAP_MIB)
        attrs["logs_cut"] = dict(result.logs_cut)
    if result.metrics_bad_lines:  # skipped: not JSON, too long, no step in 0..2^31, ...
        attrs["metrics_bad_lines"] = result.metrics_bad_lines
    if watch.diagnoser is not None:
        attrs.update(diagnosis=watch.diagnoser.label, diagnosis_labels=list(watch.diagnoser.labels),
                     diagnosis_evidence=watch.diagnoser.evidence())
        health = watch.diagnoser.health()  # speed health: label-only, with the knob to look at
        attrs.update(health=list(health), health_evidence=health)
    return attrs


def outcome(trial: Trial, space: Space, result: RunResult, watch: Watch, trial_dir: Path,
            dropped_limit: int | None = None) -> float | list[float]:
    """The values to tell for a process that was not interrupted, or TrialPruned / TrialFailed (see the module
    docstring). ``dropped_limit``: the rows its trainer may drop (None: $VERL_HPO_MAX_DROPPED_ROWS)."""
    dropped = result.dropped_error(max_dropped_rows() if dropped_limit is None else dropped_limit)
    if result.stop is None and watch.stopped_at is not None:  # the trainer ended before its promoted run's stop
        result = dataclasses.replace(result, stop="promote_steps")
    if result.stop is not None and (result.stop in STOPS or result.stop.startswith("collapsed:")):
        trial.set_user_attr("stop_reason", result.stop)
        saved = watch.compute_saved_s(result.last_step, result.wall_time_s)
        if saved is not None:
            trial.set_user_attr("compute_saved_s", saved)
        if result.stop in ("pruned", "budget"):
            record_scores(trial, space, watch.scored)
            raise optuna.TrialPruned(f"{result.stop} at step {result.last_step}")
        if dropped is not None:  # its value was computed without the rows
            return fail_trial(trial, space, "dropped_rows", dropped, read_tail(trial_dir / "stderr.log"))
        if watch.scored is None:  # collapsed before any finite evaluation: nothing to score but the worst
            record_scores(trial, space, None)
            if space.trial.on_failure == "fail":
                raise TrialFailed(f"trial {trial.number}: {result.stop}")
            return space.objective.worst
        return _scored_values(trial, space, watch)
    failure, error = result.failure, result.metrics_error
    if failure is None and watch.scored is None:
        failure = "crash"
        names = ", ".join(space.objective.metrics)
        error = (f"exited {result.exit_code} without finite values of {names}" if watch.value is None
                 else f"an objective metric ({names}) is NaN or infinite")
    if failure is None and dropped is not None:
        failure, error = "dropped_rows", dropped
    if failure is None and watch.warmup_steps is not None and watch.scored is not None:  # a throughput: in range
        error = speed_value_problem(space.objective.primary_metric, [h[0] for h in watch.history],
                                    watch.scored.values[0])
        failure = None if error is None else "bad_metrics"
    if failure is None:
        return _scored_values(trial, space, watch)
    if failure == "timeout" and watch.warmup_steps is not None and space.trial.on_failure == "worst" \
            and not is_confirm(frozen_trial(trial.study, trial.number)):  # a slow setting, not a crash
        return _timed_out_speed(trial, space, watch, read_tail(trial_dir / "stderr.log"))
    return fail_trial(trial, space, failure, error, read_tail(trial_dir / "stderr.log"))


def _timed_out_speed(trial: Trial, space: Space, watch: Watch, stderr_tail: str) -> float | list[float]:
    """A throughput search trial stopped at ``trial.timeout_s``: recorded ``fail_reason=timeout`` with a value slower
    than the slowest finished search trial, or its partial rate (user attr ``timeout_rate``) when slower still
    (:meth:`Watch.timed_out_values`), so the sampler learns it is slow, not broken; reports rank it below every
    finished trial."""
    done = [t.values[0] for t in trial.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if not is_confirm(t) and not is_failed(t) and t.values and speed_value_ok(t.values[0])]
    slowest = None if not done else (min if space.objective.direction_literal == "maximize" else max)(done)
    values, partial = watch.timed_out_values(slowest)
    trial.set_user_attr("fail_reason", "timeout")
    trial.set_user_attr("timeout_rate", partial)
    rate = "no measured step" if partial is None else f"{partial:.6g} over its measured step(s)"
    trial.set_user_attr("error", f"stopped at trial.timeout_s={space.trial.timeout_s:g}: told {values[0]:.6g} "
                        f"({rate}; the slowest finished trial: {'none yet' if slowest is None else f'{slowest:.6g}'})"
                        ", ranked below every finished trial")
    if stderr_tail:
        trial.set_user_attr("stderr_tail", stderr_tail[-4000:])
    record_scores(trial, space, None)
    return values if space.objective.multi else values[0]


def record_scores(trial: Trial, space: Space, scored: Scored | None) -> None:
    """Weighted-score parts as ``score/<term>`` user attrs; constraint violations (+inf when unknown)."""
    if scored is not None:
        for k, v in scored.parts.items():
            trial.set_user_attr(k, v)
    for name, v in space.objective.constraint_values(None if scored is None else scored.data).items():
        trial.set_constraint(name, v)


def _scored_values(trial: Trial, space: Space, watch: Watch) -> float | list[float]:
    assert watch.scored is not None
    record_scores(trial, space, watch.scored)
    values = watch.scored.values
    return values if space.objective.multi else values[0]


# retries of a trial the host could not start (Backend.host_failure_lines) where study.max_retry is unlimited
HOST_RETRIES = 3


def host_failure(result: RunResult, lines: Sequence[str]) -> str | None:
    """The trainer's line that says this host could not start it (one of ``lines``, a substring of the failed run's
    last exception line or the end of its stderr), or None: it ran, was stopped by the driver, or failed otherwise."""
    if not lines or result.exit_code in (0, None) or result.stop is not None or result.kernel_oom:
        return None
    for text in (result.final_exception or "", result.stderr_tail[-4000:]):
        for line in text.splitlines():
            if any(s in line for s in lines):
                return line.strip()[:300]
    return None


def fail_trial(trial: Trial, space: Space, reason: str, error: str | None, stderr_tail: str) -> float | list[float]:
    """Record why the trial failed: the worst value to tell, or TrialFailed with ``on_failure: fail``."""
    trial.set_user_attr("fail_reason", reason)
    if error:
        trial.set_user_attr("error", error)
    if stderr_tail:
        trial.set_user_attr("stderr_tail", stderr_tail[-4000:])
    record_scores(trial, space, None)
    if space.trial.on_failure == "fail":
        raise TrialFailed(f"trial {trial.number}: {reason}")
    return space.objective.worst
