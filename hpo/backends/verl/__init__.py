"""Real verl as a trial backend (``python -m verl.trainer.main_ppo`` in verl's interpreter): ``_launch`` builds a
trial's argv, environment and scratch directory; ``_resume`` finds the checkpoint a retry continues from and the curve
its attempts logged; ``_check`` checks a space's configs with verl's own code, on ``_composer`` (which runs ``_compose``
in verl's interpreter), ``_metric_names`` (what verl logs) and ``_interpreter`` (can it run the trials where they run);
``_compose`` is the script that runs inside verl's interpreter for it (with its neighbours ``_compose_checks``, the
checks verl lacks and what the driver needs to know, and ``_compose_data``, the data files and prompt lengths);
``_batch`` tells which tuned values verl refuses together without verl (``Backend.infeasible``); ``_cpu``
is what a trial that gets no GPU adds to run verl on the CPU (the plugin ``plugins/verl-cpu``, its overrides and
environment) and TransferQueue's size on every host; ``_data`` and ``_arith`` are the shipped tasks' prepare steps
(GSM8K-format data; the arith task with its model and reward for ``search_spaces/verl_grpo_cpu.yaml``); ``_memory`` is
the memory pre-flight of a verl trial (each corner composed in verl's interpreter, judged by verl's memory model:
``_memory_model``, its stages ``_memory_stages``, a model's ``config.json`` from ``_model_config``);
``_rehearsal`` is the backend's ``rehearsal`` feature (``rehearse``'s verl flags and its run) and ``_rehearse``
``verl-hpo rehearse`` itself (the experiment shrunk by ``_shrink`` in verl's interpreter and run on the CPU):
``_rehearse_corners`` its corners and their runs, ``_rehearse_steps`` its steps in verl's interpreter,
``_rehearse_checks`` its checks on what the corners logged and its report, ``_rehearse_state`` what ``--recheck`` reads
back, ``_rehearse_stop`` the stop on a signal.

Nothing of ``verl_core`` (a subprocess of it builds the arith task's model and data), nor another backend.

May import: ``hpo.experiment``, ``hpo.execution``, ``hpo.record``, ``hpo.analysis``, ``hpo.backends``' contract modules
(the base, the attempt, the features, the loader, the pre-flight, the shared shapes ``_shapes``, the replay, ...)."""

from hpo.backends._replay import replay_records
from hpo.backends.verl._backend import SEED_DEFAULTS, VerlBackend
from hpo.backends.verl._check import (
    COMPOSE_SCRIPT,
    SKIP_INTERPRETER_CHECK,
    ComposedConfig,
    ComposeReport,
    Corner,
    VerlConfigError,
    check_space,
    check_verl_launch,
    check_verl_metrics,
    check_verl_space,
    compose_corners,
    interpreter_problem,
    space_corners,
    trial_base_env,
    val_core_metric,
    verl_metric_examples,
    verl_metric_ok,
)
from hpo.backends.verl._launch import (
    DEFAULT_CONFIG,
    DEFAULT_VENV,
    DRIVER_KEYS,
    GPU_INSTALL_HINT,
    GPU_VENV,
    INSTALL_HINT,
    MAIN_MODULE,
    config_args,
    default_python,
    format_override,
    format_value,
    is_config_path,
    override_key,
    scratch_dir,
    verl_argv,
    verl_cleanup,
    verl_env,
    verl_job_env,
    verl_metrics_path,
    verl_overrides,
)
from hpo.backends.verl._resume import (
    CHECKPOINT_TRACKER,
    ResumePoint,
    attempt_files,
    checkpoint_complete,
    checkpoint_step,
    resume_checkpoints,
    resume_point,
    resumed_from,
)

BACKEND = VerlBackend  # what the registry runs for trial.backend: verl

__all__ = [
    "BACKEND", "CHECKPOINT_TRACKER", "COMPOSE_SCRIPT", "SEED_DEFAULTS", "VerlBackend",
    "DEFAULT_CONFIG", "DEFAULT_VENV", "DRIVER_KEYS", "GPU_INSTALL_HINT",
    "GPU_VENV", "INSTALL_HINT", "MAIN_MODULE", "SKIP_INTERPRETER_CHECK", "ComposeReport", "ComposedConfig", "Corner",
    "ResumePoint", "VerlConfigError", "attempt_files", "check_space", "check_verl_launch", "check_verl_metrics",
    "check_verl_space", "checkpoint_complete", "checkpoint_step", "compose_corners", "config_args", "default_python",
    "format_override", "format_value", "interpreter_problem", "is_config_path", "override_key", "replay_records",
    "resume_checkpoints", "resume_point", "resumed_from", "scratch_dir", "space_corners", "trial_base_env",
    "val_core_metric", "verl_argv", "verl_cleanup", "verl_env", "verl_job_env", "verl_metric_examples",
    "verl_metric_ok", "verl_metrics_path", "verl_overrides",
]
