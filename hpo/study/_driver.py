"""The Optuna loop: one trainer subprocess per trial, pruning, reward-aware early stopping, failure mapping,
interrupt handling and resume.

Trial outcomes (user attrs of every trial: ``peak_memory_gb``, ``wall_time_s``, ``exit_code``,
``first_metric_s``, ``last_step``, ``trial_dir``, ``worker``):

* ran to the end            -> COMPLETE, value = the objective's aggregate of its evaluations (``objective.aggregate``:
  the last one by default)
* ``stop_reason=converged|collapsed`` -> COMPLETE, value = the aggregate so far, ``compute_saved_s``
  (early stopping: the spread metric stayed small with the objective above / below ``min_value``)
* ``stop_reason=plateau`` -> the same: the objective stopped improving (``early_stopping.plateau_evals``)
* ``stop_reason=collapsed:<label>`` -> the same, stopped by the diagnosis (:mod:`hpo.analysis._diagnosis`: ``nan``,
  ``entropy_collapse``, ``kl_blowup``); with no finite evaluation yet, the worst value. Every trial also gets
  ``diagnosis`` (one label), ``diagnosis_labels`` and ``diagnosis_evidence``.
* ``stop_reason=pruned``    -> PRUNED (Optuna stores the last reported value), ``compute_saved_s``
* ``fail_reason=oom|timeout|bad_metrics|killed|crash`` -> COMPLETE with the worst value (``-inf``/``+inf``), or FAIL
  with ``on_failure: fail``; ``stderr_tail`` (and ``error``) say why. ``oom`` only when it is one (the
  driver's cap, a final MemoryError / CUDA OOM, or a kernel OOM kill confirmed); another signal death is
  ``killed`` (see :func:`hpo.execution._runner.classify_exit`); ``bad_metrics`` when the metrics path is not a regular
  file (a FIFO, a device). A bad metrics line is never a failure: it is skipped and counted (``metrics_bad_lines``)
* interrupted (Ctrl-C, SIGTERM, SIGHUP, driver death) -> FAIL without a recorded result; a WAITING copy with
  the same parameters is queued, so ``resume`` (or any worker) runs it first. Trials of a dead driver are
  found by every other driver of the study (:mod:`hpo.study._recovery`: a dead pid where pids are comparable,
  else a stale heartbeat).
* ``fail_reason=predicted_oom`` -> not launched: the memory estimate does not fit the trial's budget
  (:mod:`hpo.backends._preflight`); recorded like a failure, with ``predicted_memory_gb`` and ``memory_budget_gb``
* ``stop_reason=surplus`` -> FAIL, never run: several drivers asked at once and the target was taken.

"Finished" trials, which count towards ``study.n_trials``: COMPLETE, PRUNED, and FAIL with a recorded result
(``on_failure: fail``). Several drivers (``search``, ``resume``, ``worker`` on any host) may run one study.

Confirmation trials (``verl-hpo confirm``, :mod:`hpo.study._confirm`) are queued copies of a top trial's parameters
with a fresh seed (system attrs ``hpo:confirm_of`` / ``hpo:confirm_seed``, shown as user attrs ``confirm_of`` /
``confirm_seed``). Any driver of the study that picks one up runs it to the end (never pruned), and they never
count towards ``study.n_trials``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shlex
import shutil
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, Trial, TrialState

from hpo.analysis._diagnosis import Diagnoser
from hpo.backends._preflight import predict
from hpo.backends.verl._launch import (
    default_python,
    resume_point,
    scratch_dir,
    verl_argv,
    verl_cleanup,
    verl_env,
    verl_metrics_path,
    verl_overrides,
)
from hpo.execution._devices import DevicePool, detect_devices
from hpo.execution._identity import driver_identity
from hpo.execution._runner import ENV_DRIVER, ENV_STUDY, ENV_TRIAL, TrialProcess, is_finite, read_tail, sweep_orphans
from hpo.experiment._objective import Scored
from hpo.experiment._space import (
    EarlyStopping,
    PrunerSpec,
    SamplerSpec,
    Space,
    SpaceError,
    TrialSpec,
    format_value,
    space_from_stored,
)
from hpo.experiment._trust import experiment_digest
from hpo.study._checkpoints import TRIAL_MARKER, clean_after
from hpo.study._confirm import ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED, is_confirm, seed_overrides
from hpo.study._progress import Progress
from hpo.study._recovery import (
    ATTR_HEARTBEAT,
    ATTR_RECOVERING,
    ATTR_RESULT,
    Heartbeat,
    finish,
    queue_retry,
    record_result,
    recover_stale_trials,
)
from hpo.study._storage import (
    STORAGE_ERRORS,
    StorageUnavailable,
    check_study_name,
    mask_url,
    open_storage,
    study_exists,
)

ATTR_SPACE = "hpo:space"
ATTR_SOURCE = "hpo:source"
ATTR_TARGET = "hpo:n_trials"
ATTR_DIGEST = "hpo:space_sha256"
# errors of the study's database (not of the disk or a launch): they go to the caller as they are
DB_ERRORS: tuple[type[BaseException], ...] = (
    *(e for e in STORAGE_ERRORS if e is not OSError), optuna.exceptions.StorageInternalError)
WAIT_S = 1.0  # poll period of a driver waiting for others' trials to finish or die
# TRIAL_MARKER (_checkpoints): written into each trial directory the driver creates; only those are ever removed


class TrialInterrupted(Exception):
    """The driver was asked to stop while this trial ran; it is queued again for resume."""


class TrialFailed(Exception):
    """A trial failed and ``on_failure: fail`` asks for state FAIL (caught by ``study.optimize``)."""


class DriverError(Exception):
    """A runtime problem that is not bad input (exit 1)."""


class TrialLost(Exception):
    """Another driver finished this driver's running trial (it took us for dead); we drop it and go on."""


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


