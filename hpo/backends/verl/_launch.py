"""Real verl as a trial backend: ``python -m verl.trainer.main_ppo`` in verl's own interpreter.

The driver talks to a verl trial exactly as to ``verl_core``: argv (hydra overrides), environment and the JSONL
file of verl's ``file`` logger. Nothing here imports torch, hydra or verl; the only code that does is
``hpo/backends/verl/_compose.py``, which ``_composer.check_space`` runs in verl's interpreter before a study is created.
Here: the argv, the environment and the scratch directory of one attempt; ``_resume`` finds the checkpoint a retry
continues from, ``_check`` and ``_interpreter`` check a space and an interpreter with verl's own code.

What a verl trial is (:func:`verl_argv`, :func:`verl_env`):

* ``python -m verl.trainer.main_ppo [--config-path DIR --config-name NAME] <overrides> <params> <driver keys>``.
  The driver keys (:data:`DRIVER_KEYS`) come last so that they win: ``trainer.logger`` (``console`` and
  ``file`` added to the space's own loggers), ``trainer.project_name=<study>``,
  ``trainer.experiment_name=trial-<n>``, ``trainer.default_local_dir=<checkpoints>``,
  ``trainer.n_gpus_per_node=<the trial's GPUs, at least 1>``, ``trainer.nnodes=1`` (a multi-node run is tuned
  shrunk to one node; a Ray-job trial gets ``trial.ray.nodes`` x ``trial.ray.num_gpus``, docs/ray.md),
  ``trainer.resume_mode=auto`` (a retry: ``resume_path`` and ``trainer.resume_from_path``),
  ``hydra.run.dir=<trial dir>/hydra`` (hydra's ``outputs/`` would otherwise land in
  the driver's working directory) and ``++ray_kwargs.ray_init.include_dashboard=false``.
* A trial handed no devices (a host without a GPU, or ``trial.gpus_per_trial: 0``) runs verl on the CPU: verl gets
  ``n_gpus_per_node=1`` (one logical GPU of its own Ray cluster stands for the CPU worker), the CPU platform plugin
  through verl's external-module hook, and the overrides and environment of :mod:`hpo.backends.verl._cpu`
  (keys the experiment sets itself are left alone). Every trial, GPU or not, gets TransferQueue storage actors that
  fit the host's CPUs (``_cpu.transfer_queue_overrides``). Validation uses ``trial.gpus_per_trial``, not the
  devices found.
* Metrics: verl's ``FileLogger`` opens ``$VERL_FILE_LOGGER_PATH`` with ``"wb"``; every attempt gets its own file
  (:func:`verl_metrics_path`), so a restart never wipes the steps an earlier attempt logged.
* Retries resume: every attempt saves into its own ``<trial dir>/checkpoints``. A retry of an interrupted trial
  (``retry_history`` of the Optuna trial) continues from the newest complete checkpoint of any earlier attempt
  of its chain (``_resume.resume_point``; complete = every piece verl's ``_load_checkpoint`` reads, whatever the
  tracker file says: verl removes the previous ``actor/`` before it rewrites the tracker) with
  ``trainer.resume_mode=resume_path trainer.resume_from_path=<global_step_N>``. The steps that the attempts
  leading to that checkpoint logged are read back by ``_resume.replay_records`` (``ResumePoint.records``).
  Across hosts this needs the studies directory on a shared filesystem; without a checkpoint the retry starts
  afresh.
* Ray: every ``main_ppo`` calls ``ray.init()`` and starts its own local cluster. A trial must not join another
  one: ``RAY_ADDRESS`` is removed and ``RAY_TMPDIR`` (with ``TMPDIR``) points at a scratch directory of its own
  (:func:`scratch_dir`), so Ray's ``ray_current_cluster`` lookup finds nothing of other trials. Ray 2.60's local
  clusters take random ports for GCS, raylet, agents and workers; the dashboard UI is turned off (its minimal head
  process still starts, trying 8265 and the next 50 ports until one is free).
  The scratch directory is short because Ray puts Unix sockets under it
  (``<RAY_TMPDIR>/ray/session_<date>_<pid>/sockets/plasma_store``, 68 characters after the root; Linux allows 107).
  verl never calls ``ray.shutdown()`` (verl#2012): the Ray processes (GCS, raylet, workers, vLLM servers) are
  descendants of the trial, so the trial wrapper's kill of the whole tree and the trial's cgroup cover them;
  :func:`verl_cleanup` then removes the scratch directory (keeping Ray's logs of a failed trial). Ray 2.60 turns
  token authentication on for local clusters and would write ``~/.ray/auth_token``, one file for every trial;
  each trial gets its own token in its environment instead (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN``).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import secrets
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpo.backends._first_rollout import first_rollout_asked
from hpo.backends.verl._cpu import EXTERNAL_MODULES_ENV, JOB_ENV, cpu_env, cpu_overrides, transfer_queue_overrides

if TYPE_CHECKING:
    from hpo.experiment import Space

DEFAULT_CONFIG = "ppo_trainer"
MAIN_MODULE = "verl.trainer.main_ppo"
DEFAULT_VENV = ".venv-verl"
GPU_VENV = ".venv-gpu-verl"  # `make install-verl-gpu`: verl[vllm]==0.9.1 with its CUDA torch
INSTALL_HINT = "run `make install-verl`, or set trial.python to the interpreter of a venv with verl==0.9.1"
GPU_INSTALL_HINT = (f"run `make install-verl-gpu` (verl[vllm]==0.9.1 with CUDA torch in {GPU_VENV}, used by default "
                    "once it exists) or set trial.python to such an interpreter")
# Keys the driver sets on every verl trial; a space must not set them (trainer.logger is merged, not set).
DRIVER_KEYS = ("trainer.project_name", "trainer.experiment_name", "trainer.default_local_dir",
               "trainer.n_gpus_per_node", "trainer.nnodes", "trainer.resume_mode", "trainer.resume_from_path",
               "hydra.run.dir")
RAY_DASHBOARD_KEY = "ray_kwargs.ray_init.include_dashboard"
# Ray's Unix sockets live at <RAY_TMPDIR>/ray/session_<26-char date>_<pid <= 7 digits>/sockets/plasma_store:
# 68 characters after the root, and Linux caps a socket path at 107 bytes.
MAX_SCRATCH_LEN = 107 - 68


# ----------------------------------------------------------------------------- hydra override syntax
_UNQUOTED = re.compile(r"^[A-Za-z0-9_/\-+.$%*@?|:]+$")  # hydra's unquoted-value characters (OverrideLexer)
_NUMBER = re.compile(r"^[+-]?(\d[\d_]*)?(\.[\d_]*)?([eE][+-]?\d+)?$")
_KEYWORDS = {"true", "false", "null", "inf", "+inf", "-inf", "nan", "+nan", "-nan"}

# verl 0.9.1 catches these per row and trains (or validates) on without the row: trainer/ppo/v1/agent_loop_tq.py's
# _run_prompt logs each failed session of a prompt ("for uid=": the prompt; a reward that raises ends here) or the
# prompt itself; the limited reward manager scores a failed call 0. Ray folds repeats from several workers into
# one "[repeated Nx across cluster]" line (Ray's log deduplication): counted N times (Backend.dropped_row_patterns).
DROPPED_ROW_PATTERNS = (
    r"Error in _run_prompt for uid=(?P<key>[\w-]+)(?:.*\[repeated (?P<n>\d+)x across cluster\])?",
    r"Error in _run_prompt: (?:.*\[repeated (?P<n>\d+)x across cluster\])?",
    r"Reward computation failed for data_source=(?:.*\[repeated (?P<n>\d+)x across cluster\])?",
)
# Ray's own line when the local node it starts for verl does not come up in time (ray/_private/node.py, a fixed 30 s):
# the host is too busy to start Ray, which says nothing of the experiment (seen on 2 cores with two other verl runs
# beside it). Backend.host_failure_lines: a trial that fails on it is retried; rehearse says "not finished here".
RAY_START_TIMEOUT = "The current node timed out during startup"


def _quote(text: str) -> str:
    """``'text'`` with hydra's escapes: a quote becomes ``\\'`` and backslashes right before a quote or the end
    are doubled (elsewhere hydra keeps them as they are)."""
    body = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), text)
    return f"'{body}'"


def format_value(value: Any) -> str:
    """A Python value as the right-hand side of a hydra override (``null``, ``true``, ``1e-06``, ``[a,b]``,
    ``{k:v}``; a string is quoted when hydra would read it as something else or cannot parse it bare)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else repr(value)  # repr: 1e-06, inf, -inf, 0.1
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{format_value(str(k))}:{format_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if (not _UNQUOTED.match(text) or text.lower() in _KEYWORDS
            or (_NUMBER.match(text) and any(c.isdigit() for c in text))):
        return _quote(text)
    return text


def format_override(key: str, value: Any) -> str:
    """``key=value`` in hydra's override syntax; a ``+``/``++``/``~`` prefix of the space's key is kept."""
    return f"{key}={format_value(value)}"


def override_key(key_or_override: str) -> str:
    """The dotted key of ``+key=value`` / ``++key`` / ``~key`` / ``key``."""
    key = key_or_override.split("=", 1)[0].strip()
    return key.lstrip("+~")


def verl_overrides(fixed: Mapping[str, Any], values: Mapping[str, Any]) -> list[str]:
    """Fixed overrides then the sampled values, both ``{trainer key: value}``, as hydra overrides."""
    return [format_override(k, v) for k, v in fixed.items()] + [format_override(k, v) for k, v in values.items()]


def trial_gpus(space: Space) -> int:
    """GPUs per node of a trial: ``trial.ray.num_gpus`` for a Ray-job study, else ``trial.gpus_per_trial``."""
    return space.trial.ray.num_gpus if space.trial.executor == "ray" else space.trial.gpus_per_trial


def trial_nodes(space: Space) -> int:
    """Nodes of a trial: ``trial.ray.nodes`` for a Ray-job study (``trainer.nnodes``), else 1."""
    return space.trial.ray.nodes if space.trial.executor == "ray" else 1


# ----------------------------------------------------------------------------- the command
def is_config_path(config: str) -> bool:
    return config.endswith((".yaml", ".yml")) or "/" in config


def config_args(config: str) -> list[str]:
    """Hydra's arguments selecting the config: none for verl's default ``ppo_trainer``, ``--config-name`` for
    another config shipped with verl, ``--config-path <absolute dir> --config-name <stem>`` for a user YAML."""
    if is_config_path(config):
        path = Path(config).expanduser().resolve()
        return ["--config-path", str(path.parent), "--config-name", path.stem]
    return [] if config == DEFAULT_CONFIG else ["--config-name", config]


def _merged_loggers(overrides: Sequence[str], base: Sequence[str] = ("console", "file")) -> tuple[list[str], str]:
    """The overrides without ``trainer.logger``, and ``trainer.logger=[<base>,<the space's others>]`` (``base``: the
    console, and the ``file`` logger that feeds the driver)."""
    loggers = list(base)
    rest = []
    for o in overrides:
        if override_key(o) != "trainer.logger":
            rest.append(o)
            continue
        rhs = o.split("=", 1)[1].strip().strip("[]")
        for item in rhs.split(","):
            name = item.strip().strip("'\"")
            if name and name not in loggers:
                loggers.append(name)
    return rest, format_override("trainer.logger", loggers)


def verl_argv(python: str, config: str, overrides: Sequence[str], study: str, trial_number: int, trial_dir: Path,
              n_gpus: int, resume_from: Path | None = None, nnodes: int = 1, *, cpu: bool | None = None,
              joins_cluster: bool = False, cpus: int | None = None, checkpoints: Path | None = None) -> list[str]:
    """The argv of one verl trial (see the module docstring for each driver key).

    ``overrides``: the space's fixed overrides and sampled parameters (:func:`verl_overrides`).
    ``n_gpus``: devices handed to this trial (per node); 0 runs verl on the CPU (:mod:`hpo.backends.verl._cpu`,
    ``trainer.n_gpus_per_node=1``: one logical GPU).
    ``nnodes``: 1 locally; ``trial.ray.nodes`` for a Ray job (``n_gpus`` is then ``trial.ray.num_gpus``).
    ``resume_from``: the ``global_step_N`` checkpoint a retry continues from (:func:`resume_checkpoints`):
    ``trainer.resume_mode=resume_path trainer.resume_from_path=<it>``; else ``resume_mode=auto``. Every
    attempt saves into its own ``<trial_dir>/checkpoints`` (``checkpoints``: elsewhere, a Ray cluster's shared dir).
    ``cpu``: the CPU platform (default: when ``n_gpus`` is 0); ``joins_cluster``: a Ray job on the user's cluster,
    whose resources are its own (no ``ray_init`` sizes; ``cpus``: the logical CPUs the trial holds there, what its
    TransferQueue storage actors are sized to).
    """
    rest, loggers = _merged_loggers(overrides)
    cpu = n_gpus == 0 if cpu is None else cpu
    platform = _platform(rest, cpu, joins_cluster, cpus)
    resume = ([format_override("trainer.resume_mode", "auto")] if resume_from is None else
              [format_override("trainer.resume_mode", "resume_path"),
               format_override("trainer.resume_from_path", str(resume_from))])
    argv = [python, "-m", MAIN_MODULE, *config_args(config), *rest, *platform, loggers,
            format_override("trainer.project_name", study),
            format_override("trainer.experiment_name", f"trial-{trial_number}"),
            format_override("trainer.default_local_dir", str(checkpoints or trial_dir / "checkpoints")),
            format_override("trainer.n_gpus_per_node", max(1, n_gpus)),
            format_override("trainer.nnodes", nnodes),
            *resume,
            format_override("hydra.run.dir", str(trial_dir / "hydra"))]
    return argv + _dashboard(rest)


def _platform(rest: Sequence[str], cpu: bool, joins_cluster: bool, cpus: int | None) -> list[str]:
    """The platform's overrides: the CPU platform's (``cpu``), TransferQueue sized to the host."""
    return [*(cpu_overrides(rest, joins_cluster) if cpu else []),
            *transfer_queue_overrides(rest, cpu and not joins_cluster, cpus)]


def _dashboard(rest: Sequence[str]) -> list[str]:
    """Ray's dashboard off unless the experiment says."""
    return [] if any(override_key(o) == RAY_DASHBOARD_KEY for o in rest) else [
        format_override("++" + RAY_DASHBOARD_KEY, False)]


def verl_command_line(python: str, config: str, overrides: Sequence[str], n_gpus: int, nnodes: int = 1, *,
                      cpu: bool | None = None, joins_cluster: bool = False, cpus: int | None = None) -> list[str]:
    """What a user runs to train as a trial with ``overrides`` did, outside the driver (``verl-hpo best --format
    command``): :func:`verl_argv`'s argv without the driver's own places and names (``trainer.project_name``,
    ``experiment_name``, the trial's ``default_local_dir``, ``resume_mode``, ``hydra.run.dir``) and without the
    ``file`` logger that feeds the driver; the platform's overrides, the devices and the dashboard switch as the
    trial had them. Its environment: :func:`verl_command_env`."""
    rest, loggers = _merged_loggers(overrides, base=("console",))
    cpu = n_gpus == 0 if cpu is None else cpu
    return [python, "-m", MAIN_MODULE, *config_args(config), *rest, *_platform(rest, cpu, joins_cluster, cpus),
            loggers, format_override("trainer.n_gpus_per_node", max(1, n_gpus)),
            format_override("trainer.nnodes", nnodes), *_dashboard(rest)]


def verl_command_env(env: Mapping[str, str], cpu: bool, ray_job: bool = False) -> tuple[dict[str, str], list[str]]:
    """What :func:`verl_command_line` needs of its environment beyond ``env`` (the experiment's ``trial.env``, its
    secrets left out), as a trial got it (:func:`verl_env`, :func:`verl_job_env`): the variables to set (``cpu``: the
    CPU platform's, :func:`~hpo.backends.verl._cpu.cpu_env`; a Ray job: verl's ``runtime_env`` over the job's) and to
    unset (``cpu``: ``CUDA_VISIBLE_DEVICES``; a local trial never joins a cluster named by ``RAY_ADDRESS``). The
    driver's own (metrics file, scratch directories, Ray's auth token) are not: they name the trial's places."""
    out = cpu_env(env) if cpu else dict(env)
    if ray_job:
        out["RAY_OVERRIDE_JOB_RUNTIME_ENV"] = JOB_ENV["RAY_OVERRIDE_JOB_RUNTIME_ENV"]
    changed = {k: v for k, v in out.items() if env.get(k) != v}
    unset = [*(["CUDA_VISIBLE_DEVICES"] if cpu else []), *([] if ray_job else ["RAY_ADDRESS"])]
    return changed, unset


# Continuing another run's checkpoint with new hyperparameters (study.strategy pbt). verl 0.9.1's
# FSDPCheckpointManager.load_checkpoint restores the optimizer's state dict (its param_groups' lr and initial_lr) and
# the LR scheduler's (its base_lrs), so on resume the checkpoint's learning rate wins over the config's at every later
# step. Loading the weights only (checkpoint.load_contents=[model]; the data position in data.pt is restored by the
# trainer either way) leaves the optimizer and scheduler as the config built them: the new learning rate is used
# from the first step, and Adam's moments (and a warm-up) start afresh. Checked with verl's own checkpoint manager
# in tests/hpo/backends/verl/test_launch.py.
WEIGHTS_ONLY_KEYS = ("actor_rollout_ref.actor.checkpoint.load_contents", "critic.checkpoint.load_contents")


def weights_only_overrides() -> list[str]:
    """The overrides that make a resumed verl run use its config's optimizer hyperparameters (see above)."""
    return [format_override(k, ["model"]) for k in WEIGHTS_ONLY_KEYS]


PROJECT_ROOT = Path(__file__).resolve().parents[3]  # where `make install-verl` puts its venvs (this checkout)


def default_python(root: str | os.PathLike[str] | None = None) -> str:
    """verl's interpreter when ``trial.python`` is not set, the first that exists under ``root`` (default: this
    project's checkout, wherever the driver is started from; issue 43 found ``validate`` in an experiment's own
    directory saying verl "is not installed" right after ``make install-verl``):
    ``.venv-gpu-verl/bin/python`` (``make install-verl-gpu``, what GPU trials need),
    ``.venv-verl/bin/python`` (``make install-verl``: verl on the CPU, ``hpo.backends.verl._cpu``); else the
    driver's own."""
    for venv in (GPU_VENV, DEFAULT_VENV):
        python = Path(PROJECT_ROOT if root is None else root) / venv / "bin" / "python"
        if python.exists():
            return str(python)
    return sys.executable


# ----------------------------------------------------------------------------- environment and scratch
def verl_metrics_path(trial_dir: Path, attempt: int = 0) -> Path:
    """``metrics.jsonl`` for a first attempt, ``metrics.attempt<k>.jsonl`` for the k-th retry."""
    return trial_dir / ("metrics.jsonl" if attempt == 0 else f"metrics.attempt{attempt}.jsonl")


def scratch_dir(trial_dir: Path, attempt: int = 0) -> Path:
    """The attempt's own ``TMPDIR``/``RAY_TMPDIR``: ``<trial_dir>/tmp`` when that is short enough for Ray's
    sockets (:data:`MAX_SCRATCH_LEN`), else ``/tmp/vhpo-<uid>-<hash of the trial dir>-<attempt>``."""
    inside = trial_dir.resolve() / (f"tmp{attempt}" if attempt else "tmp")
    if len(str(inside)) <= MAX_SCRATCH_LEN:
        return inside
    base = tempfile.gettempdir()
    base = base if len(base) <= 12 else "/tmp"
    digest = hashlib.sha1(str(trial_dir.resolve()).encode()).hexdigest()[:10]
    return Path(base) / f"vhpo-{os.getuid()}-{digest}-{attempt}"


def _fresh_scratch(scratch: Path) -> None:
    """Create the scratch directory afresh (a leftover of an earlier run of the same trial directory goes),
    private to this user; refuse a path someone else put there (a link, another owner)."""
    if scratch.is_symlink() or (scratch.exists() and scratch.stat().st_uid != os.getuid()):
        raise OSError(f"{scratch} exists and is not this user's directory; remove it")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True, mode=0o700)


