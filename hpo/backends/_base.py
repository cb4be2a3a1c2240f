"""The contract between the study driver and a trainer: :class:`Backend`, one subclass per ``trial.backend``.

The study loop, confirmation, PBT, tracking and reporting never test a backend's name; they ask the trial's backend
(:func:`hpo.backends.backend_of`). A backend is a required core, optional features, and defaults that belong to no
trainer.

**The required core** (abstract: the registry refuses a backend class that misses one, with one line naming it):

* ``name``: the ``trial.backend`` value;
* ``metrics``: its metric vocabulary (:class:`~hpo.analysis.MetricNames`: the default objective, the spread, the
  score, entropy, KL, clip ratio, step time, response length ... under the names the trainer itself logs; ``None``
  where it logs none);
* ``configure(attempt)``: the attempt's :class:`TrialConfig`: the trainer overrides (fixed, tuned, the attempt's
  ``extra``, then its ``tail``), the total steps (None: not known), the ``config.yaml`` text. A trial's config is
  loaded once, here;
* ``command(attempt, config)``: the attempt's process (:class:`Command`: argv, environment, a private ``/tmp``).
  ``attempt.metrics`` is where the JSONL metrics file goes (``{"step": N, "data": {...}}``) and
  ``attempt.resume_from`` the checkpoint to continue from (a retry's, a PBT segment's start).

**The features** (:mod:`hpo.backends._features`), each an attribute that is ``None`` when the trainer has none,
asked for by the part of the driver that needs it: ``memory`` (:class:`~hpo.backends._features.MemoryModel`),
``resumable`` (:class:`~hpo.backends._features.Resumable`: retries; with ``segments`` PBT), ``confirmation``
(:class:`~hpo.backends._features.Confirmation`: seed keys, the held-out split, the trainer's version), ``speed``
(:class:`~hpo.backends._features.Speed`: throughput studies), ``rehearsal``
(:class:`~hpo.backends._features.Rehearsal`: ``verl-hpo rehearse``).

**What a trainer may override** (each default belongs to no trainer):

* ``default_command``, ``default_prepare_command``: what ``trial.command`` and ``trial.prepare_command`` mean when
  an experiment leaves them unset (:meth:`with_defaults` fills them in on every load);
* ``code_keys``, ``every_key_is_code``, ``default_runs_unasked``, :meth:`code_files`: which of its config keys name
  code, and whether its own commands on a shipped config run unasked from a stored experiment (the trust check,
  :mod:`hpo.experiment._trust`);
* ``metrics_env``: the environment variable through which the trainer is told where its metrics file goes
  (:meth:`plan` sets it); :meth:`metrics_path`: where an attempt's metrics file lives;
* ``model_keys``, ``tokenizer_keys``: the keys that name its model and tokenizer (``study.fidelity.proxy``; none:
  no proxy search), with :meth:`model_path`, :meth:`tokenizer_path` and :meth:`model_facts`
  (:mod:`hpo.backends._models`);
* ``dropped_row_patterns``, ``host_failure_lines``, ``ray_hold``, ``leaves_scratch``: how its log says it dropped a
  row, how it says the host could not start it, whether a Ray job may hold its GPUs, whether a killed attempt leaves
  scratch that :meth:`cleanup` removes;
* the experiment's checks: :meth:`check` (quick, on every load), :meth:`verify` (thorough, before a study),
  :meth:`check_launch`, :meth:`check_cluster`, :meth:`infeasible`; its defaults: :meth:`normalize`,
  :meth:`resolve_paths`, :meth:`for_command`; :meth:`prepare_argv` (the one-off step before any trial);
  :meth:`command_line` (``verl-hpo best --format command``); :meth:`cleanup`.

:meth:`plan` is the one call that launches a trial: an :class:`Attempt` in, its :class:`Launch` out (configure, the
metrics file, the retry's resume point, the command). :class:`CommandBackend` is a custom command (``trial.command``:
any program that takes ``--config``, ``--metrics-file`` and ``key=value`` overrides and writes the JSONL file); a
trainer's backend that runs other commands says what they share with it (:meth:`for_command`).
"""

