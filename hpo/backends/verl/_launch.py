"""Real verl as a trial backend: ``python -m verl.trainer.main_ppo`` in verl's own interpreter.

The driver talks to a verl trial exactly as to ``verl_core``: argv (hydra overrides), environment and the JSONL
file of verl's ``file`` logger. Nothing here imports torch, hydra or verl; the only code that does is
``hpo/backends/verl/_compose.py``, which :func:`check_space` runs in verl's interpreter before a study is created.

What a verl trial is (:func:`verl_argv`, :func:`verl_env`):

* ``python -m verl.trainer.main_ppo [--config-path DIR --config-name NAME] <overrides> <params> <driver keys>``.
  The driver keys (:data:`DRIVER_KEYS`) come last so that they win: ``trainer.logger`` (``console`` and
  ``file`` added to the space's own loggers), ``trainer.project_name=<study>``,
  ``trainer.experiment_name=trial-<n>``, ``trainer.default_local_dir=<checkpoints>``,
  ``trainer.n_gpus_per_node=<the trial's GPUs, at least 1>``, ``trainer.nnodes=1`` (a multi-node run is tuned
  shrunk to one node), ``trainer.resume_mode=auto`` (a retry: ``resume_path`` and ``trainer.resume_from_path``),
  ``hydra.run.dir=<trial dir>/hydra`` (hydra's ``outputs/`` would otherwise land in
  the driver's working directory) and ``++ray_kwargs.ray_init.include_dashboard=false``.
* GPUs on a CPU-only host: the driver hands out no devices (``CUDA_VISIBLE_DEVICES=""``) and verl gets
  ``n_gpus_per_node=1``, the smallest value its config accepts. verl 0.9.1 has no CPU platform: such a trial
  starts Ray and then waits for ever for actors that need a GPU (measured: still pending after 120 s), so only
  ``trial.timeout_s`` ends it. Validation uses ``trial.gpus_per_trial``, not the devices found.
* Metrics: verl's ``FileLogger`` opens ``$VERL_FILE_LOGGER_PATH`` with ``"wb"``; every attempt gets its own file
  (:func:`verl_metrics_path`), so a restart never wipes the steps an earlier attempt logged.
* Retries resume: every attempt saves into its own ``<trial dir>/checkpoints``. A retry of an interrupted trial
  (``retry_history`` of the Optuna trial) continues from the newest complete checkpoint of any earlier attempt
  of its chain (:func:`resume_point`; complete = every piece verl's ``_load_checkpoint`` reads, whatever the
  tracker file says: verl removes the previous ``actor/`` before it rewrites the tracker) with
  ``trainer.resume_mode=resume_path trainer.resume_from_path=<global_step_N>``. The steps that the attempts
  leading to that checkpoint logged are read back by :func:`replay_records` (:meth:`ResumePoint.records`).
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
import json
import math
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpo.execution._metrics import MetricsTail

if TYPE_CHECKING:
    from hpo.experiment._space import Space

DEFAULT_CONFIG = "ppo_trainer"
MAIN_MODULE = "verl.trainer.main_ppo"
COMPOSE_SCRIPT = Path(__file__).with_name("_verl_compose.py")
DEFAULT_VENV = ".venv-verl"
GPU_VENV = ".venv-gpu-verl"  # `make install-verl-gpu`: verl[vllm]==0.9.1 with its CUDA torch
INSTALL_HINT = "run `make install-verl`, or set trial.python to the interpreter of a venv with verl==0.9.1"
GPU_INSTALL_HINT = (f"run `make install-verl-gpu` (verl[vllm]==0.9.1 with CUDA torch in {GPU_VENV}, used by default "
                    "once it exists) or set trial.python to such an interpreter")
# In a trial's environment (trial.env): trials run a stand-in for main_ppo on the CPU (the tests), so the
# interpreter is not required to have CUDA torch, vLLM or flash-attn.
SKIP_INTERPRETER_CHECK = "VERL_HPO_SKIP_INTERPRETER_CHECK"
# Keys the driver sets on every verl trial; a space must not set them (trainer.logger is merged, not set).
DRIVER_KEYS = ("trainer.project_name", "trainer.experiment_name", "trainer.default_local_dir",
               "trainer.n_gpus_per_node", "trainer.nnodes", "trainer.resume_mode", "trainer.resume_from_path",
               "hydra.run.dir")
RAY_DASHBOARD_KEY = "ray_kwargs.ray_init.include_dashboard"
CHECKPOINT_TRACKER = "latest_checkpointed_iteration.txt"  # verl's trainer writes it after each checkpoint
# Ray's Unix sockets live at <RAY_TMPDIR>/ray/session_<26-char date>_<pid <= 7 digits>/sockets/plasma_store:
# 68 characters after the root, and Linux caps a socket path at 107 bytes.
MAX_SCRATCH_LEN = 107 - 68


class VerlConfigError(ValueError):
    """A verl config, corner or metric verl rejects; ``str(err)`` is one line naming the key and the value.

    ``where`` names the experiment field (``config``, ``overrides.<key>``, ``params.<name>``, ``params``,
    ``objective.metric``, ``trial.python``, ...) in the form :class:`hpo.experiment._space.SpaceError` messages use.
    """

    def __init__(self, message: str, where: str = "", corner: int | None = None, key: str | None = None,
                 value: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.where = where
        self.corner = corner
        self.key = key
        self.value = value


# ----------------------------------------------------------------------------- hydra override syntax
_UNQUOTED = re.compile(r"^[A-Za-z0-9_/\-+.$%*@?|:]+$")  # hydra's unquoted-value characters (OverrideLexer)
_NUMBER = re.compile(r"^[+-]?(\d[\d_]*)?(\.[\d_]*)?([eE][+-]?\d+)?$")
_KEYWORDS = {"true", "false", "null", "inf", "+inf", "-inf", "nan", "+nan", "-nan"}


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


def _merged_loggers(overrides: Sequence[str]) -> tuple[list[str], str]:
    """The overrides without ``trainer.logger``, and ``trainer.logger=[console,file,<the space's others>]``."""
    loggers = ["console", "file"]
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
              n_gpus: int, resume_from: Path | None = None) -> list[str]:
    """The argv of one verl trial (see the module docstring for each driver key).

    ``overrides``: the space's fixed overrides and sampled parameters (:func:`verl_overrides`).
    ``n_gpus``: devices handed to this trial; 0 (a CPU-only host) becomes 1, the least verl accepts.
    ``resume_from``: the ``global_step_N`` checkpoint a retry continues from (:func:`resume_checkpoints`):
    ``trainer.resume_mode=resume_path trainer.resume_from_path=<it>``; else ``resume_mode=auto``. Every
    attempt saves into its own ``<trial_dir>/checkpoints``.
    """
    rest, loggers = _merged_loggers(overrides)
    resume = ([format_override("trainer.resume_mode", "auto")] if resume_from is None else
              [format_override("trainer.resume_mode", "resume_path"),
               format_override("trainer.resume_from_path", str(resume_from))])
    argv = [python, "-m", MAIN_MODULE, *config_args(config), *rest, loggers,
            format_override("trainer.project_name", study),
            format_override("trainer.experiment_name", f"trial-{trial_number}"),
            format_override("trainer.default_local_dir", str(trial_dir / "checkpoints")),
            format_override("trainer.n_gpus_per_node", max(1, n_gpus)),
            format_override("trainer.nnodes", 1),
            *resume,
            format_override("hydra.run.dir", str(trial_dir / "hydra"))]
    if not any(override_key(o) == RAY_DASHBOARD_KEY for o in rest):
        argv.append(format_override("++" + RAY_DASHBOARD_KEY, False))
    return argv