# ----------------------------------------------------------------------------- devices
def resolve_devices(spec: TrialSpec, override: Sequence[str] | None = None, launching: bool = True) -> list[str]:
    """The devices trials may use (``--devices``, else ``trial.devices``, else detected); SpaceError when a
    trial needs more than there are."""
    devices = list(override) if override is not None else (
        list(spec.devices) if spec.devices is not None else detect_devices())
    if spec.is_verl and not devices and launching:
        raise SpaceError("trial.backend=verl needs a CUDA GPU per trial (verl 0.9.1 has no CPU platform; a trial "
                         "would hang until trial.timeout_s) and none is visible; check it here with verl-hpo validate")
    if devices and spec.gpus_per_trial > len(devices):
        raise SpaceError(f"trial.gpus_per_trial={spec.gpus_per_trial} but only {len(devices)} device(s) are "
                         f"available ({','.join(devices)})")
    return devices


# ----------------------------------------------------------------------------- Optuna objects
def sampler_seed(base: int | None, n_existing: int, joining: bool) -> int | None:
    """A new study: the base seed (reproducible). Resumed or joined: base + existing trials, and for a
    joining driver a hash of its identity too, so that drivers starting together draw different values."""
    if base is None:
        return None
    seed = base + n_existing
    if joining:
        ident = json.dumps(driver_identity(), sort_keys=True)
        seed += int(hashlib.sha256(ident.encode()).hexdigest()[:8], 16)
    return seed % 2**32


def make_sampler(spec: SamplerSpec, n_existing: int, joining: bool = False) -> optuna.samplers.BaseSampler:
    """Seeded by :func:`sampler_seed`. TPE imputes running trials' values (``constant_liar``; Optuna 5 makes
    it multivariate always), so parallel workers spread out instead of sampling the same point."""
    seed = sampler_seed(spec.seed, n_existing, joining)
    if spec.type == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if spec.type == "gp":  # imports torch (CPU) into the driver: only when asked for
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=spec.n_startup_trials)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=spec.n_startup_trials, constant_liar=True)


def make_pruner(spec: PrunerSpec) -> optuna.pruners.BasePruner:
    """The pruner of ``spec.type``, inside Optuna's PatientPruner when ``spec.patience`` is set. (The warm-up in
    evaluations, ``n_warmup_evals``, is applied by the driver before it asks any pruner.)"""
    inner = _base_pruner(spec)
    if spec.patience is not None and spec.type != "none":
        with warnings.catch_warnings():  # "experimental" since Optuna 2.8; stable in use
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.pruners.PatientPruner(inner, patience=spec.patience, min_delta=spec.min_delta)
    return inner


def _base_pruner(spec: PrunerSpec) -> optuna.pruners.BasePruner:
    if spec.type == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=spec.n_startup_trials,
                                           n_warmup_steps=spec.n_warmup_steps, interval_steps=spec.interval_steps)
    if spec.type == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=spec.min_resource,
                                              max_resource=spec.max_resource or "auto",
                                              reduction_factor=spec.reduction_factor)
    if spec.type == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=spec.min_resource,
                                                      reduction_factor=spec.reduction_factor)
    return optuna.pruners.NopPruner()


def is_finished(t: FrozenTrial) -> bool:
    """COMPLETE, PRUNED, or FAIL with a result its driver recorded (``on_failure: fail``); an interrupted or
    recovered trial (FAIL without a recorded result) is not finished: its retry is."""
    if is_confirm(t):
        return False  # confirmation runs never count towards the search's target
    if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    if t.state != TrialState.FAIL:
        return False
    return ATTR_RESULT in t.system_attrs or ("fail_reason" in t.user_attrs and ATTR_HEARTBEAT not in t.system_attrs)


def n_finished(study: optuna.Study) -> int:
    return sum(is_finished(t) for t in study.get_trials(deepcopy=False))


def position(t: FrozenTrial) -> int:
    """The place in the study's target a trial claims: its own number, or for a retry its first original's."""
    history = t.system_attrs.get("retry_history")
    return int(history[0]) if isinstance(history, list) and history else t.number


