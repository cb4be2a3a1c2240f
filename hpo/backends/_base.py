"""The contract between the study driver and a trainer: :class:`Backend`, one subclass per ``trial.backend``.

The study loop, confirmation, PBT, tracking and reporting never test a backend's name; they ask the trial's backend
(:func:`hpo.backends.backend_of`). What the trainer knows lives here and nowhere else in ``hpo/``:

* ``metrics``: its metric vocabulary (:class:`~hpo.analysis.MetricNames`: the default objective, the spread, the
  score, entropy, KL, clip ratio, step time, response length ... under the names the trainer itself logs);
* ``default_command``, ``default_prepare_command``: what ``trial.command`` and ``trial.prepare_command`` mean when
  an experiment leaves them unset (:meth:`with_defaults` fills them in on every load);
* ``code_keys``, ``every_key_is_code``, ``default_runs_unasked``: which of its config keys name code, and whether
  its own commands on a shipped config run unasked from a stored experiment (the trust check,
  :mod:`hpo.experiment._trust`);
* ``heldout_keys``, ``heldout_prefixes``: the keys that select its held-out split and the names its metrics take
  there (the guard that keeps a search off it, :mod:`hpo.experiment._heldout`);
* ``metrics_env``: the environment variable through which the trainer is told where its metrics file goes;
* ``model_keys``, ``tokenizer_keys``: the keys that name its model and tokenizer (``study.fidelity.proxy``; none:
  no proxy search), with ``model_path``, ``tokenizer_path`` and ``model_facts`` (:mod:`hpo.backends._models`).

A backend answers, for one experiment (:class:`~hpo.experiment.Space`):

* ``check(space, origin)``: refuse the experiment before a study is made (SpaceError, one line); ``normalize``:
  the defaults it gives a parsed experiment (e.g. verl_core's prepare step).
* ``plan(attempt)``: the one call that launches a trial: an :class:`Attempt` (the driver's: values, trial
  directory, retry chain, devices, environment) in, its :class:`Launch` out: argv, environment, metrics file,
  :class:`TrialConfig` (overrides, total steps, the ``config.yaml`` text, the loaded config), the retry's resume
  point, a private ``/tmp``. It is made of the hooks a trainer overrides:

  - ``configure(space, values, trial_dir, extra, tail)``: the attempt's :class:`TrialConfig`. A trial's config is
    loaded once, here;
  - ``metrics_path(trial_dir, attempt)``: where the attempt's JSONL metrics file lives (``{"step": N, "data": {}}``);
  - ``checkpoint_layout``: how the trainer's checkpoints look (:class:`~hpo.backends._replay.CheckpointLayout`); a
    trainer that sets it gets ``resume_point(trials_dir, history)``, the checkpoint a retry continues from and the
    curve logged up to it, from the walk every resumable backend shares (:func:`hpo.backends._replay.resume_point`);
  - ``command(space, config, ctx)``: argv, environment and private ``/tmp`` of the process.
* ``infeasible(space, values)``: why the trainer would refuse a combination of tuned values (a micro-batch larger
  than the mini-batch it divides), asked before a trial launches (None: valid, or not known: the default); a backend
  that answers also gets the space checked at load for a value no combination makes valid
  (:mod:`hpo.experiment._combos`).
* ``predict(space, config, devices)``: a memory estimate to skip a trial that cannot fit (None: none);
  ``corner_predictions(space, devices, lengths)``: the estimate of each corner of the space, for ``search``'s refusal
  of a space where none fits (None: none); ``validate(space, devices, out, lengths)``: ``verl-hpo validate``'s
  verdict on each corner (:mod:`hpo.backends._preflight`).
* ``seed_keys(space)``, ``default_seed(space, key)``: what a confirmation run sets to change its seed.
* ``heldout_overrides(space)``, ``heldout_metric(space)``: how a confirmation run measures the held-out split.
* ``segment_overrides(space, start, end, checkpoint)``: a PBT segment's overrides (``supports_pbt``).
* ``cleanup(trial_dir, attempt)``: what goes once an attempt's process is gone (scratch directories).
* ``speed_keys``, ``math_metrics``: the keys a throughput study may tune (they change speed and memory, not the
  update) and the first-step metrics its same-math check compares (:mod:`hpo.experiment._throughput`).

The base class is a custom command (``trial.command``, any program that takes ``--config``, ``--metrics-file`` and
``key=value`` overrides and writes the JSONL file): no config is loaded, nothing is estimated or resumed, and it knows
no metric names, no default command and no held-out split (a trainer's backend that runs other commands says what
they share with it: :meth:`for_command`).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TextIO

import yaml

from hpo.analysis._vocabulary import MetricNames
from hpo.backends._attempt import Attempt, Command, Launch, LaunchContext, ResumePointLike, TrialConfig
from hpo.backends._models import ModelFacts, local_facts
from hpo.backends._replay import CheckpointLayout, lost_checkpoints, resume_point
from hpo.experiment._heldout import heldout_metric
from hpo.experiment._space import Space, SpaceError, format_value
from hpo.experiment._trust import CodeRules

__all__ = ["Attempt", "Backend", "Command", "Launch", "LaunchContext", "PredictionLike", "ResumePointLike",
           "TrialConfig", "steps_in"]

if TYPE_CHECKING:
    from hpo.backends._shapes import SequenceLengths


class PredictionLike(Protocol):
    """A memory estimate of one trial (:class:`hpo.backends._preflight.Prediction`)."""

    @property
    def fits(self) -> bool: ...

    @property
    def total(self) -> int: ...

    @property
    def budget(self) -> int: ...

    @property
    def budget_source(self) -> str: ...

    @property
    def problem(self) -> str | None: ...

    @property
    def table(self) -> str: ...


class Backend:
    """A custom trainer command (``trial.command``); subclasses are the trainers the driver knows more about."""

    name: ClassVar[str] = "command"
    supports_pbt: ClassVar[bool] = False  # it resumes a checkpoint at a given step with new values
    ray_hold: ClassVar[bool] = True  # a one-node Ray job may hold its GPUs itself (verl starts its own Ray)
    leaves_scratch: ClassVar[bool] = False  # cleanup removes scratch a killed attempt leaves (swept at driver start)
    checkpoint_layout: ClassVar[CheckpointLayout | None] = None  # set: a retry resumes its chain's newest checkpoint
    # study.kind throughput: keys (fnmatch patterns) that change speed and memory but not the update; a custom
    # command knows none (study.throughput.neutral_keys names them), and the first-step metrics that must agree
    speed_keys: ClassVar[tuple[str, ...]] = ()
    # the metrics a throughput study is scored on (-> the direction a faster run moves them) and the peak-memory
    # metrics it may minimize beside them, in the trainer's names (none: it cannot run a throughput study)
    speed_metrics: ClassVar[dict[str, str]] = {}
    memory_metrics: ClassVar[tuple[str, ...]] = ()
    math_metrics: ClassVar[tuple[str, ...]] = ()

    # ------------------------------------------------------------------ what the trainer knows
    metrics: ClassVar[MetricNames] = MetricNames()  # its metric vocabulary (None: a metric it does not log)
    default_command: ClassVar[tuple[str, ...]] = ()  # trial.command when unset (a leading "python": the driver's)
    default_prepare_command: ClassVar[tuple[str, ...] | None] = None  # trial.prepare_command when unset
    code_keys: ClassVar[tuple[str, ...]] = ()  # key prefixes whose values name code to load (the trust check)
    heldout_keys: ClassVar[tuple[str, ...]] = ()  # the keys of its held-out split (the first: what confirm sets)
    # a validation metric's prefix -> its name on the held-out split ("": any other metric)
    heldout_prefixes: ClassVar[Mapping[str, str]] = {}
    metrics_env: ClassVar[str | None] = None  # an environment variable that tells the trainer its metrics file
    # lines in which the trainer says it dropped a row of its data and went on without it (a row whose reward or
    # generation raised): Python regular expressions searched in each line of its stdout and stderr, before the log
    # cap cuts any (hpo.execution._logpump: a named group `n` counts n rows, `key` counts each value once). A trial's
    # count is its `dropped_rows` attr; more than $VERL_HPO_MAX_DROPPED_ROWS (default 10) fails it. None: ()
    dropped_row_patterns: ClassVar[tuple[str, ...]] = ()
    # study.fidelity.proxy: the keys that name the model (the first: the policy's, actor, rollout and reference), and
    # those that name a tokenizer apart from it; a trainer that names none cannot run a proxy search
    model_keys: ClassVar[tuple[str, ...]] = ()
    tokenizer_keys: ClassVar[tuple[str, ...]] = ()

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
        ``objective.metric`` (:attr:`metrics`; a throughput study's: the first of :attr:`speed_metrics`) and
        ``early_stopping.metric`` (:attr:`metrics`). Run first on every load, stored
        experiments included, so a study made before a default moved still runs the same."""
        trial, objective, early = space.trial, space.objective, space.early_stopping
        if trial.command is None:
            trial = dataclasses.replace(trial, command=self.default_command)
        if objective.mode == "single" and not objective.metric:
            if space.study.kind == "throughput" and self.speed_metrics:  # its first speed metric, faster's way
                metric, direction = next(iter(self.speed_metrics.items()))
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

    def rehearsal(self) -> Any:
        """The module that rehearses this trainer's experiments on the CPU (``rehearse``, ``recheck``,
        ``parse_size``: :mod:`hpo.backends.verl._rehearse`), None when it has none."""
        return None

    def check(self, space: Space, origin: Mapping[str, str]) -> None:
        """SpaceError (one line, naming the file and key) when this trainer would refuse the experiment: the
        quick checks, made whenever an experiment file is loaded."""

    def verify(self, space: Space, origin: Mapping[str, str]) -> None:
        """The thorough checks ``search`` and ``validate`` make before a study exists (they may run the trainer's
        own code in its interpreter)."""

    def check_launch(self, space: Space, *, as_planned: bool = False) -> None:
        """SpaceError (one line naming the fix) when this host cannot launch the trials (e.g. no interpreter with
        the trainer); made by every driver before its first trial. ``as_planned`` (``validate``): check for where the
        experiment says its trials run (e.g. on ``trial.gpus_per_trial`` GPUs), not only where they would land
        on this host."""

    def check_cluster(self, space: Space, address: str, study: str, trials_dir: Path | None) -> list[str]:
        """A Ray-job study (``trial.executor: ray``): what the trials need of the cluster's nodes, checked there
        before the study is made (RayClusterError with one line); notes for the user. ``trials_dir``: where study
        ``study``'s trial directories are (None: not known here)."""
        return []

    def prepare_argv(self, space: Space) -> list[str] | None:
        """The one-off step that builds the model and data before any trial (None: none)."""
        cmd = space.trial.prepare_command
        if not cmd:
            return None
        argv = [sys.executable if c == "python" and i == 0 else c for i, c in enumerate(cmd)]
        return argv + ["--config", space.config, *space.trainer_overrides({})]

    every_key_is_code: ClassVar[bool] = False  # any override may name code to load (verl's hydra ``_target_``)
    default_runs_unasked: ClassVar[bool] = False  # a stored experiment of its own commands, no code: runs untrusted

    # ------------------------------------------------------------------ one attempt
    def configure(self, space: Space, values: Mapping[str, Any], trial_dir: Path,
                  extra: Mapping[str, Any] | None = None, tail: Sequence[str] = ()) -> TrialConfig:
        """The overrides (fixed, tuned ``values`` by name, then ``extra``, which replaces a fixed override of the same
        key, e.g. a confirmation run's seed; ``tail``: overrides that come last, a PBT segment's), total steps and
        ``config.yaml`` text of one attempt."""
        extra = dict(extra or {})
        overrides = [*space.trainer_overrides(dict(values)), *(f"{k}={format_value(v)}" for k, v in extra.items()),
                     *tail]
        return TrialConfig(overrides, steps_in(overrides), self.config_text(space, overrides))

    @staticmethod
    def config_text(space: Space, overrides: Sequence[str]) -> str:
        return yaml.safe_dump({"config": space.config, "overrides": list(overrides)}, sort_keys=False)

    def metrics_path(self, trial_dir: Path, attempt: int) -> Path:
        return trial_dir / "metrics.jsonl"

    def plan(self, attempt: Attempt) -> Launch:
        """One attempt, whole: its config (:meth:`configure`), metrics file (:meth:`metrics_path`, also told through
        ``metrics_env``), the checkpoint a retry continues from (:meth:`resume_point`; else a PBT segment's start)
        and its process (:meth:`command`)."""
        space, trial_dir = attempt.space, attempt.trial_dir
        config = self.configure(space, attempt.values, trial_dir, attempt.extra or None, attempt.tail)
        config.resume_from = attempt.start
        metrics = self.metrics_path(trial_dir, attempt.attempt)
        with lost_checkpoints() as notes:  # a checkpoint passed over: its files refused (hpo.backends._replay)
            point = self.resume_point(attempt.trials_dir, attempt.history) if attempt.history else None
        env = dict(attempt.env)
        if self.metrics_env:
            env[self.metrics_env] = str(metrics)  # the trainer's own metrics-file variable, beside its argv
        ctx = LaunchContext(study=attempt.study, number=attempt.number, trial_dir=trial_dir, attempt=attempt.attempt,
                            metrics=metrics, cwd=attempt.cwd, env=env, devices=attempt.devices,
                            ray_job=attempt.ray_job, resume_from=attempt.start if point is None else point.checkpoint)
        process = self.command(space, config, ctx)
        return Launch(process.argv, process.env, metrics, config, point, process.private_tmp, tuple(notes))

    def command(self, space: Space, config: TrialConfig, ctx: LaunchContext) -> Command:
        """The attempt's process: ``trial.command`` (the driver's interpreter for ``python``) with ``--config``,
        ``--metrics-file`` and the overrides."""
        cmd = list(space.trial.command or self.default_command)
        if cmd and cmd[0] == "python":  # the driver's interpreter (the venv), not whatever is on PATH
            cmd[0] = sys.executable
        return Command([*cmd, "--config", space.config, "--metrics-file", str(ctx.metrics), *config.overrides],
                       dict(ctx.env))

    def command_line(self, space: Space, overrides: Sequence[str]) -> list[str]:
        """The command a user runs to train with ``overrides`` outside the driver (``verl-hpo best --format
        command``): no driver keys, no metrics file."""
        return [*(space.trial.command or self.default_command), "--config", space.config, *overrides]

    def infeasible(self, space: Space, values: Mapping[str, Any]) -> str | None:
        """Why the trainer would refuse the tuned ``values`` (by parameter name) together, in one line; None when it
        accepts them or when this trainer cannot tell without launching (the default: not known). Asked before a
        trial is launched: a trial it refuses is recorded ``fail_reason=infeasible`` with the reason, never launched
        (:mod:`hpo.study._trial`); and at load, a value no combination makes valid refuses the space
        (:func:`hpo.experiment._combos.check_combinations`)."""
        return None

    def answers_infeasible(self) -> bool:
        """This trainer's :meth:`infeasible` says something (it overrides the default)."""
        return type(self).infeasible is not Backend.infeasible

    def predict(self, space: Space, config: TrialConfig, devices: Sequence[str]) -> PredictionLike | None:
        return None

    def corner_predictions(self, space: Space, devices: Sequence[str], lengths: SequenceLengths | None = None
                           ) -> Sequence[tuple[dict[str, Any], PredictionLike]] | None:
        """Each corner of the space (:func:`hpo.backends._preflight.corners`) with its memory estimate on one
        trial's ``devices`` (none: the CPU), at the expected sequence ``lengths`` when given (a previous run's), for
        :func:`hpo.backends._preflight.check_space_fits`. None: this trainer has no estimate (or none can be made
        here), and nothing is refused."""
        return None

    def sequence_lengths(self, path: Path) -> SequenceLengths:
        """``validate --metrics``: the expected sequence lengths read from a previous run's metrics file (SpaceError
        with one line; the base class: this trainer has none to read)."""
        raise SpaceError(f"--metrics {path}: trial.backend {self.name} has no memory estimate to read lengths for")

    def validate(self, space: Space, devices: Sequence[str], out: TextIO,
                 lengths: SequenceLengths | None = None) -> int:
        """``verl-hpo validate``'s memory pre-flight on one trial's ``devices``: each corner's verdict printed to
        ``out`` (:func:`hpo.backends._preflight.report_corners`); 0 when all fit, else 2 with one line on stderr.
        Without an estimate (the base class): what was checked, and 0."""
        what = ("trial.command is not the default trainer: only the space itself was checked"
                if self.name == Backend.name else
                f"trial.backend {self.name}: keys and corners checked by the trainer; no memory estimate")
        print(f"{space.source}: {what}", file=out)
        print("All checks passed", file=out)
        return 0

    def resume_point(self, trials_dir: Path, history: Sequence[int]) -> ResumePointLike | None:
        """The newest complete checkpoint of the retry chain ``history`` (:func:`hpo.backends._replay.resume_point`
        with :attr:`checkpoint_layout`); None: nothing to resume (no layout, no checkpoint)."""
        layout = self.checkpoint_layout
        return None if layout is None else resume_point(trials_dir, history, layout, self.metrics_path)

    def cleanup(self, trial_dir: Path, attempt: int) -> None:
        """After the attempt's process tree is gone (the trial's logs stay)."""

    # ------------------------------------------------------------------ confirmation
    def trainer_version(self, space: Space) -> str | None:
        """What, beside the experiment's own keys, decides a run's result on this host (the trainer's code and the
        libraries it runs on), as a digest; None when unknown: a confirmation's baseline runs are then never reused
        from another study (:func:`hpo.study._confirm.baseline_key`). A custom command: the contents of the files
        its argv names (its script) and the interpreter's version; a trainer whose result depends on other code
        that changes sets ``study.confirm.reuse_baseline: false``."""
        import hashlib

        digest = hashlib.sha256(sys.version.encode())
        for arg in space.trial.command or self.default_command:
            path = Path(arg)
            try:
                if path.is_file() and path.stat().st_size < 50_000_000:
                    digest.update(arg.encode() + b"\0" + path.read_bytes())
            except OSError:
                return None
        return digest.hexdigest()[:16]

    def seed_keys(self, space: Space) -> tuple[str, ...]:
        """The trainer keys of a run's seeds (``study.confirm.seed_key`` wins)."""
        return (space.study.confirm.seed_key,) if space.study.confirm.seed_key else ("trainer.seed",)

    def default_seed(self, space: Space, key: str) -> int | None:
        """The seed a run gets under ``key`` when the experiment does not set it (None: unknown)."""
        return None

    def heldout_overrides(self, space: Space) -> dict[str, Any]:
        """What a confirmation run adds to be measured on the held-out test split ({}: none; see
        :mod:`hpo.experiment._heldout`)."""
        files = space.study.confirm.test_files
        return {self.heldout_keys[0]: files} if files and self.heldout_keys else {}

    def heldout_metric(self, space: Space) -> str | None:
        """The metric a confirmation run's held-out value is read from (None without a held-out split):
        ``study.confirm.test_metric``, else the objective's metric under the trainer's test prefix."""
        if not self.heldout_overrides(space):
            return None
        return space.study.confirm.test_metric or heldout_metric(space.objective.primary_metric, self.heldout_prefixes)

    def heldout_note(self, space: Space) -> str:
        extra = self.heldout_overrides(space)
        if not extra:
            return ""
        split = next(iter(extra.values()))
        return f"confirmation runs also evaluate the held-out test split {split} at their last step"

    def check_heldout(self, space: Space) -> None:
        """Before confirmation runs launch (after the prepare step): SpaceError, one line, when the held-out data
        they would read is missing (None: nothing to check here, the trainer reports it)."""

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

    # ------------------------------------------------------------------ population-based training
    def segment_overrides(self, space: Space, end: int, checkpoint: str | None) -> tuple[list[str], Path | None]:
        """A PBT segment that trains to step ``end`` and saves there, continuing ``checkpoint`` when given: its
        overrides and the checkpoint :meth:`launch` resumes itself (None when the overrides do it)."""
        raise NotImplementedError(f"trial.backend {self.name} does not resume checkpoints for pbt")


def _set_value(overrides: Mapping[str, Any], keys: Sequence[str]) -> str | None:
    """The string value of the first of ``keys`` set in ``overrides`` (a leading ``+`` or ``++`` of hydra's allowed)."""
    for key in keys:
        for k, v in overrides.items():
            if k.lstrip("+") == key and isinstance(v, str) and v.strip() and v.strip() != "null":
                return v.strip()
    return None


def steps_in(overrides: Sequence[str]) -> int | None:
    for o in overrides:
        if o.startswith("trainer.total_training_steps="):
            try:
                return int(o.partition("=")[2])
            except ValueError:
                return None
    return None