def default_python(cwd: str | os.PathLike[str] = ".") -> str:
    """verl's interpreter when ``trial.python`` is not set, the first that exists under ``cwd``:
    ``.venv-gpu-verl/bin/python`` (``make install-verl-gpu``, what GPU trials need),
    ``.venv-verl/bin/python`` (``make install-verl``, CPU: configs are checked, trials cannot run); else the
    driver's own."""
    for venv in (GPU_VENV, DEFAULT_VENV):
        python = Path(cwd) / venv / "bin" / "python"
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


def verl_env(base_env: Mapping[str, str], trial_dir: Path, attempt: int = 0) -> dict[str, str]:
    """``base_env`` (the driver's trial environment: CUDA_VISIBLE_DEVICES, tags, trial.env) plus what isolates
    one verl attempt: its own metrics file and scratch directory (created afresh here), no shared Ray cluster,
    a Ray auth token of its own, tracker output inside the trial directory, full hydra errors."""
    env = dict(base_env)
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


# ----------------------------------------------------------------------------- retries and resume
_STEP_DIR = re.compile(r"^global_step_(\d+)$")
_SHARD = re.compile(r"^(model|optim|extra_state)_world_size_(\d+)_rank_(\d+)\.pt$")


def _shards_complete(folder: Path) -> bool:
    """An FSDP checkpoint of one role (``actor/``, ``critic/``) as verl's ``FSDPCheckpointManager.load_checkpoint``
    opens it: ``model_world_size_W_rank_r.pt`` for every rank r < W, and the ``optim_``/``extra_state_`` shards
    of every rank when that kind was saved at all (``checkpoint.save_contents``). A Megatron checkpoint
    (``dist_ckpt/``) counts when that directory is there."""
    try:
        names = [p.name for p in folder.iterdir()]
    except OSError:
        return False
    if "dist_ckpt" in names:
        return True
    shards: dict[str, set[tuple[int, int]]] = {}
    for name in names:
        m = _SHARD.match(name)
        if m:
            shards.setdefault(m.group(1), set()).add((int(m.group(2)), int(m.group(3))))
    model = shards.get("model", set())
    sizes = {w for w, _ in model}
    if len(sizes) != 1:
        return False
    world = sizes.pop()
    return all(got == {(world, r) for r in range(world)} for got in shards.values())


