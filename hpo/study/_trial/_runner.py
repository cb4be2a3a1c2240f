"""Running one trial: its trainer subprocess on devices of the pool, pruning and reward-aware early stopping (the
:class:`~hpo.study._watch.Watch`), checkpoint retention, and the state and values to tell; what each way a trial
ends is recorded as (its outcome, ``stop_reason`` / ``fail_reason``) is :mod:`hpo.study._trial._outcome`'s.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import Trial, TrialState

from hpo.analysis import Diagnoser
from hpo.backends import Attempt, Backend, Launch, ResumePointLike, backend_of
from hpo.execution import (
    DevicePool,
    RunResult,
    TrialExecutor,
    TrialProcess,
    TrialRun,
    knob_problem,
    max_dropped_rows,
)
from hpo.experiment import Space, SpaceError
from hpo.record import (
    ATTR_PROMOTE_STEPS,
    ATTR_RETRY_HISTORY,
    ATTR_RETRY_OF,
    ATTR_TIE_OF,
    ATTR_TIE_SEED,
    is_failed,
    is_promoted,
    is_tie_run,
    runs_steps,
)
from hpo.storages import STORAGE_ERRORS
from hpo.study._checkpoints import clean_after
from hpo.study._confirm import (
    ATTR_BASELINE,
    ATTR_CONFIRM_OF,
    ATTR_CONFIRM_SEED,
    CONTROL_OF,
    FIRST_ROLLOUT,
    confirm_overrides,
    first_rollout,
    first_rollout_env,
    heldout_metric_of,
    is_confirm,
    seed_overrides,
)
from hpo.study._continuation import continue_setup, held_checkpoints, promoted_setup, trim_promoted
from hpo.study._errors import DriverError, TrialFailed, TrialInterrupted, TrialLost, TrialRetried
from hpo.study._population import segment_overrides
from hpo.study._progress import Progress
from hpo.study._ray_trials import admit, job_for, ray_job
from hpo.study._recovery import fail_and_retry, queue_retry
from hpo.study._slots import is_finished
from hpo.study._trial._outcome import HOST_RETRIES, fail_trial, frozen_trial, host_failure, outcome, run_attrs
from hpo.study._trial_files import fresh_trial_dir, launch_extra, trial_env, write_trial_files
from hpo.study._watch import Watch

# errors of the study's database (not of the disk or a launch): they go to the caller as they are
DB_ERRORS: tuple[type[BaseException], ...] = (
    *(e for e in STORAGE_ERRORS if e is not OSError), optuna.exceptions.StorageInternalError)


class _TrialStop(threading.Event):
    """Set when the driver stops or the trial is lost: what a trial process and a device wait watch."""

    def __init__(self, stop: threading.Event, lost: threading.Event) -> None:
        super().__init__()
        self._events = (stop, lost)

    def is_set(self) -> bool:
        return any(e.is_set() for e in self._events)

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            self._events[0].wait(0.05 if left is None else min(0.05, left))
        return True


def _suggest(trial: Trial, p: Any) -> Any:
    if p.type == "categorical":
        return trial.suggest_categorical(p.name, list(p.choices))
    if p.type == "int":
        return trial.suggest_int(p.name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
    return trial.suggest_float(p.name, p.low, p.high, step=p.step, log=p.log)


@dataclasses.dataclass
class _TrialSetup:
    """What the study decides for one attempt of a trial before it waits for devices: the sampled values, the retry
    chain, a confirmation's or a PBT segment's own overrides (the backend then plans the launch on the devices:
    :meth:`~hpo.backends.Backend.plan`)."""

    values: dict[str, Any]  # the sampled parameters, by name
    retry_of: int | None
    trial_dir: Path
    history: list[int]  # the retry chain's earlier trial numbers
    confirm_seed: Any
    extra: dict[str, Any]  # a confirmation run's seed (and baseline) overrides
    tail: list[str]  # a PBT segment's step range
    start: Path | None  # a PBT segment's start checkpoint
    stop_at: int | None = None  # a promoted target run's steps (study.fidelity.proxy)
    continues: ResumePointLike | None = None  # a confirmation run's start: its promoted run's checkpoint
    tie: bool = False  # a tied proxy setting's run on another seed (study.fidelity.proxy.tie_seeds): never pruned


class TrialRunner:
    """Runs one asked trial to the state and values its driver tells (see the module docstring)."""

    def __init__(self, space: Space, study: optuna.Study, trials_dir: Path, reporter: Progress,
                 stop_event: threading.Event, cwd: str, identity: dict[str, Any], pool: DevicePool,
                 over_budget: Callable[[], bool] | None = None) -> None:
        self.space = space
        self.study = study
        self.trials_dir = trials_dir
        self.reporter = reporter
        self.stop_event = stop_event
        self.cwd = cwd
        self.identity = identity
        self.pool = pool
        self.over_budget = over_budget  # study.budget: a search trial stops when it leaves no room (the driver's)
        self.backend: Backend = backend_of(space)
        problem = knob_problem()  # the driver's knobs of a trial's logs: a bad value is one line before any trial
        if problem is not None:
            raise SpaceError(problem)
        self.dropped_limit = max_dropped_rows()

    def run(self, trial: Trial, lost: threading.Event) -> tuple[TrialState, list[float] | None]:
        """The trial's state and values, its checkpoints cleaned. TrialInterrupted, TrialLost and the database's
        errors go to the caller; any other error abandons the trial (DriverError)."""
        state, values = TrialState.COMPLETE, None
        try:
            out = self.objective(trial, lost)
            values = list(out) if isinstance(out, list) else [out]
        except optuna.TrialPruned:
            state = TrialState.PRUNED
        except TrialFailed:
            state = TrialState.FAIL
        except Exception as err:  # noqa: BLE001
            if isinstance(err, (TrialInterrupted, TrialLost, TrialRetried, UpdateFinishedTrialError, *DB_ERRORS)):
                raise
            self._abandon(trial, err)  # a launch or disk error (not the trial's doing): queued, never RUNNING
        self._clean_checkpoints(trial, state, values)
        return state, values

    def objective(self, trial: Trial, lost: threading.Event) -> float | list[float]:
        """Run one trial's process to its outcome: values to tell, or TrialPruned / TrialFailed /
        TrialInterrupted / TrialLost (``lost``: another driver finished this trial, taking us for dead)."""
        setup = self._set_up(trial)
        self.reporter.trial_started(trial.number, setup.values, setup.retry_of)
        why = self.backend.infeasible(self.space, setup.values) if setup.values else None
        if why is not None:  # values the trainer refuses together (each is valid with others): never launched
            return fail_trial(trial, self.space, "infeasible", f"the trainer refuses these values together: {why}", "")
        waited = time.monotonic()
        ray = self.space.trial.executor == "ray"  # devices: the cluster's (admission), not this host's pool
        devices = [] if ray else self.pool.acquire(_TrialStop(self.stop_event, lost))
        job = job_for(self.study, trial.number, setup.history, self.space.trial) if ray else None
        if job is not None and not admit(self.study, trial, self.space.trial, _TrialStop(self.stop_event, lost),
                                         job[1], self.reporter.note):
            self._interrupt(trial)
        entered = time.monotonic()
        rollout_env, rollout_source = first_rollout_env(self.study, frozen_trial(self.study, trial.number),
                                                        self.space.study.kind, self.trials_dir, setup.trial_dir)
        try:
            launch = self.backend.plan(Attempt(
                space=self.space, study=self.study.study_name, number=trial.number, trial_dir=setup.trial_dir,
                trials_dir=self.trials_dir, history=tuple(setup.history), values=setup.values, cwd=self.cwd,
                env={**trial_env(self.space, self.study.study_name, trial.number, self.identity, devices, setup.extra),
                     **rollout_env},
                devices=len(devices), ray_job=job is not None, extra=launch_extra(setup.extra), tail=tuple(setup.tail),
                start=setup.start if setup.continues is None else setup.continues.checkpoint))  # secrets of
            # setup.extra: in the environment, references on argv; a continuation starts at its promoted run's step
            if setup.continues is not None and launch.resume is None:  # its own retry chain's checkpoint wins
                launch = dataclasses.replace(launch, resume=setup.continues)  # the promoted run's curve, replayed
        except BaseException:
            self.pool.release(devices)
            raise
        for line in launch.notes:  # checkpoints of the retry chain passed over: a file of theirs was refused
            self.reporter.note(f"trial {trial.number}: {line}")
        memory = self.backend.memory if self.space.trial.preflight and not ray else None
        pred = None if memory is None else memory.predict(self.space, launch.config, devices)
        if pred is not None and not pred.fits:
            self.pool.release(devices)
            (setup.trial_dir / "memory_estimate.txt").write_text(pred.table + "\n")
            trial.set_user_attr("predicted_memory_gb", round(pred.total / 2**30, 4))
            trial.set_user_attr("memory_budget_gb", round(pred.budget / 2**30, 4))
            trial.set_user_attr("wall_time_s", round(time.monotonic() - entered, 3))
            return fail_trial(trial, self.space, "predicted_oom", f"predicted {pred.problem} ({pred.budget_source})",
                              "")
        try:
            result, proc, watch = self._launch(trial, setup, launch, lost, job, gpus=len(devices))
        finally:
            self.pool.release(devices)
            self.backend.cleanup(setup.trial_dir, len(setup.history))
        if lost.is_set():
            raise TrialLost(f"trial {trial.number} was finished by another driver while it ran here")
        overhead = None if proc.spawned_at is None else proc.spawned_at - entered
        for k, v in run_attrs(result, watch, overhead, entered - waited).items():
            trial.set_user_attr(k, v)
        if (rollout := first_rollout(setup.trial_dir, rollout_source, bool(rollout_env))) is not None:
            trial.set_user_attr(FIRST_ROLLOUT, rollout)  # what the run did with its first rollout (the strict check)
        for line in result.log_lines():
            self.reporter.note(f"trial {trial.number}: {line}")
        if result.stop == "interrupted":
            self._interrupt(trial)
        if result.node_lost:  # the cluster's doing, not the trial's: FAIL, retried
            queue_retry(self.study, frozen_trial(self.study, trial.number), max_retry=self.space.study.max_retry)
            fail_trial(trial, dataclasses.replace(self.space, trial=dataclasses.replace(
                self.space.trial, on_failure="worst")), "killed", "the Ray job lost its node", result.stderr_tail)
            raise TrialRetried(f"trial {trial.number}: its Ray job lost its node; retry queued")
        host = host_failure(result, self.backend.host_failure_lines)
        if host is not None:  # a busy host, not the setting: retried while retries last, then a crash
            error = f"the host could not start the trainer in time: {host}"
            limit = self.space.study.max_retry
            if not queue_retry(self.study, frozen_trial(self.study, trial.number),
                               max_retry=HOST_RETRIES if limit is None else limit):
                return fail_trial(trial, self.space, "crash", f"{error} (no retry left: study.max_retry)",
                                  result.stderr_tail)
            fail_trial(trial, dataclasses.replace(self.space, trial=dataclasses.replace(
                self.space.trial, on_failure="worst")), "host", error, result.stderr_tail)  # as a lost node's
            raise TrialRetried(f"trial {trial.number}: the host could not start the trainer in time ({host}); "
                               "a busy host, not the setting: retry queued")
        return outcome(trial, self.space, result, watch, setup.trial_dir, self.dropped_limit)

    def _set_up(self, trial: Trial) -> _TrialSetup:
        """Sample the parameters, make the trial directory, and record what the attempt will run."""
        system = frozen_trial(self.study, trial.number).system_attrs
        retry_of = system.get(ATTR_RETRY_OF)
        baseline = bool(system.get(ATTR_BASELINE))  # study.baseline's overrides instead of tuned values
        values = {} if baseline else {p.name: _suggest(trial, p) for p in self.space.params}
        if self.stop_event.is_set():
            self._interrupt(trial)
        trial_dir = fresh_trial_dir(self.trials_dir, self.study.study_name, trial.number, self.identity)
        history = list(system.get(ATTR_RETRY_HISTORY, []))
        confirm_seed = system.get(ATTR_CONFIRM_SEED)
        if confirm_seed is not None:  # a confirmation run: the top trial's values with a fresh seed
            of = system.get(ATTR_CONFIRM_OF)
            trial.set_user_attr("confirm_of", "control" if of == CONTROL_OF else "baseline" if baseline else of)
            trial.set_user_attr("confirm_seed", confirm_seed)
        tail: list[str] = []
        resume_from = None
        if runs_steps(system):  # pbt: its step range and start checkpoint (hpo.study._population)
            tail, resume_from = segment_overrides(self.space, system, trial)
        extra = {} if confirm_seed is None else confirm_overrides(self.space, int(confirm_seed), baseline)
        tie_seed = system.get(ATTR_TIE_SEED)  # a tied proxy setting's run on another seed: every seed key to it
        tie = ATTR_TIE_OF in system and confirm_seed is None
        if tie and isinstance(tie_seed, int) and not isinstance(tie_seed, bool):
            extra = dict(seed_overrides(self.space, tie_seed))
        trial.set_user_attr("trial_dir", str(trial_dir))
        if retry_of is not None:
            trial.set_user_attr("retry_of", retry_of)
        stop_at = system.get(ATTR_PROMOTE_STEPS)  # a promoted setting's short run on the target
        stop_at = stop_at if isinstance(stop_at, int) and not isinstance(stop_at, bool) else None
        if stop_at is not None:  # on the race's first seed, saving where it stops (hpo.study._continuation)
            extra, save = promoted_setup(trial, self.space, self.backend, stop_at)
            tail += save
        continues = None if confirm_seed is None else continue_setup(
            trial, self.study, self.trials_dir, self.backend, system, self.reporter.note)  # a promoted run's checkpoint
        return _TrialSetup(values, retry_of, trial_dir, history, confirm_seed, dict(extra), tail, resume_from, stop_at,
                           continues, tie)

    def _launch(self, trial: Trial, setup: _TrialSetup, launch: Launch, lost: threading.Event,
                job: tuple[str, bool] | None = None, gpus: int = 0) -> tuple[RunResult, TrialExecutor, Watch]:
        """Write the trial's files and run the backend's planned ``launch``, a :class:`Watch` reading its metrics."""
        spec, total, point = self.space.trial, launch.config.total_steps, launch.resume
        argv, env = launch.argv, launch.env
        write_trial_files(self.space, self.cwd, setup.trial_dir, argv, env, launch.config, setup.values)
        mem = [0.0]

        def on_eval(step: int, value: float) -> None:
            self.reporter.trial_eval(trial.number, step, total, value, mem[0])

        def on_tick(step: int | None, gb: float) -> None:
            mem[0] = gb
            self.reporter.trial_tick(trial.number, step, total, gb)

        diag = self.space.diagnosis
        diagnoser = Diagnoser(diag, self.space.objective.primary_metric,
                              self.space.objective.direction_literal == "maximize",
                              self.backend.metrics,  # GPU labels: a trial handed GPUs (a Ray job: real ones)
                              gpu=spec.ray.device != "cpu" and spec.ray.num_gpus > 0 if job else gpus > 0,
                              ) if diag.enabled else None
        confirming = setup.confirm_seed is not None  # full budget unless study.confirm.early_stopping
        tie = setup.tie  # evidence for the promotion: never pruned, never stopped by the budget
        speed = self.space.study.kind == "throughput"
        watch = Watch(trial, self.space, total, on_eval, diagnoser,
                      prune=not confirming and not tie and setup.stop_at is None,
                      early_stop=not confirming or self.space.study.confirm.early_stopping,
                      test_metric=heldout_metric_of(self.space) if confirming and not speed else None,
                      warmup_steps=self.space.study.throughput.warmup_steps if speed else None,
                      math_metrics=(self.space.study.throughput.math_metrics
                                    or (self.backend.speed.math_metrics if self.backend.speed else ()))
                      if speed else (), step_time=self.backend.metrics.step_time)
        if point is not None:  # the earlier attempts' curve up to the checkpoint: aggregate, pruner, diagnosis
            replayed = point.records()
            for step, data in replayed:
                watch(step, data)  # its decisions are the live run's to make again at its next evaluation
            trial.set_user_attr("resumed_from_step", point.step)
            trial.set_user_attr("replayed_steps", len(replayed))
        watch.over_budget = None if confirming or tie else self.over_budget  # the live run's evaluations only
        watch.stop_at = setup.stop_at
        run = TrialRun(argv, env, setup.trial_dir, launch.metrics, cwd=self.cwd, timeout_s=spec.timeout_s,
                       memory_limit_gb=spec.memory_limit_gb, on_metrics=watch, on_tick=on_tick,
                       stop_event=_TrialStop(self.stop_event, lost),
                       dropped_row_patterns=self.backend.dropped_row_patterns)
        proc: TrialExecutor = (
            ray_job(self.study, trial, spec, job, run, hold=self.backend.ray_hold, note=self.reporter.note)
            if job is not None else TrialProcess(run, private_tmp=launch.private_tmp))
        return proc.run(), proc, watch

    def _abandon(self, trial: Trial, err: Exception) -> None:
        """The driver could not run this trial (its launch failed, the disk is full, ...): like an interrupt, its
        parameters are queued for a later driver and it ends FAIL; then the driver stops with one line."""
        why = (str(err).strip().splitlines() or [type(err).__name__])[0]
        if isinstance(err, OSError) and err.strerror:
            why = f"{err.strerror}" + (f": {err.filename}" if err.filename else "")
        try:  # a trial told meanwhile keeps its result and is not run again
            trial.set_user_attr("stop_reason", "driver_error")
            trial.set_user_attr("error", why[:4000])
            fail_and_retry(self.study, frozen_trial(self.study, trial.number), self.space.study.max_retry)
        except Exception:  # noqa: BLE001 - the storage may be the problem; recovery finds the trial later
            pass
        raise DriverError(f"trial {trial.number} could not be run: {type(err).__name__}: {why}") from err

    def _interrupt(self, trial: Trial) -> None:
        """Stopped by the user: the same parameters are queued first (so the slot stays held), then FAIL."""
        queue_retry(self.study, frozen_trial(self.study, trial.number), max_retry=None)
        trial.set_user_attr("interrupted", True)
        trial.set_user_attr("stop_reason", "interrupted")
        raise TrialInterrupted(f"trial {trial.number} interrupted")

    def _clean_checkpoints(self, trial: Trial, state: TrialState, values: list[float] | None) -> None:
        """A finished trial can no longer be resumed: its checkpoints (and its retry chain's) go, unless it is among
        the ``trial.keep_checkpoints`` best (:mod:`hpo.study._checkpoints`). Recorded before the trial is told."""
        if self.space.study.strategy == "pbt":  # reachable checkpoints are kept: hpo.study._population
            return
        keep = self.space.trial.keep_checkpoints
        me = frozen_trial(self.study, trial.number)
        value = values[0] if state == TrialState.COMPLETE and values and not is_confirm(me) and not is_failed(me) \
            and not is_tie_run(me) \
            else None  # a failed trial's value (a timed-out throughput trial's is finite) keeps nothing
        finished = [t for t in self.study.get_trials(deepcopy=False) if is_finished(t)]
        ray = self.space.trial.ray  # a Ray-job trial's checkpoints in trial.ray.shared_dir (docs/ray.md)
        shared = Path(ray.shared_dir).expanduser() / self.study.study_name \
            if self.space.trial.executor == "ray" and ray.shared_dir else None
        if is_promoted(me):  # continued by the race from where it stopped (hpo.study._continuation)
            trim_promoted(me, self.trials_dir, self.backend)
        held, released = held_checkpoints(self.study, self.space, self.study.get_trials(deepcopy=False), trial.number)
        size_gb, kept, _ = clean_after(self.study, me, value, self.trials_dir, keep, finished, shared, held,
                                       released)  # a promoted run's checkpoint stays while the race may continue it
        if size_gb > 0:
            trial.set_user_attr("checkpoint_gb", round(size_gb, 6))
            trial.set_user_attr("checkpoint_kept", kept)