from __future__ import annotations

import abc
import dataclasses
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import yaml

from hpo.analysis import MetricNames
from hpo.backends._attempt import Attempt, Command, Launch, ResumePointLike, TrialConfig
from hpo.backends._features import Confirmation, MemoryModel, PredictionLike, Rehearsal, Resumable, Speed
from hpo.backends._models import ModelFacts, local_facts
from hpo.backends._replay import lost_checkpoints
from hpo.experiment import CodeRules, Space, format_value

__all__ = ["REQUIRED", "Attempt", "Backend", "Command", "CommandBackend", "Launch", "PredictionLike",
           "ResumePointLike", "TrialConfig", "config_text", "int_override", "missing_members"]

REQUIRED = ("name", "metrics", "configure", "command")  # what every trainer writes (Backend's required core)


class Backend(abc.ABC):
    """A trainer the driver runs: the required core (``name``, ``metrics``, :meth:`configure`, :meth:`command`), the
    features it has (``memory``, ``resumable``, ``confirmation``, ``speed``, ``rehearsal``; None: none) and
    overridable defaults that belong to no trainer (see the module docstring)."""

    # ------------------------------------------------------------------ the required core
    name: ClassVar[str]  # the trial.backend value
    metrics: ClassVar[MetricNames]  # its metric vocabulary (None: a metric it does not log)

    @abc.abstractmethod
    def configure(self, attempt: Attempt) -> TrialConfig:
        """The overrides (fixed, tuned ``attempt.values`` by name, then ``attempt.extra``, which replaces a fixed
        override of the same key, e.g. a confirmation run's seed; ``attempt.tail`` last, a PBT segment's), the total
        steps and the ``config.yaml`` text of one attempt."""

    @abc.abstractmethod
    def command(self, attempt: Attempt, config: TrialConfig) -> Command:
        """The attempt's process: argv, environment (``attempt.env`` and what the trainer adds) and a private
        ``/tmp`` if it needs one; its metrics file is ``attempt.metrics``, the checkpoint it continues from
        ``attempt.resume_from`` (None: a fresh start)."""

    # ------------------------------------------------------------------ the features (None: the trainer has none)
    memory: ClassVar[MemoryModel | None] = None
    resumable: ClassVar[Resumable | None] = None
    confirmation: ClassVar[Confirmation | None] = None
    speed: ClassVar[Speed | None] = None
    rehearsal: ClassVar[Rehearsal | None] = None

    # ------------------------------------------------------------------ what the trainer knows
    default_command: ClassVar[tuple[str, ...]] = ()  # trial.command when unset (a leading "python": the driver's)
    default_prepare_command: ClassVar[tuple[str, ...] | None] = None  # trial.prepare_command when unset
    code_keys: ClassVar[tuple[str, ...]] = ()  # key prefixes whose values name code to load (the trust check)
    every_key_is_code: ClassVar[bool] = False  # any override may name code to load (verl's hydra ``_target_``)
    default_runs_unasked: ClassVar[bool] = False  # a stored experiment of its own commands, no code: runs untrusted
    metrics_env: ClassVar[str | None] = None  # an environment variable that tells the trainer its metrics file
    # lines in which the trainer says it dropped a row of its data and went on without it (a row whose reward or
    # generation raised): Python regular expressions searched in each line of its stdout and stderr, before the log
    # cap cuts any (hpo.execution._logpump: a named group `n` counts n rows, `key` counts each value once). A trial's
    # count is its `dropped_rows` attr; more than $VERL_HPO_MAX_DROPPED_ROWS (default 10) fails it. None: ()
    dropped_row_patterns: ClassVar[tuple[str, ...]] = ()
    # what the trainer says when this host could not start its runtime in time (Ray's node on a busy host): plain
    # substrings of a failed trial's last exception line (or the end of its stderr). Such a failure is the host's,
    # not the setting's: FAIL, not counted, retried up to study.max_retry (3 where unlimited), like a lost Ray node.
    host_failure_lines: ClassVar[tuple[str, ...]] = ()
    # study.fidelity.proxy: the keys that name the model (the first: the policy's, actor, rollout and reference), and
    # those that name a tokenizer apart from it; a trainer that names none cannot run a proxy search
    model_keys: ClassVar[tuple[str, ...]] = ()
    tokenizer_keys: ClassVar[tuple[str, ...]] = ()
    ray_hold: ClassVar[bool] = True  # a one-node Ray job may hold its GPUs itself (verl starts its own Ray)
    leaves_scratch: ClassVar[bool] = False  # cleanup removes scratch a killed attempt leaves (swept at driver start)

    def for_command(self, command: Sequence[str] | None) -> Backend:
        """The backend of a trial of this trainer whose ``trial.command`` is ``command`` (None: unset, the default):
        itself, or a custom command that speaks this trainer's language when the trainer's own config cannot be
        loaded for another program (verl_core)."""
        return self

    def code_files(self, key: str, value: Any) -> list[str]:
        """The user-code files a fixed override ``key=value`` names (checked to be regular files before a study:
        :func:`hpo.experiment._limits.check_code_files`); none for a trainer that names none."""
        return []

    def code_rules(self) -> CodeRules:
        """What decides whether a stored experiment of this trainer runs code here (:mod:`hpo.experiment._trust`)."""
        return CodeRules(self.default_command, self.default_prepare_command, self.code_keys, self.every_key_is_code,
                         self.default_runs_unasked)

    def with_defaults(self, space: Space) -> Space:
        """The experiment with what it leaves to the trainer filled in: ``trial.command`` (:attr:`default_command`),
        ``objective.metric`` (:attr:`metrics`; a throughput study's: the first of the ``speed`` feature's metrics)
        and ``early_stopping.metric`` (:attr:`metrics`). Run first on every load, stored experiments included, so a
        study made before a default moved still runs the same."""
        trial, objective, early = space.trial, space.objective, space.early_stopping
        if trial.command is None:
            trial = dataclasses.replace(trial, command=self.default_command)
        if objective.mode == "single" and not objective.metric:
            speed = self.speed.metrics if self.speed is not None else {}
            if space.study.kind == "throughput" and speed:  # its first speed metric, faster's way
                metric, direction = next(iter(speed.items()))
                objective = dataclasses.replace(objective, metric=metric, direction=direction)
            elif space.study.kind != "throughput" and self.metrics.objective:
                objective = dataclasses.replace(objective, metric=self.metrics.objective)
        if early.metric is None and self.metrics.spread:
            early = dataclasses.replace(early, metric=self.metrics.spread)
        if (trial, objective, early) == (space.trial, space.objective, space.early_stopping):
            return space
        return dataclasses.replace(space, trial=trial, objective=objective, early_stopping=early)

    # ------------------------------------------------------------------ the experiment
    def normalize(self, space: Space) -> Space:
        """The experiment with what this trainer gives it by default (every space the driver runs passes here)."""
        return space

    def resolve_paths(self, space: Space, origin: Mapping[str, str]) -> Space:
        """The experiment with its relative file paths made absolute (the file's own against its directory, those
        typed with ``--override`` against the current one), so every command reads the same files from anywhere."""
        return space

    def check(self, space: Space, origin: Mapping[str, str]) -> None:
        """SpaceError (one line, naming the file and key) when this trainer would refuse the experiment: the
        quick checks, made whenever an experiment file is loaded."""
        return None  # nothing to check by default

    def verify(self, space: Space, origin: Mapping[str, str]) -> None:
        """The thorough checks ``search`` and ``validate`` make before a study exists (they may run the trainer's
        own code in its interpreter)."""
        return None  # nothing to check by default

    def check_launch(self, space: Space, *, as_planned: bool = False) -> None:
        """SpaceError (one line naming the fix) when this host cannot launch the trials (e.g. no interpreter with
        the trainer); made by every driver before its first trial. ``as_planned`` (``validate``): check for where the
        experiment says its trials run (e.g. on ``trial.gpus_per_trial`` GPUs), not only where they would land
        on this host."""
        return None  # nothing to check by default

    def check_cluster(self, space: Space, address: str, study: str, trials_dir: Path | None) -> list[str]:
        """A Ray-job study (``trial.executor: ray``): what the trials need of the cluster's nodes, checked there
        before the study is made (RayClusterError with one line); notes for the user. ``trials_dir``: where study
        ``study``'s trial directories are (None: not known here)."""
        return []

    def prepare_argv(self, space: Space) -> list[str] | None:
        """The one-off step that builds the model and data before any trial (None: none): ``trial.prepare_command``
        with ``--config`` and the fixed overrides, as the schema documents it."""
        cmd = space.trial.prepare_command
        if not cmd:
            return None
        argv = [sys.executable if c == "python" and i == 0 else c for i, c in enumerate(cmd)]
        return argv + ["--config", space.config, *space.trainer_overrides({})]

    def infeasible(self, space: Space, values: Mapping[str, Any]) -> str | None:
        """Why the trainer would refuse the tuned ``values`` (by parameter name) together, in one line; None when it
        accepts them or when this trainer cannot tell without launching (the default: not known). Asked before a
        trial is launched: a trial it refuses is recorded ``fail_reason=infeasible`` with the reason, never launched
        (:mod:`hpo.study._trial._outcome`); and at load, a value no combination makes valid refuses the space
        (:func:`hpo.experiment._combos.check_combinations`)."""
        return None

    def answers_infeasible(self) -> bool:
        """This trainer's :meth:`infeasible` says something (it overrides the default)."""
        return type(self).infeasible is not Backend.infeasible

    # ------------------------------------------------------------------ one attempt
    def metrics_path(self, trial_dir: Path, attempt: int) -> Path:
        """Where attempt ``attempt`` (0: the first of its retry chain) in ``trial_dir`` writes its metrics file."""
        return trial_dir / "metrics.jsonl"

    def plan(self, attempt: Attempt) -> Launch:
        """One attempt, whole: its config (:meth:`configure`), metrics file (:meth:`metrics_path`, also told through
        ``metrics_env``), the checkpoint a retry continues from (``resumable``'s resume point; else a PBT segment's
        start) and its process (:meth:`command`)."""
        config = self.configure(attempt)
        metrics = self.metrics_path(attempt.trial_dir, attempt.index)
        point = None
        if attempt.history and self.resumable is not None:
            with lost_checkpoints() as notes:  # a checkpoint passed over: its files refused (hpo.backends._replay)
                point = self.resumable.resume_point(attempt.trials_dir or attempt.trial_dir.parent, attempt.history,
                                                    self.metrics_path)
        else:
            notes = []
        env = dict(attempt.env)
        if self.metrics_env:
            env[self.metrics_env] = str(metrics)  # the trainer's own metrics-file variable, beside its argv
        ready = dataclasses.replace(attempt, metrics=metrics, env=env,
                                    resume_from=attempt.start if point is None else point.checkpoint)
        process = self.command(ready, config)
        return Launch(process.argv, process.env, metrics, config, point, process.private_tmp, tuple(notes))

    def command_line(self, space: Space, overrides: Sequence[str]) -> list[str]:
        """The command a user runs to train with ``overrides`` outside the driver (``verl-hpo best --format
        command``): the trainer's own :meth:`command` of a first attempt in the current directory, its metrics file
        ``metrics.jsonl`` (a trainer whose command names driver keys overrides this)."""
        return self.command(Attempt(space=space, trial_dir=Path(".")), TrialConfig(list(overrides), None, "")).argv

    def cleanup(self, trial_dir: Path, attempt: int) -> None:
        """After the attempt's process tree is gone (the trial's logs stay)."""
        return None  # nothing to clean by default

    # ------------------------------------------------------------------ model-size fidelity
    def model_path(self, space: Space, overrides: Mapping[str, Any]) -> str | None:
        """The policy model a run with the fixed ``overrides`` trains (its first :attr:`model_keys`; None: not set
        there, and this trainer's default is not known here)."""
        return _set_value(overrides, self.model_keys[:1])

    def tokenizer_path(self, space: Space, overrides: Mapping[str, Any]) -> str | None:
        """The tokenizer such a run reads: its first :attr:`tokenizer_keys` when set, else its model's."""
        return _set_value(overrides, self.tokenizer_keys[:1]) or self.model_path(space, overrides)

    def model_facts(self, path: str) -> ModelFacts:
        """What is known here of model ``path`` without loading it (:mod:`hpo.backends._models`): a local Hugging
        Face directory's tokenizer digest and hidden size; a trainer with built-in models answers for those."""
        return local_facts(path)