def checkpoint_complete(step_dir: Path, critic: bool | None = None) -> bool:
    """Whether a ``global_step_N`` directory holds everything verl 0.9.1's ``_load_checkpoint``
    (``trainer/ppo/v1/trainer_base.py``) reads: ``actor/`` shards, ``critic/`` shards when the run has a critic
    (``critic=None``: when a ``critic/`` directory is there or a sibling step has one), and ``data.pt``, which
    ``_save_checkpoint`` writes after both roles and right before the tracker file. A save removes the previous
    step's ``actor/`` (``max_actor_ckpt_to_keep``) before it rewrites the tracker, so a step the tracker names
    can be half gone, and a step after it can be complete without the tracker naming it."""
    if not (step_dir / "data.pt").is_file() or not _shards_complete(step_dir / "actor"):
        return False
    if critic is None:
        critic = any((d / "critic").is_dir() for d in step_dir.parent.glob("global_step_*"))
    return not critic or _shards_complete(step_dir / "critic")


def checkpoint_step(checkpoints: Path) -> int | None:
    """The step of the newest complete checkpoint (:func:`checkpoint_complete`) in a ``default_local_dir``,
    whether or not verl's tracker file names it; None when there is none."""
    try:
        steps = sorted((int(m.group(1)) for d in checkpoints.iterdir() if (m := _STEP_DIR.match(d.name))),
                       reverse=True)
    except OSError:
        return None
    return next((s for s in steps if checkpoint_complete(checkpoints / f"global_step_{s}")), None)


@dataclass(frozen=True)
class ResumePoint:
    """Where a retry continues: ``checkpoint`` (a ``global_step_<step>`` directory, passed as
    ``trainer.resume_mode=resume_path trainer.resume_from_path=<checkpoint>``) and the metrics files of the
    attempts whose training led to it (``lineage``, oldest first; ``starts``: the step each of them resumed from,
    None for a fresh start), for :func:`replay_records`."""

    checkpoint: Path
    step: int
    lineage: tuple[Path, ...]
    starts: tuple[int | None, ...]

    def records(self) -> list[tuple[int, dict[str, Any]]]:
        """The steps the lineage logged up to the checkpoint, as one curve."""
        return replay_records(self.lineage, self.step, self.starts)