@dataclasses.dataclass
class Slots:
    """How the study's target of finished trials is claimed.

    Every trial that is finished, running, waiting, or failed with its retry pending (recovery marked it
    ``hpo:recovering``) holds its :func:`position`. A new trial is admitted when fewer than ``target``
    positions before its own number are held, so drivers that ask at the same moment agree on which of
    them is surplus; a retry inherits its original's position and is never surplus."""

    finished: int
    held: set[int]
    waiting: int

    @classmethod
    def count(cls, trials: Sequence[FrozenTrial], max_retry: int | None) -> Slots:
        retried = {t.system_attrs.get("failed_trial") for t in trials}
        held: set[int] = set()
        finished = waiting = 0
        for t in trials:
            if is_confirm(t):
                continue  # outside the search's target (see the module docstring)
            if is_finished(t):
                finished += 1
            elif t.state == TrialState.RUNNING:
                pass  # holds its position, like the rest
            elif t.state == TrialState.WAITING:
                waiting += 1
            elif not (t.state == TrialState.FAIL and ATTR_RECOVERING in t.system_attrs and t.number not in retried
                      and (max_retry is None or len(t.system_attrs.get("retry_history", [])) < max_retry)):
                continue
            held.add(position(t))
        return cls(finished, held, waiting)

    def admits(self, number: int, target: int) -> bool:
        return sum(p < number for p in self.held) < target


# ----------------------------------------------------------------------------- one trial's live state
@dataclasses.dataclass
class _Watch:
    """Reports objective values to Optuna and decides pruning / convergence, one metrics line at a time."""

    trial: Trial
    space: Space
    total_steps: int | None
    on_eval: Callable[[int, float], None]
    diagnoser: Diagnoser | None = None
    prune: bool = True  # False for confirmation runs
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
        t = data.get("timing_s/step")
        if isinstance(t, (int, float)) and is_finite(t):
            self.step_times.append(float(t))
        decision = None
        objective = self.space.objective
        evaluated = objective.evaluate(data)
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
        if decision is None and es.enabled and evaluated is not None and self._plateaued(es):
            decision = "plateau"
        if decision is None and es.enabled and es.metric in data and is_finite(data[es.metric]):
            self.streak = self.streak + 1 if float(data[es.metric]) < es.threshold else 0
            if self.streak >= es.patience and self.value is not None and math.isfinite(self.value):
                decision = "converged" if self._reached_floor(self.value, es.min_value) else "collapsed"
        if self.diagnoser is not None:
            label = self.diagnoser.update(step, data)
            if decision is None and label is not None:
                decision = f"collapsed:{label}"
        return decision

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
        if not others:
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