class CommandBackend(Backend):
    """A custom trainer command (``trial.command``): no config is loaded, nothing is estimated or resumed, no metric
    names, no default command, no held-out split. Its argv is the command with ``--config``, ``--metrics-file`` and
    the overrides; ``steps_key``: the override that gives its total steps (None: not known)."""

    name: ClassVar[str] = "command"
    metrics: ClassVar[MetricNames] = MetricNames()
    steps_key: ClassVar[str | None] = None

    def configure(self, attempt: Attempt) -> TrialConfig:
        space = attempt.space
        overrides = [*space.trainer_overrides(dict(attempt.values)),
                     *(f"{k}={format_value(v)}" for k, v in attempt.extra.items()), *attempt.tail]
        steps = None if self.steps_key is None else int_override(overrides, self.steps_key)
        return TrialConfig(overrides, steps, config_text(space, overrides))

    def command(self, attempt: Attempt, config: TrialConfig) -> Command:
        """``trial.command`` (the driver's interpreter for ``python``) with ``--config``, ``--metrics-file`` and the
        overrides."""
        space = attempt.space
        cmd = list(space.trial.command or self.default_command)
        if cmd and cmd[0] == "python":  # the driver's interpreter (the venv), not whatever is on PATH
            cmd[0] = sys.executable
        return Command([*cmd, "--config", space.config, "--metrics-file", str(attempt.metrics), *config.overrides],
                       dict(attempt.env))

    def command_line(self, space: Space, overrides: Sequence[str]) -> list[str]:
        """The command with ``--config`` and the overrides (no metrics file: the trainer's default)."""
        return [*(space.trial.command or self.default_command), "--config", space.config, *overrides]