def resumed_from(trial_dir: Path) -> Path | None:
    """The checkpoint an attempt was started from (``trainer.resume_from_path`` in its ``command.json``)."""
    try:
        argv = json.loads((trial_dir / "command.json").read_text())["argv"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    value = next((a.split("=", 1)[1] for a in argv if isinstance(a, str)
                  and a.startswith("trainer.resume_from_path=")), None)
    return None if value in (None, "null") else Path(value.strip("'"))


def resume_point(trials_dir: Path, retry_history: Sequence[int]) -> ResumePoint | None:
    """The newest complete checkpoint along a retry chain (attempt k ran as trial ``retry_history[k]`` and saved
    into ``<trials_dir>/<retry_history[k]>/checkpoints``), and the lineage of attempts that led to it; None when
    no attempt left a complete checkpoint (the retry starts afresh)."""
    best: tuple[int, int] | None = None  # (step, attempt)
    for k, number in enumerate(retry_history):
        step = checkpoint_step(trials_dir / str(number) / "checkpoints")
        if step is not None and (best is None or step >= best[0]):
            best = (step, k)
    if best is None:
        return None
    step, k = best
    index = {str(n): i for i, n in enumerate(retry_history)}
    chain: list[tuple[int, int | None]] = []  # (attempt, the step it resumed from)
    seen: set[int] = set()
    attempt: int | None = k
    while attempt is not None and attempt not in seen:
        seen.add(attempt)
        source = resumed_from(trials_dir / str(retry_history[attempt]))
        m = _STEP_DIR.match(source.name) if source is not None else None
        chain.append((attempt, int(m.group(1)) if m else None))
        attempt = index.get(source.parent.parent.name) if source is not None and m else None
    chain.reverse()
    return ResumePoint(trials_dir / str(retry_history[k]) / "checkpoints" / f"global_step_{step}", step,
                       tuple(verl_metrics_path(trials_dir / str(retry_history[a]), a) for a, _ in chain),
                       tuple(s for _, s in chain))


def resume_checkpoints(trials_dir: Path, retry_history: Sequence[int]) -> Path | None:
    """The ``global_step_N`` directory a retry continues from (:func:`resume_point`), else None."""
    point = resume_point(trials_dir, retry_history)
    return None if point is None else point.checkpoint


def attempt_files(trials_dir: Path, retry_history: Sequence[int]) -> list[Path]:
    """The metrics files of the earlier attempts of a chain, oldest first (attempt k ran as trial
    ``retry_history[k]``)."""
    return [verl_metrics_path(trials_dir / str(n), k) for k, n in enumerate(retry_history)]


def replay_records(files: Sequence[Path], upto_step: int,
                   starts: Sequence[int | None] | None = None) -> list[tuple[int, dict[str, Any]]]:
    """The steps attempts logged, as one curve up to ``upto_step`` (the checkpoint a retry resumes from).

    ``files``: one lineage, oldest first: each attempt continued from a checkpoint of the one before it
    (:attr:`ResumePoint.lineage`). ``starts[k]``: the step attempt k resumed from (None: a fresh start; not
    given: the step of its first record). An attempt's records replace the earlier ones after its start; at
    the start step itself both are merged, the later winning (the earlier attempt's training metrics of that
    step, the later one's validation of the checkpoint)."""
    merged: dict[int, dict[str, Any]] = {}
    for k, path in enumerate(files):
        records = MetricsTail(path).read()
        start = starts[k] if starts is not None and k < len(starts) else (records[0][0] if records else None)
        if starts is not None and start is None:
            merged = {}  # a fresh start: nothing before it belongs to this curve
        elif start is not None:
            merged = {s: d for s, d in merged.items() if s <= start}
        for step, data in records:
            merged[step] = {**merged.get(step, {}), **data}
    return sorted((s, d) for s, d in merged.items() if s <= upto_step)


# ----------------------------------------------------------------------------- metric names
# Namespaces of the training metrics verl 0.9.1 logs (verl/trainer/ppo/metric_utils.py, v1/trainer_base.py,
# workers/*); within them the names vary with the config (timing stages, losses, optional features).
_TRAIN_PREFIXES = ("actor/", "critic/", "response_length/", "prompt_length/", "timing_s/", "timing_per_token_ms/",
                   "perf/", "training/", "global_seqlen/", "num_turns/", "tool_call_counts/", "rollout_corr/",
                   "rollout/", "response/")
# verl's validation metrics (process_validation_metrics + _val_metrics_update): per data source and variable,
# mean@N and (N > 1) std@N over the N = val_kwargs.n samples of a prompt, best/worst/maj@k for 2 <= k <= N
_VAL = re.compile(r"^val-(?P<section>core|aux)/(?P<source>.+)/(?P<var>[^/]+)/"
                  r"(?:(?P<stat>mean|std)@(?P<n>\d+)|(?P<kind>best|worst|maj)@(?P<k>\d+)/(?:mean|std))$")


def val_core_metric(data_source: str = "openai/gsm8k", n: int = 1, var: str = "acc") -> str:
    """verl's validation score of one data source: ``val-core/<data_source>/<var>/mean@<val_kwargs.n>``.

    ``var`` is the core variable: verl 0.9.1's reward managers record a float score as ``acc`` as well as
    ``reward`` (``experimental/reward_loop/reward_manager/naive.py``), and ``_val_metrics_update``
    (``trainer/ppo/v1/trainer_base.py``) makes ``acc`` the core variable whenever it is there; only a reward
    function returning a dict without ``acc`` leaves ``reward`` as the core one."""
    return f"val-core/{data_source}/{var}/mean@{n}"


def verl_metric_ok(metric: str, val_n: int | None = None, data_sources: Sequence[str] | None = None,
                   core_var: str | None = None) -> bool:
    """Whether verl logs ``metric``: a training metric of its namespaces, or a validation metric of the form
    verl builds. With ``val_n`` (``actor_rollout_ref.rollout.val_kwargs.n``) and ``data_sources`` (those of
    the validation data) known, they must match: ``mean@N``/``std@N`` only at N = val_n (``std`` only for
    N > 1), ``best|worst|maj@k`` only for 2 <= k <= val_n; ``val-core`` holds the ``@val_n`` means (and
    best/maj) of the core variable (``core_var``: ``acc`` or ``reward``; None: either), everything else is
    ``val-aux`` (the core variable never is, except its std and worst)."""
    if metric in ("val-aux/num_turns/min", "val-aux/num_turns/max", "val-aux/num_turns/mean"):
        return True
    m = _VAL.match(metric)
    if m is None:
        return not metric.startswith("val-") and any(
            metric.startswith(p) and len(metric) > len(p) for p in _TRAIN_PREFIXES)
    if data_sources is not None and m.group("source") not in data_sources:
        return False
    core = m.group("section") == "core"
    var = m.group("var")
    if core and var not in ((core_var,) if core_var else ("acc", "reward")):
        return False
    if (not core and core_var and var == core_var and (m.group("stat") == "mean"
                                                       or m.group("kind") in ("best", "maj"))):
        return False  # the core variable's means and best/maj are val-core
    if m.group("stat"):
        n = int(m.group("n"))
        if n < 1 or (m.group("stat") == "std" and (n < 2 or core)):
            return False
        return val_n is None or n == val_n
    k = int(m.group("k"))
    if k < 2 or (core and m.group("kind") == "worst"):
        return False
    return val_n is None or (k == val_n if core else k <= val_n)


def verl_metric_examples(val_n: int = 1, data_sources: Sequence[str] = ("openai/gsm8k",),
                         core_var: str | None = "acc") -> list[str]:
    """Metric names to show when a space names one verl does not log (the first: the default objective)."""
    var = core_var or "acc"
    out = [val_core_metric(s, val_n, var) for s in data_sources]
    if val_n > 1:
        out += [f"val-aux/{s}/{var}/std@{val_n}" for s in data_sources]
    return out + ["critic/score/mean", "response_length/mean", "actor/entropy"]


# ----------------------------------------------------------------------------- validation with verl's own code
@dataclass(frozen=True)
class ComposedConfig:
    """What the driver needs from one composed verl config."""

    val_n: int
    data_sources: tuple[str, ...] | None  # from the validation parquet, when it exists
    total_training_steps: int | None
    test_freq: int
    save_freq: int
    val_before_train: bool
    n_gpus: int
    use_critic: bool
    use_reference_policy: bool
    adv_estimator: str
    train_files: tuple[str, ...]
    val_files: tuple[str, ...]
    rollout_name: str = "vllm"
    strategy: str = "fsdp"
    attn_implementation: str = "flash_attention_2"  # the actor's and reference's (override_config)
    val_core_var: str | None = "acc"  # verl's core validation variable (val_core_metric); None: not known here
    seed_keys: tuple[str, ...] = ()  # the seeds of the run that exist in this config (confirm varies them)


@dataclass(frozen=True)
class ComposeReport:
    """The outcome of composing the corners of a space in verl's interpreter."""

    results: tuple[ComposedConfig | VerlConfigError, ...]  # per corner
    seconds: float  # wall time of the subprocess (start-up, imports, every corner)
    corner_seconds: tuple[float, ...]  # per corner: hydra compose + checks + verl's validate_config
    interpreter: dict[str, Any] | None = None  # verl/_compose.py probe_interpreter(): torch's CUDA, vLLM, ...

    @property
    def corners(self) -> tuple[ComposedConfig, ...]:
        return tuple(r for r in self.results if isinstance(r, ComposedConfig))

    @property
    def first_error(self) -> VerlConfigError | None:
        return next((r for r in self.results if isinstance(r, VerlConfigError)), None)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _composed(info: dict[str, Any]) -> ComposedConfig:
    sources = info["data_sources"]
    return ComposedConfig(**{**info, "data_sources": None if sources is None else tuple(sources),
                             "train_files": tuple(info["train_files"]), "val_files": tuple(info["val_files"]),
                             "seed_keys": tuple(info.get("seed_keys", ()))})


def compose_corners(python: str, config: str, corners: Sequence[Sequence[str]], n_gpus: int | None = 1,
                    timeout_s: float = 600.0, env: Mapping[str, str] | None = None) -> ComposeReport:
    """Compose every corner (a list of hydra overrides) with verl's own configs in verl's interpreter, with
    verl's ``validate_config`` and the checks it lacks (``hpo/backends/verl/_compose.py``), all in one subprocess.

    Each corner gets ``trainer.n_gpus_per_node=<n_gpus> trainer.nnodes=1`` last, as trials do (``n_gpus=None``:
    the corner's own). The report holds per corner its :class:`ComposedConfig` or its :class:`VerlConfigError`
    (one line; ``.corner``; ``.key``/``.value`` of the culprit where known). Raises :class:`VerlConfigError`
    when ``python`` does not exist or has no verl, or the config does not exist.
    """
    config_dir, config_name = None, config
    if is_config_path(config):
        path = Path(config).expanduser().resolve()
        if not path.is_file():
            raise VerlConfigError(f"config {config!r}: no such file", "config")
        config_dir, config_name = str(path.parent), path.stem
    gpus = [] if n_gpus is None else [format_override("trainer.n_gpus_per_node", max(1, n_gpus)),
                                      format_override("trainer.nnodes", 1)]
    request = {"config_dir": config_dir, "config_name": config_name, "corners": [[*c, *gpus] for c in corners]}
    started = time.monotonic()
    try:
        res = subprocess.run([python, str(COMPOSE_SCRIPT)], input=json.dumps(request), capture_output=True,
                             text=True, timeout=timeout_s,
                             env={**(os.environ if env is None else env), "HYDRA_FULL_ERROR": "1"})
    except (FileNotFoundError, PermissionError):
        raise VerlConfigError(f"trial.python={python!r}: no such interpreter; {INSTALL_HINT}", "trial.python") \
            from None
    except subprocess.TimeoutExpired:
        raise VerlConfigError(f"composing {len(corners)} verl configs took over {timeout_s:.0f} s", "config") \
            from None
    seconds = time.monotonic() - started
    try:
        reply = json.loads(res.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = _one_line((res.stderr.strip().splitlines() or ["(no output)"])[-1])
        raise VerlConfigError(f"trial.python={python!r}: the verl config check failed (exit {res.returncode}): "
                              f"{tail}", "trial.python") from None
    if reply["status"] == "missing":
        raise VerlConfigError(f"trial.python={python!r}: {reply['message']}; {INSTALL_HINT}", "trial.python")
    if reply["status"] != "ok":
        raise VerlConfigError(_one_line(reply["message"]), "config")
    results = tuple(_composed(r["info"]) if r["ok"] else
                    VerlConfigError(_one_line(r["message"]), "config", i, r["key"], r["value"])
                    for i, r in enumerate(reply["results"]))
    return ComposeReport(results, seconds, tuple(float(r["seconds"]) for r in reply["results"]),
                         reply.get("interpreter"))


def check_space(python: str, config: str, corners: Sequence[Sequence[str]], n_gpus: int | None = 1,
                timeout_s: float = 600.0) -> ComposeReport:
    """:func:`compose_corners`, raising the :class:`VerlConfigError` of the first bad corner."""
    report = compose_corners(python, config, corners, n_gpus, timeout_s)
    if report.first_error is not None:
        raise report.first_error
    return report


@dataclass(frozen=True)
class Corner:
    """One config to check: the parameter values it stands for and its overrides."""

    values: dict[str, Any]
    overrides: list[str]


def space_corners(space: Space, max_corners: int = 64) -> list[Corner]:
    """The joint corners of a space (every parameter at its ends or choices; at most ``max_corners``, as
    ``experiment's check_trainer`` for ``verl_core``), each with the fixed overrides. Unlike ``verl_core``, verl's
    own defaults are often invalid together with a space (``ppo_mini_batch_size=256`` and a batch of 32), so
    no parameter is ever left at verl's default: there is no check of the fixed overrides alone."""
    import itertools

    out = []
    for combo in itertools.islice(itertools.product(*(p.corner_values() for p in space.params)), max_corners):
        values = {p.name: v for p, v in zip(space.params, combo, strict=True)}
        out.append(Corner(values, verl_overrides(space.overrides, {p.key: values[p.name] for p in space.params})))
    return out


def check_verl_space(space: Space, python: str, n_gpus: int | None = None) -> ComposeReport:
    """Everything a verl space must pass before a study is created: no driver key set by the space, every
    corner composed and validated by verl (:func:`check_space`, with ``trial.gpus_per_trial`` GPUs unless
    ``n_gpus``), data files that exist (or are the shipped set the prepare step writes), objective and
    early-stopping metrics that verl logs. Raises :class:`VerlConfigError` whose
    ``.where`` is the experiment field (the parameter or fixed override whose key verl's message names, else
    ``params``), for ``SpaceError``'s ``file: where: message`` form."""
    for where, key in [*((f"overrides.{k}", k) for k in space.overrides),
                       *((f"params.{p.name}.key", p.key) for p in space.params)]:
        if override_key(key) in DRIVER_KEYS:
            raise VerlConfigError(f"{override_key(key)} is set by the driver for every verl trial", where)
    corners = space_corners(space)
    try:
        report = check_space(python, space.config, [c.overrides for c in corners],
                             space.trial.gpus_per_trial if n_gpus is None else n_gpus)
    except VerlConfigError as err:
        if err.corner is None:
            raise
        values = corners[err.corner].values
        shown = ", ".join(f"{k}={v!r}" for k, v in values.items())
        param = next((p for p in space.params if override_key(p.key) == err.key), None)
        fixed = next((k for k in space.overrides if override_key(k) == err.key), None)
        if param is not None:
            others = ", ".join(f"{k}={v!r}" for k, v in values.items() if k != param.name)
            where = f"params.{param.name}"
            message = f"value {values[param.name]!r} (with {others or 'nothing else'}) is rejected by verl: {err}"
        else:
            where = f"overrides.{fixed}" if fixed is not None else "params"
            message = f"the combination {shown} is rejected by verl: {err}"
        raise VerlConfigError(message, where, err.corner, err.key, err.value) from None
    from hpo.backends.verl._data import missing_files

    for info in report.corners:
        for key, files in (("data.train_files", info.train_files), ("data.val_files", info.val_files)):
            problem = missing_files(key, files)
            if problem:
                fixed = next((k for k in space.overrides if override_key(k) == key), None)
                raise VerlConfigError(problem, f"overrides.{fixed}" if fixed else "params", key=key)
    check_verl_metrics(space, report.corners[0])
    return report


def check_verl_metrics(space: Space, info: ComposedConfig) -> None:
    """The objective's and constraints' metrics, and the early-stopping metric when enabled, must be ones verl
    logs for this config (``val_kwargs.n``, the validation data's sources when known)."""
    from hpo.experiment._objective import check_metrics

    def ok(metric: str) -> bool:
        return verl_metric_ok(metric, info.val_n, info.data_sources, info.val_core_var)

    known = verl_metric_examples(info.val_n, info.data_sources or ("<data_source>",), info.val_core_var)

    def error(where: str, msg: str) -> VerlConfigError:
        return VerlConfigError(msg.replace("the trainer's evaluations log", "verl logs e.g."), where)

    check_metrics(space.objective, ok, known, error)
    es = space.early_stopping
    if es.enabled and not ok(es.metric):
        hint = (f"verl logs the spread of the {info.val_n} samples of a prompt as "
                f"{verl_metric_examples(info.val_n, info.data_sources or ('<data_source>',), info.val_core_var)[1]}"
                if info.val_n > 1 else
                "verl logs no validation spread with actor_rollout_ref.rollout.val_kwargs.n=1; set it above 1 "
                "or early_stopping.enabled: false")
        raise VerlConfigError(f"unknown metric {es.metric!r} for a verl trial: {hint}", "early_stopping.metric")


# ----------------------------------------------------------------------------- can this interpreter run the trials?
def interpreter_problem(interpreter: Mapping[str, Any], info: ComposedConfig, python: str) -> str | None:
    """Why ``python`` (described by ``hpo/backends/verl/_compose.py``'s ``probe_interpreter``) cannot run a trial of the
    composed config ``info`` on a GPU, as one line naming the fix; None when it can.

    * torch must be a CUDA build (verl 0.9.1 trains on CUDA only; ``make install-verl`` installs the CPU wheel);
    * ``rollout.name=vllm`` needs vLLM (``sglang`` SGLang) in the same interpreter;
    * the actor and reference load with ``override_config.attn_implementation`` (verl's default
      ``flash_attention_2``, ``workers/config/model.py``) and a critic always with ``flash_attention_2``
      (``utils/model.py`` ``load_valuehead_model``): both need the ``flash_attn`` package, which ``verl[vllm]``
      does not install.
    """
    shown = f"trial.python={python!r}"
    if not interpreter.get("torch_cuda"):
        return (f"{shown} has torch {interpreter.get('torch') or '(none)'} without CUDA, and verl 0.9.1 trains on "
                f"CUDA GPUs only: {GPU_INSTALL_HINT}")
    engine = {"vllm": ("vllm", "vLLM"), "sglang": ("sglang", "SGLang")}.get(info.rollout_name)
    if engine is not None and not interpreter.get(engine[0]):
        return (f"actor_rollout_ref.rollout.name={info.rollout_name} but {shown} has no {engine[1]}: "
                + (GPU_INSTALL_HINT if engine[0] == "vllm" else "pip install 'verl[sglang]==0.9.1' into it"))
    if not interpreter.get("flash_attn"):
        if info.strategy in ("fsdp", "fsdp2") and info.attn_implementation == "flash_attention_2":
            return (f"actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2 (verl's default) "
                    f"but {shown} has no flash_attn: add +actor_rollout_ref.model.override_config.attn_implementation"
                    "=sdpa to the overrides, or pip install flash-attn into it")
        if info.use_critic:
            return (f"algorithm.adv_estimator={info.adv_estimator} trains a critic, which verl 0.9.1 loads with "
                    f"flash_attention_2 whatever its override_config says, and {shown} has no flash_attn: "
                    "pip install flash-attn into it")
    return None


def trial_base_env(space: Space) -> dict[str, str]:
    """The environment a trial's interpreter starts from: the driver's plus ``trial.env``."""
    return {**os.environ, **space.trial.env}


def check_verl_launch(space: Space, python: str | None = None) -> None:
    """Before a verl search or resume launches trials: the interpreter (``trial.python``, run with the trials'
    ``trial.env``) can run every corner on a GPU (:func:`interpreter_problem`). Raises :class:`VerlConfigError`
    (``.where`` ``trial.python``). Skipped when the trials' environment sets :data:`SKIP_INTERPRETER_CHECK`
    (a stand-in ``main_ppo`` on the CPU, as the tests run)."""
    env = trial_base_env(space)
    if env.get(SKIP_INTERPRETER_CHECK, "") not in ("", "0"):
        return
    python = python or space.trial.python or default_python()
    report = compose_corners(python, space.config, [c.overrides for c in space_corners(space)],
                             space.trial.gpus_per_trial, env=env)
    for info in report.corners:
        problem = interpreter_problem(report.interpreter or {}, info, python)
        if problem is not None:
            raise VerlConfigError(problem, "trial.python")
    if report.first_error is not None:
        raise report.first_error