# ----------------------------------------------------------------------------- the driver
class Driver:
    """Runs trials of one study until it has its target number of finished trials, alone or beside other
    drivers on the same storage (``n_jobs`` loops in threads; see :class:`Slots` and :mod:`hpo.study._recovery`)."""

    def __init__(self, space: Space, study: optuna.Study, studies_dir: Path, reporter: Progress,
                 stop_event: threading.Event, cwd: str | None = None, devices: list[str] | None = None) -> None:
        self.space = space
        self.study = study
        self.study_dir = studies_dir / check_study_name(study.study_name)
        self.trials_dir = self.study_dir / "trials"
        self.reporter = reporter
        self.stop_event = stop_event
        self.cwd = cwd or os.getcwd()
        self.identity = driver_identity()
        self.pool = DevicePool(devices if devices is not None else resolve_devices(space.trial),
                               space.trial.gpus_per_trial)
        self.heartbeat: Heartbeat | None = None
        self.ran = 0
        self.confirming = False  # run_confirm: only the queued confirmation trials
        self._errors: list[BaseException] = []
        self._count_lock = threading.Lock()
        self._ask_lock = threading.Lock()

    # -- argv / files
    def fresh_trial_dir(self, number: int) -> Path:
        """An empty ``trials/<number>`` holding the driver's marker. A leftover of an earlier attempt (marker
        present) is removed; anything else at that path is not the driver's to delete: DriverError."""
        trial_dir = self.trials_dir / str(number)
        if trial_dir.is_symlink() or (trial_dir.exists() and not (trial_dir / TRIAL_MARKER).is_file()):
            raise DriverError(f"{trial_dir} exists and was not created by verl-hpo; move it away to run trial "
                              f"{number}")
        if trial_dir.exists():
            shutil.rmtree(trial_dir)
        trial_dir.mkdir(parents=True)
        (trial_dir / TRIAL_MARKER).write_text(json.dumps(
            {"study": self.study.study_name, "trial": number, "driver": self.identity}) + "\n")
        return trial_dir

    def command(self) -> list[str]:
        cmd = list(self.space.trial.command)
        if cmd and cmd[0] == "python":  # the driver's interpreter (the venv), not whatever is on PATH
            cmd[0] = sys.executable
        return cmd

    def trainer_overrides(self, values: dict[str, Any], trial_dir: Path,
                          extra: dict[str, Any] | None = None) -> list[str]:
        """The trial's trainer overrides: fixed ones, tuned values, then ``extra`` (which replaces a fixed
        override of the same key, e.g. a confirmation run's seed)."""
        extra = extra or {}
        if self.space.trial.is_verl:  # hydra syntax (one value per key); the driver's own keys come from verl_argv
            fixed = {k: v for k, v in self.space.overrides.items() if k not in extra}
            return verl_overrides(fixed, {**{p.key: values[p.name] for p in self.space.params if p.name in values},
                                          **extra})
        overrides = self.space.trainer_overrides(values) + [f"{k}={format_value(v)}" for k, v in extra.items()]
        if self.space.trial.is_default_command:
            overrides.append(f"trainer.default_local_dir={trial_dir / 'checkpoints'}")
        return overrides

    def total_steps(self, overrides: list[str]) -> int | None:
        if self.space.trial.is_default_command:
            from verl_core.config import load_config

            return int(load_config(self.space.config, overrides).trainer.total_training_steps)
        for o in overrides:
            if o.startswith("trainer.total_training_steps="):
                try:
                    return int(o.partition("=")[2])
                except ValueError:
                    return None
        return None

    def write_trial_files(self, trial_dir: Path, argv: list[str], env: dict[str, str], overrides: list[str],
                          params: dict[str, Any]) -> None:
        shown_env = {k: env[k] for k in ("CUDA_VISIBLE_DEVICES", *self.space.trial.env) if k in env}
        (trial_dir / "command.json").write_text(json.dumps(
            {"argv": argv, "env": shown_env, "cwd": self.cwd, "shell": shlex.join(argv)}, indent=2) + "\n")
        (trial_dir / "params.json").write_text(json.dumps(params, indent=2) + "\n")
        if self.space.trial.is_default_command:
            from verl_core.config import dump_yaml, load_config

            text = dump_yaml(load_config(self.space.config, overrides))
        else:
            text = yaml.safe_dump({"config": self.space.config, "overrides": overrides}, sort_keys=False)
        (trial_dir / "config.yaml").write_text(text)

    def trial_env(self, trial: Trial, devices: list[str], metrics: Path) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.space.trial.env)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        env["VERL_FILE_LOGGER_PATH"] = str(metrics)  # verl's own file-logger variable
        env["PYTHONUNBUFFERED"] = "1"
        env[ENV_STUDY] = self.study.study_name
        env[ENV_TRIAL] = str(trial.number)
        env[ENV_DRIVER] = json.dumps(self.identity)
        return env

    # -- prepare
    def prepare(self) -> None:
        """Build the model/data the config needs once, before any trial (its time is no trial's)."""
        cmd = self.space.trial.prepare_command
        if not cmd:
            return
        argv = [sys.executable if c == "python" and i == 0 else c for i, c in enumerate(cmd)]
        argv += ["--config", self.space.config, *self.space.trainer_overrides({})]
        log_dir = self.study_dir / "prepare"
        self.reporter.note(f"preparing model and data: {' '.join(argv[1:])}")
        result = TrialProcess(argv=argv, env=dict(os.environ), log_dir=log_dir,
                              metrics_path=log_dir / "metrics.jsonl", cwd=self.cwd,
                              stop_event=self.stop_event).run()
        if result.stop == "interrupted":
            raise TrialInterrupted("interrupted while preparing")
        if result.exit_code != 0:
            last = (result.stderr_tail.strip().splitlines() or ["(no output)"])[-1]
            if result.exit_code == 2:
                raise SpaceError(f"prepare failed: {last}")
            raise DriverError(f"prepare failed (exit {result.exit_code}): {last}; see {log_dir}/stderr.log")

    # -- the objective
    def objective(self, trial: Trial, lost: threading.Event) -> float | list[float]:
        """Run one trial's process to its outcome: values to tell, or TrialPruned / TrialFailed /
        TrialInterrupted / TrialLost (``lost``: another driver finished this trial, taking us for dead)."""
        system = self._frozen(trial.number).system_attrs
        retry_of = system.get("failed_trial")
        values = {p.name: _suggest(trial, p) for p in self.space.params}
        if self.stop_event.is_set():
            self._interrupt(trial)
        trial_dir = self.fresh_trial_dir(trial.number)
        spec = self.space.trial
        history = list(system.get("retry_history", []))
        attempt = len(history)  # verl: each attempt its own metrics file (its FileLogger truncates)
        metrics = verl_metrics_path(trial_dir, attempt) if spec.is_verl else trial_dir / "metrics.jsonl"
        confirm_seed = system.get(ATTR_CONFIRM_SEED)
        if confirm_seed is not None:  # a confirmation run: the top trial's values with a fresh seed
            trial.set_user_attr("confirm_of", system.get(ATTR_CONFIRM_OF))
            trial.set_user_attr("confirm_seed", confirm_seed)
        overrides = self.trainer_overrides(values, trial_dir, None if confirm_seed is None else
                                           seed_overrides(self.space, int(confirm_seed)))
        argv = [*self.command(), "--config", self.space.config, "--metrics-file", str(metrics), *overrides]
        trial.set_user_attr("trial_dir", str(trial_dir))
        if retry_of is not None:
            trial.set_user_attr("retry_of", retry_of)
        total = self.total_steps(overrides)
        self.reporter.trial_started(trial.number, values, retry_of)
        waited = time.monotonic()
        devices = self.pool.acquire(_TrialStop(self.stop_event, lost))
        entered = time.monotonic()
        if self.space.trial.preflight and self.space.trial.is_default_command:
            pred = predict(self.space, overrides, devices)
            if not pred.fits:
                self.pool.release(devices)
                (trial_dir / "memory_estimate.txt").write_text(pred.table + "\n")
                trial.set_user_attr("predicted_memory_gb", round(pred.total / 2**30, 4))
                trial.set_user_attr("memory_budget_gb", round(pred.budget / 2**30, 4))
                trial.set_user_attr("wall_time_s", round(time.monotonic() - entered, 3))
                return self._fail(trial, "predicted_oom", f"predicted {pred.problem} ({pred.budget_source})", "")
        try:
            env = self.trial_env(trial, devices, metrics)
            point = None
            if spec.is_verl:  # a retry continues from the chain's newest complete checkpoint (resume_path)
                point = resume_point(self.trials_dir, history)
                argv = verl_argv(spec.python or default_python(self.cwd), self.space.config, overrides,
                                 self.study.study_name, trial.number, trial_dir, len(devices),
                                 None if point is None else point.checkpoint)
                env = verl_env(env, trial_dir, attempt)
            self.write_trial_files(trial_dir, argv, env, overrides, values)
            mem = [0.0]

            def on_eval(step: int, value: float) -> None:
                self.reporter.trial_eval(trial.number, step, total, value, mem[0])

            def on_tick(step: int | None, gb: float) -> None:
                mem[0] = gb
                self.reporter.trial_tick(trial.number, step, total, gb)

            diag = self.space.diagnosis
            diagnoser = Diagnoser(diag, self.space.objective.primary_metric,
                                  self.space.objective.direction_literal == "maximize") if diag.enabled else None
            watch = _Watch(trial, self.space, total, on_eval, diagnoser, prune=confirm_seed is None)
            if point is not None:  # the earlier attempts' curve up to the checkpoint: aggregate, pruner, diagnosis
                replayed = point.records()
                for step, data in replayed:
                    watch(step, data)  # its decisions are the live run's to make again at its next evaluation
                trial.set_user_attr("resumed_from_step", point.step)
                trial.set_user_attr("replayed_steps", len(replayed))
            proc = TrialProcess(argv=argv, env=env, log_dir=trial_dir, metrics_path=metrics, cwd=self.cwd,
                                timeout_s=spec.timeout_s, memory_limit_gb=spec.memory_limit_gb,
                                on_metrics=watch, on_tick=on_tick, stop_event=_TrialStop(self.stop_event, lost),
                                # verl's weight-sync sockets have fixed names under /tmp (issue 21 item 3)
                                private_tmp=scratch_dir(trial_dir, attempt) / "slash-tmp" if spec.is_verl else None)
            result = proc.run()
        finally:
            self.pool.release(devices)
            if spec.is_verl:  # Ray's scratch dir (sockets, spilled objects) goes; its logs are copied to the trial
                verl_cleanup(trial_dir, attempt, keep_logs=True)
        if lost.is_set():
            raise TrialLost(f"trial {trial.number} was finished by another driver while it ran here")
        attrs: dict[str, Any] = {
            "peak_memory_gb": round(result.peak_memory_gb, 4), "wall_time_s": round(result.wall_time_s, 3),
            "exit_code": result.exit_code, "last_step": result.last_step,
            "first_metric_s": None if result.first_metric_s is None else round(result.first_metric_s, 3),
            # driver time between a device being free and the trainer being spawned (files, config)
            "launch_overhead_s": None if proc.spawned_at is None else round(proc.spawned_at - entered, 4),
            "device_wait_s": round(entered - waited, 3),
            # how the memory cap and peak were taken: cgroup-v2 | cgroup-v1 (kernel-enforced) | poll (VmHWM)
            "memory_mechanism": result.memory_mechanism,
            "cgroup_peak_gb": None if result.cgroup_peak_gb is None else round(result.cgroup_peak_gb, 4),
            "leftovers_killed": result.leftovers_killed,
        }
        if result.metrics_bad_lines:  # skipped: not JSON, too long, no step in 0..2^31, ...
            attrs["metrics_bad_lines"] = result.metrics_bad_lines
        if watch.diagnoser is not None:
            attrs.update(diagnosis=watch.diagnoser.label, diagnosis_labels=list(watch.diagnoser.labels),
                         diagnosis_evidence=watch.diagnoser.evidence())
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        if result.stop == "interrupted":
            self._interrupt(trial)
        if result.stop is not None and (result.stop in ("pruned", "converged", "collapsed", "plateau")
                                        or result.stop.startswith("collapsed:")):
            trial.set_user_attr("stop_reason", result.stop)
            saved = watch.compute_saved_s(result.last_step, result.wall_time_s)
            if saved is not None:
                trial.set_user_attr("compute_saved_s", saved)
            if result.stop == "pruned":
                self._record_scores(trial, watch.scored)
                raise optuna.TrialPruned(f"pruned at step {result.last_step}")
            if watch.scored is None:  # collapsed before any finite evaluation: nothing to score but the worst
                self._record_scores(trial, None)
                if spec.on_failure == "fail":
                    raise TrialFailed(f"trial {trial.number}: {result.stop}")
                return self.space.objective.worst
            return self._finish(trial, watch)
        failure, error = result.failure, result.metrics_error
        if failure is None and watch.scored is None:
            failure = "crash"
            names = ", ".join(self.space.objective.metrics)
            error = (f"exited {result.exit_code} without finite values of {names}" if watch.value is None
                     else f"an objective metric ({names}) is NaN or infinite")
        if failure is None:
            return self._finish(trial, watch)
        return self._fail(trial, failure, error, read_tail(trial_dir / "stderr.log"))

    def _record_scores(self, trial: Trial, scored: Scored | None) -> None:
        """Weighted-score parts as ``score/<term>`` user attrs; constraint violations (+inf when unknown)."""
        if scored is not None:
            for k, v in scored.parts.items():
                trial.set_user_attr(k, v)
        for name, v in self.space.objective.constraint_values(None if scored is None else scored.data).items():
            trial.set_constraint(name, v)

    def _finish(self, trial: Trial, watch: _Watch) -> float | list[float]:
        assert watch.scored is not None
        self._record_scores(trial, watch.scored)
        values = watch.scored.values
        return values if self.space.objective.multi else values[0]

    def _fail(self, trial: Trial, reason: str, error: str | None, stderr_tail: str) -> float | list[float]:
        trial.set_user_attr("fail_reason", reason)
        if error:
            trial.set_user_attr("error", error)
        if stderr_tail:
            trial.set_user_attr("stderr_tail", stderr_tail[-4000:])
        self._record_scores(trial, None)
        if self.space.trial.on_failure == "fail":
            raise TrialFailed(f"trial {trial.number}: {reason}")
        return self.space.objective.worst

    def _abandon(self, trial: Trial, err: Exception) -> None:
        """The driver could not run this trial (its launch failed, the disk is full, ...): like an interrupt, its
        parameters are queued for a later driver and it ends FAIL; then the driver stops with one line."""
        why = (str(err).strip().splitlines() or [type(err).__name__])[0]
        if isinstance(err, OSError) and err.strerror:
            why = f"{err.strerror}" + (f": {err.filename}" if err.filename else "")
        try:
            queue_retry(self.study, self._frozen(trial.number), max_retry=self.space.study.max_retry)
            trial.set_user_attr("stop_reason", "driver_error")
            trial.set_user_attr("error", why[:4000])
            self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        except Exception:  # noqa: BLE001 - the storage may be the problem; recovery finds the trial later
            pass
        raise DriverError(f"trial {trial.number} could not be run: {type(err).__name__}: {why}") from err

    def _frozen(self, number: int) -> FrozenTrial:
        return next(t for t in self.study.get_trials(deepcopy=True) if t.number == number)

    def _interrupt(self, trial: Trial) -> None:
        """Stopped by the user: the same parameters are queued first (so the slot stays held), then FAIL."""
        queue_retry(self.study, self._frozen(trial.number), max_retry=None)
        trial.set_user_attr("interrupted", True)
        trial.set_user_attr("stop_reason", "interrupted")
        raise TrialInterrupted(f"trial {trial.number} interrupted")

    # -- the loop
    def run(self, target: int, callbacks: Sequence[Callable[[optuna.Study, FrozenTrial], None]] = ()) -> int:
        """Run trials until the study has ``target`` finished trials (counting every driver's). Returns the
        number of trials this driver ran; raises TrialInterrupted when stopped, DriverError on a runtime
        problem."""
        self.trials_dir.mkdir(parents=True, exist_ok=True)
        killed = sweep_orphans(self.study.study_name)
        if killed:
            self.reporter.note(f"killed {killed} leftover trial process(es) of a dead driver")
        self.recover()
        if not self.confirming and n_finished(self.study) >= target:
            return 0
        self.prepare()
        n_jobs = self.space.trial.n_jobs
        with Heartbeat(self.study, self.space.study.heartbeat_interval) as self.heartbeat:
            if n_jobs == 1:
                self._loop(target, callbacks)
            else:
                threads = [threading.Thread(target=self._loop, args=(target, callbacks), name=f"verl-hpo-job-{i}",
                                            daemon=True) for i in range(n_jobs)]
                for t in threads:
                    t.start()
                for t in threads:
                    while t.is_alive():
                        t.join(timeout=0.2)
        if self._errors:
            gone = [e for e in self._errors if isinstance(e, StorageUnavailable)]  # the others stopped because of it
            interrupted = [e for e in self._errors if isinstance(e, TrialInterrupted)]
            raise (gone or interrupted or self._errors)[0]
        return self.ran

    def run_confirm(self, callbacks: Sequence[Callable[[optuna.Study, FrozenTrial], None]] = ()) -> int:
        """Run the study's queued confirmation trials (``verl-hpo confirm``) until none is waiting; other
        drivers of the study may take some of them. Returns the number this driver ran."""
        self.confirming = True
        try:
            return self.run(0, callbacks)
        finally:
            self.confirming = False

    def recover(self) -> None:
        spec = self.space.study
        for number, what in recover_stale_trials(self.study, spec.grace_period, spec.max_retry):
            self.reporter.note(f"trial {number}: its driver is gone (dead pid or no heartbeat for "
                               f"{spec.grace_period}s); {what}")

    def _loop(self, target: int, callbacks: Sequence[Callable[[optuna.Study, FrozenTrial], None]]) -> None:
        """One job: take a slot of the target, run a trial, tell it; until the target is reached."""
        try:
            while not self.stop_event.is_set() and not self._errors:
                self.recover()
                with self._ask_lock:  # this driver's jobs ask one at a time: none asks for a slot another just took
                    trials = self.study.get_trials(deepcopy=False)
                    if self.confirming:
                        if not any(is_confirm(t) and t.state == TrialState.WAITING for t in trials):
                            return
                        slots = None
                    else:
                        slots = Slots.count(trials, self.space.study.max_retry)
                    if slots is not None and slots.finished >= target:
                        return
                    full = slots is not None and not slots.waiting and len(slots.held) >= target
                    trial = None if full else self.study.ask()
                if trial is None:
                    self.stop_event.wait(WAIT_S)  # running trials (ours or others') hold the rest; they may die
                    continue
                frozen = self._one_trial(trial, target)
                if frozen is not None:
                    with self._count_lock:
                        self.ran += 1
                    done = n_finished(self.study)
                    self.reporter.trial_finished(self.study, frozen, done)
                    for cb in callbacks:
                        cb(self.study, frozen)
        except BaseException as err:  # noqa: BLE001 - handed to the main thread, which raises it
            self._errors.append(err)
            if isinstance(err, StorageUnavailable):  # past study.storage_retry_s: stop the other jobs' trials too
                self.stop_event.set()  # (they stay RUNNING in the storage; resume or any worker recovers them)

    def _one_trial(self, trial: Trial, target: int) -> FrozenTrial | None:
        """Check the slot of an asked trial (another driver may have taken it), run, record and tell it; None when
        it was surplus or lost."""
        frozen = self._frozen(trial.number)
        queued = "failed_trial" in frozen.system_attrs or is_confirm(frozen)  # requested work: never surplus
        if not queued and (self.confirming or not Slots.count(
                self.study.get_trials(deepcopy=False), self.space.study.max_retry).admits(trial.number, target)):
            trial.set_user_attr("stop_reason", "surplus")
            finish(self.study, trial._trial_id, TrialState.FAIL, None)
            return None
        trial.set_user_attr("worker", self.identity)
        assert self.heartbeat is not None
        lost = self.heartbeat.add(trial._trial_id)
        try:
            state, values = TrialState.COMPLETE, None
            try:
                out = self.objective(trial, lost)
                values = list(out) if isinstance(out, list) else [out]
            except optuna.TrialPruned:
                state = TrialState.PRUNED
            except TrialFailed:
                state = TrialState.FAIL
            except TrialInterrupted:
                self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
                raise
            except Exception as err:  # noqa: BLE001
                if isinstance(err, (TrialLost, UpdateFinishedTrialError, *DB_ERRORS)):
                    raise
                self._abandon(trial, err)  # a launch or disk error (not the trial's doing): queued, never RUNNING
            self._clean_checkpoints(trial, state, values)
            record_result(self.study, trial._trial_id, state, values)
            try:
                self.study.tell(trial, values, state=state)
            except (ValueError, UpdateFinishedTrialError):
                raise TrialLost(f"trial {trial.number} was finished by another driver before its result was "
                                "told") from None
        except (TrialLost, UpdateFinishedTrialError) as err:
            why = str(err) if isinstance(err, TrialLost) else f"trial {trial.number} was finished by another driver"
            self.reporter.note(f"{why}; its result here is dropped (its retry runs instead)")
            return None
        finally:
            self.heartbeat.remove(trial._trial_id)
        return self._frozen(trial.number)

    def _clean_checkpoints(self, trial: Trial, state: TrialState, values: list[float] | None) -> None:
        """A finished trial can no longer be resumed: its checkpoints (and its retry chain's) go, unless it is among
        the ``trial.keep_checkpoints`` best (:mod:`hpo.study._checkpoints`). Recorded before the trial is told."""
        keep = self.space.trial.keep_checkpoints
        value = values[0] if state == TrialState.COMPLETE and values and not is_confirm(self._frozen(trial.number)) \
            else None
        finished = [t for t in self.study.get_trials(deepcopy=False) if is_finished(t)]
        size_gb, kept, _ = clean_after(self.study, self._frozen(trial.number), value, self.trials_dir, keep, finished)
        if size_gb > 0:
            trial.set_user_attr("checkpoint_gb", round(size_gb, 6))
            trial.set_user_attr("checkpoint_kept", kept)