def config_text(space: Space, overrides: Sequence[str]) -> str:
    """A ``config.yaml`` for a trainer whose config the driver does not load: the config and the overrides."""
    return yaml.safe_dump({"config": space.config, "overrides": list(overrides)}, sort_keys=False)


def missing_members(cls: type) -> list[str]:
    """The members of the required core (:data:`REQUIRED`) that backend class ``cls`` does not write: ``name`` not a
    non-empty string, ``metrics`` not a :class:`~hpo.analysis.MetricNames`, an abstract method not defined."""
    missing = []
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        missing.append("name")
    if not isinstance(getattr(cls, "metrics", None), MetricNames):
        missing.append("metrics")
    abstract = set(getattr(cls, "__abstractmethods__", ()))
    return missing + [m for m in REQUIRED if m in abstract]


def _set_value(overrides: Mapping[str, Any], keys: Sequence[str]) -> str | None:
    """The string value of the first of ``keys`` set in ``overrides`` (a leading ``+`` or ``++`` of hydra's allowed)."""
    for key in keys:
        for k, v in overrides.items():
            if k.lstrip("+") == key and isinstance(v, str) and v.strip() and v.strip() != "null":
                return v.strip()
    return None


def int_override(overrides: Sequence[str], key: str) -> int | None:
    """The integer value of the last ``key=value`` of ``overrides`` (None: not set, or not an integer)."""
    for o in reversed(overrides):
        k, _, value = o.partition("=")
        if k.lstrip("+") == key:
            try:
                return int(value)
            except ValueError:
                return None
    return None