def verl_env(base_env: Mapping[str, str], trial_dir: Path, attempt: int = 0, cpu: bool = False) -> dict[str, str]:
    """``base_env`` (the driver's trial environment: CUDA_VISIBLE_DEVICES, tags, trial.env) plus what isolates
    one verl attempt: its own metrics file and scratch directory (created afresh here), no shared Ray cluster,
    a Ray auth token of its own, tracker output inside the trial directory, full hydra errors; with ``cpu`` (a
    trial handed no devices) the CPU platform's (:func:`hpo.backends.verl._cpu.cpu_env`)."""
    env = cpu_env(base_env) if cpu else dict(base_env)
    trial_dir = trial_dir.absolute()  # the file logger opens its path in a Ray worker
    scratch = scratch_dir(trial_dir, attempt)
    _fresh_scratch(scratch)
    env["VERL_FILE_LOGGER_PATH"] = str(verl_metrics_path(trial_dir, attempt))
    env["RAY_TMPDIR"] = str(scratch)  # Ray's temp root: sessions, sockets, logs, spilled objects
    env["TMPDIR"] = str(scratch)  # everything else that uses tempfile (vLLM's IPC sockets, compile caches)
    env.pop("RAY_ADDRESS", None)  # never join a cluster the user or another trial started
    env["RAY_USAGE_STATS_ENABLED"] = "0"  # no usage report (no network, no prompt)
    if "RAY_AUTH_MODE" not in env:  # Ray 2.60 would write ~/.ray/auth_token, shared by every trial; instead each
        env["RAY_AUTH_MODE"] = "token"  # trial's cluster gets a token of its own, in its environment only
        env["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    env.setdefault("WANDB_DIR", str(trial_dir))  # wandb/ and tensorboard_log/ would land in the driver's cwd
    env.setdefault("TENSORBOARD_DIR", str(trial_dir / "tensorboard"))
    env["HYDRA_FULL_ERROR"] = "1"  # the real final exception on stderr, for the driver's failure labels
    env["PYTHONUNBUFFERED"] = "1"
    return first_rollout_env(env)


IN_VERL = Path(__file__).resolve().parent / "in_verl"  # modules verl's processes load by its external-module hook
FIRST_ROLLOUT_MODULE = "verl_hpo_first_rollout"


def first_rollout_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the first-rollout record/replay module (:data:`FIRST_ROLLOUT_MODULE`) loaded in every verl process
    by verl's external-module hook, when the driver asked for it (``hpo.backends._first_rollout``)."""
    if first_rollout_asked(env):
        modules = [m for m in env.get(EXTERNAL_MODULES_ENV, "").split(",") if m.strip()]
        env[EXTERNAL_MODULES_ENV] = ",".join([*modules, FIRST_ROLLOUT_MODULE])
        env["PYTHONPATH"] = os.pathsep.join([str(IN_VERL), *filter(None, [env.get("PYTHONPATH")])])
    return env


def verl_job_env(base_env: Mapping[str, str], trial_dir: Path, attempt: int = 0, cpu: bool = False) -> dict[str, str]:
    """The environment of a verl trial run as a Ray job (``trial.executor: ray``): verl joins the job's cluster
    (Ray's job supervisor sets ``RAY_ADDRESS``), so none of :func:`verl_env`'s isolation from other Ray clusters
    applies; only its metrics file, full hydra errors, unbuffered output, verl's own ``runtime_env`` over the job's
    (:data:`~hpo.backends.verl._cpu.JOB_ENV`) and, with ``cpu`` (a cluster of logical GPUs), the CPU platform's
    environment, which the job's ``env_vars`` carry to every actor verl starts."""
    env = {**(cpu_env(base_env) if cpu else base_env), **JOB_ENV}
    env["VERL_FILE_LOGGER_PATH"] = str(verl_metrics_path(trial_dir.absolute(), attempt))
    env["HYDRA_FULL_ERROR"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def verl_cleanup(trial_dir: Path, attempt: int = 0, keep_logs: bool = False) -> None:
    """Remove the attempt's scratch directory after its process tree is gone; with ``keep_logs`` (a failed
    trial) Ray's logs of the latest session are first copied to ``<trial_dir>/ray_logs[<attempt>]``."""
    scratch = scratch_dir(trial_dir, attempt)
    if not scratch.is_dir():
        return
    logs = scratch / "ray" / "session_latest" / "logs"
    if keep_logs and logs.is_dir():
        dest = trial_dir / (f"ray_logs{attempt}" if attempt else "ray_logs")
        shutil.copytree(logs, dest, symlinks=True, dirs_exist_ok=True, ignore_dangling_symlinks=True)
    shutil.rmtree(scratch, ignore_errors=True)