def _suggest(trial: Trial, p: Any) -> Any:
    if p.type == "categorical":
        return trial.suggest_categorical(p.name, list(p.choices))
    if p.type == "int":
        return trial.suggest_int(p.name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
    return trial.suggest_float(p.name, p.low, p.high, step=p.step, log=p.log)


# ----------------------------------------------------------------------------- studies
def quiet_optuna() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", category=FutureWarning, module="optuna")


def _essentials(raw: dict[str, Any]) -> dict[str, Any]:
    return {k: raw.get(k) for k in ("config", "overrides", "params", "objective")}


def _jsonable(raw: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(json.dumps(raw, default=str)))


def open_study(space: Space, study_name: str, storage_url: str) -> optuna.Study:
    """Create the study, or load it when it exists with the same space (else SpaceError)."""
    storage = open_storage(storage_url, space.study)
    directions = space.objective.directions
    n_existing = 0
    if study_exists(storage, study_name):
        old = optuna.load_study(study_name=study_name, storage=storage)
        stored = old.user_attrs.get(ATTR_SPACE)
        if stored is not None and _essentials(stored) != _essentials(_jsonable(space.raw)):
            raise SpaceError(f"study {study_name!r} in {mask_url(storage_url)} was made from a different space "
                             f"({old.user_attrs.get(ATTR_SOURCE)}); choose another --study or use resume")
        old_dirs = [d.name.lower() for d in old.directions]
        if old_dirs != directions:
            raise SpaceError(f"study {study_name!r} has direction(s) {', '.join(old_dirs)}, space says "
                             f"{', '.join(directions)}")
        n_existing = len(old.trials)
    study = optuna.create_study(study_name=study_name, storage=storage,
                                directions=[optuna.study.StudyDirection[d.upper()] for d in directions],
                                load_if_exists=True,
                                sampler=make_sampler(space.study.sampler, n_existing, joining=n_existing > 0),
                                pruner=make_pruner(space.study.pruner))
    # each attribute on its own: a search that died half-way through creating the study is repaired by the next
    attrs = study.user_attrs
    if not study.metric_names:
        study.set_metric_names(space.objective.names)
    if ATTR_SPACE not in attrs:
        study.set_user_attr(ATTR_SPACE, _jsonable(space.raw))
    if ATTR_SOURCE not in attrs:
        study.set_user_attr(ATTR_SOURCE, space.source)
    if ATTR_DIGEST not in attrs:
        study.set_user_attr(ATTR_DIGEST, experiment_digest(_jsonable(space.raw)))
    study.set_user_attr(ATTR_TARGET, space.study.n_trials)
    return study


def load_stored(study_name: str, storage_url: str, n_trials: int | None) -> tuple[Space, optuna.Study]:
    """The space a study was made from, and the study opened with a sampler reseeded for resume."""
    from hpo.experiment._space import StudySpec

    storage = open_storage(storage_url, StudySpec())
    if not study_exists(storage, study_name):
        raise SpaceError(f"no study {study_name!r} in {mask_url(storage_url)} (start one with verl-hpo search)")
    old = optuna.load_study(study_name=study_name, storage=storage)
    raw = old.user_attrs.get(ATTR_SPACE)
    if not isinstance(raw, dict):
        raise SpaceError(f"study {study_name!r} in {mask_url(storage_url)} was not made by verl-hpo (no stored space)")
    space = space_from_stored(raw, str(old.user_attrs.get(ATTR_SOURCE, "stored space")), study_name)
    target = n_trials or int(old.user_attrs.get(ATTR_TARGET, space.study.n_trials))
    space = dataclasses.replace(space, study=dataclasses.replace(space.study, n_trials=target))
    storage = open_storage(storage_url, space.study)
    study = optuna.load_study(study_name=study_name, storage=storage,
                              sampler=make_sampler(space.study.sampler, len(old.trials), joining=True),
                              pruner=make_pruner(space.study.pruner))
    if n_trials is not None:
        study.set_user_attr(ATTR_TARGET, target)
    return space, study
