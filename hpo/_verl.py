"""Real verl as a trial backend: ``python -m verl.trainer.main_ppo`` in verl's own interpreter.

The driver talks to a verl trial exactly as to ``verl_core``: argv (hydra overrides), environment and the JSONL
file of verl's ``file`` logger. Nothing here imports torch, hydra or verl; the only code that does is
``hpo/_verl_compose.py``, which :func:`check_space` runs in verl's interpreter before a study is created.

What a verl trial is (:func:`verl_argv`, :func:`verl_env`):

* ``python -m verl.trainer.main_ppo [--config-path DIR --config-name NAME] <overrides> <params> <driver keys>``.
  The driver keys (:data:`DRIVER_KEYS`) come last so that they win: ``trainer.logger`` (``console`` and
  ``file`` added to the space's own loggers), ``trainer.project_name=<study>``,
  ``trainer.experiment_name=trial-<n>``, ``trainer.default_local_dir=<checkpoints>``,
  ``trainer.n_gpus_per_node=<the trial's GPUs, at least 1>``, ``trainer.nnodes=1``,
  ``trainer.resume_mode=auto``, ``hydra.run.dir=<trial dir>/hydra`` (hydra's ``outputs/`` would otherwise land in
  the driver's working directory) and ``++ray_kwargs.ray_init.include_dashboard=false``.
* GPUs on a CPU-only host: the driver hands out no devices (``CUDA_VISIBLE_DEVICES=""``) and verl gets
  ``n_gpus_per_node=1``, the smallest value its config accepts. verl 0.9.1 has no CPU platform: such a trial
  starts Ray and then waits for ever for actors that need a GPU (measured: still pending after 120 s), so only
  ``trial.timeout_s`` ends it. Validation uses ``trial.gpus_per_trial``, not the devices found.
* Metrics: verl's ``FileLogger`` opens ``$VERL_FILE_LOGGER_PATH`` with ``"wb"``; every attempt gets its own file
  (:func:`verl_metrics_path`), so a restart never wipes the steps an earlier attempt logged.
* Retries resume: a retry of an interrupted trial (``retry_history`` of the Optuna trial) passes the checkpoints
  directory of the first trial of the chain (:func:`resume_checkpoints`) as ``trainer.default_local_dir``, and
  ``trainer.resume_mode=auto`` continues from ``latest_checkpointed_iteration.txt`` there. The steps that the
  earlier attempts logged up to that checkpoint are read back by :func:`replay_records`, in order. Across hosts
  this needs the studies directory on a shared filesystem; without the checkpoint the retry starts afresh.
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

from hpo._runner import MetricsTail

if TYPE_CHECKING:
    from hpo._space import Space

DEFAULT_CONFIG = "ppo_trainer"
MAIN_MODULE = "verl.trainer.main_ppo"
COMPOSE_SCRIPT = Path(__file__).with_name("_verl_compose.py")
DEFAULT_VENV = ".venv-verl"
INSTALL_HINT = "run `make install-verl`, or set trial.python to the interpreter of a venv with verl==0.9.1"
# Keys the driver sets on every verl trial; a space must not set them (trainer.logger is merged, not set).
DRIVER_KEYS = ("trainer.project_name", "trainer.experiment_name", "trainer.default_local_dir",
               "trainer.n_gpus_per_node", "trainer.nnodes", "trainer.resume_mode", "hydra.run.dir")
RAY_DASHBOARD_KEY = "ray_kwargs.ray_init.include_dashboard"
CHECKPOINT_TRACKER = "latest_checkpointed_iteration.txt"  # verl's trainer writes it after each checkpoint
# Ray's Unix sockets live at <RAY_TMPDIR>/ray/session_<26-char date>_<pid <= 7 digits>/sockets/plasma_store:
# 68 characters after the root, and Linux caps a socket path at 107 bytes.
MAX_SCRATCH_LEN = 107 - 68


class VerlConfigError(ValueError):
    """A verl config, corner or metric verl rejects; ``str(err)`` is one line naming the key and the value.

    ``where`` names the experiment field (``config``, ``overrides.<key>``, ``params.<name>``, ``params``,
    ``objective.metric``, ``trial.python``, ...) in the form :class:`hpo._space.SpaceError` messages use.
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
              n_gpus: int, resume_dir: Path | None = None) -> list[str]:
    """The argv of one verl trial (see the module docstring for each driver key).

    ``overrides``: the space's fixed overrides and sampled parameters (:func:`verl_overrides`).
    ``n_gpus``: devices handed to this trial; 0 (a CPU-only host) becomes 1, the least verl accepts.
    ``resume_dir``: checkpoints of the interrupted trial this one retries (:func:`resume_checkpoints`); default
    ``<trial_dir>/checkpoints``.
    """
    rest, loggers = _merged_loggers(overrides)
    checkpoints = resume_dir if resume_dir is not None else trial_dir / "checkpoints"
    argv = [python, "-m", MAIN_MODULE, *config_args(config), *rest, loggers,
            format_override("trainer.project_name", study),
            format_override("trainer.experiment_name", f"trial-{trial_number}"),
            format_override("trainer.default_local_dir", str(checkpoints)),
            format_override("trainer.n_gpus_per_node", max(1, n_gpus)),
            format_override("trainer.nnodes", 1),
            format_override("trainer.resume_mode", "auto"),
            format_override("hydra.run.dir", str(trial_dir / "hydra"))]
    if not any(override_key(o) == RAY_DASHBOARD_KEY for o in rest):
        argv.append(format_override("++" + RAY_DASHBOARD_KEY, False))
    return argv


def default_python(cwd: str | os.PathLike[str] = ".") -> str:
    """verl's interpreter when ``trial.python`` is not set: ``.venv-verl/bin/python`` (``make install-verl``) when
    it exists under ``cwd``, else the driver's own."""
    venv = Path(cwd) / DEFAULT_VENV / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


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
def checkpoint_step(checkpoints: Path) -> int | None:
    """The step of verl's newest complete checkpoint in ``checkpoints`` (its tracker file), else None."""
    try:
        step = int((checkpoints / CHECKPOINT_TRACKER).read_text().strip())
    except (OSError, ValueError):
        return None
    return step if (checkpoints / f"global_step_{step}").is_dir() else None


def resume_checkpoints(trials_dir: Path, retry_history: Sequence[int]) -> Path | None:
    """The checkpoints a retry continues from: those of the first trial of its chain (``retry_history[0]``;
    every retry writes there too), when that holds a complete checkpoint; else None (start afresh)."""
    if not retry_history:
        return None
    checkpoints = trials_dir / str(retry_history[0]) / "checkpoints"
    return checkpoints if checkpoint_step(checkpoints) is not None else None


def attempt_files(trials_dir: Path, retry_history: Sequence[int]) -> list[Path]:
    """The metrics files of the earlier attempts of a chain, oldest first (attempt k ran as trial
    ``retry_history[k]``)."""
    return [verl_metrics_path(trials_dir / str(n), k) for k, n in enumerate(retry_history)]


def replay_records(files: Sequence[Path], upto_step: int) -> list[tuple[int, dict[str, Any]]]:
    """The steps earlier attempts logged, as one curve up to ``upto_step`` (the checkpoint a retry resumes
    from): a later attempt's records replace an earlier one's from the step where the later one began."""
    merged: dict[int, dict[str, Any]] = {}
    for path in files:
        records = MetricsTail(path).read()
        if records:
            first = records[0][0]
            merged = {s: d for s, d in merged.items() if s < first}
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


def val_core_metric(data_source: str = "openai/gsm8k", n: int = 1, var: str = "reward") -> str:
    """verl's validation score of one data source: ``val-core/<data_source>/reward/mean@<val_kwargs.n>``."""
    return f"val-core/{data_source}/{var}/mean@{n}"


def verl_metric_ok(metric: str, val_n: int | None = None, data_sources: Sequence[str] | None = None) -> bool:
    """Whether verl logs ``metric``: a training metric of its namespaces, or a validation metric of the form
    verl builds. With ``val_n`` (``actor_rollout_ref.rollout.val_kwargs.n``) and ``data_sources`` (those of
    the validation data) known, they must match: ``mean@N``/``std@N`` only at N = val_n (``std`` only for
    N > 1), ``best|worst|maj@k`` only for 2 <= k <= val_n; ``val-core`` holds the ``@val_n`` means (and
    best/maj) of the core variable, everything else is ``val-aux``."""
    if metric in ("val-aux/num_turns/min", "val-aux/num_turns/max", "val-aux/num_turns/mean"):
        return True
    m = _VAL.match(metric)
    if m is None:
        return not metric.startswith("val-") and any(
            metric.startswith(p) and len(metric) > len(p) for p in _TRAIN_PREFIXES)
    if data_sources is not None and m.group("source") not in data_sources:
        return False
    core = m.group("section") == "core"
    if m.group("stat"):
        n = int(m.group("n"))
        if n < 1 or (m.group("stat") == "std" and (n < 2 or core)):
            return False
        return val_n is None or n == val_n
    k = int(m.group("k"))
    if k < 2 or (core and m.group("kind") == "worst"):
        return False
    return val_n is None or (k == val_n if core else k <= val_n)


def verl_metric_examples(val_n: int = 1, data_sources: Sequence[str] = ("openai/gsm8k",)) -> list[str]:
    """Metric names to show when a space names one verl does not log."""
    out = [val_core_metric(s, val_n) for s in data_sources]
    if val_n > 1:
        out += [f"val-aux/{s}/reward/std@{val_n}" for s in data_sources]
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


@dataclass(frozen=True)
class ComposeReport:
    """The outcome of composing the corners of a space in verl's interpreter."""

    results: tuple[ComposedConfig | VerlConfigError, ...]  # per corner
    seconds: float  # wall time of the subprocess (start-up, imports, every corner)
    corner_seconds: tuple[float, ...]  # per corner: hydra compose + checks + verl's validate_config

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
                             "train_files": tuple(info["train_files"]), "val_files": tuple(info["val_files"])})


def compose_corners(python: str, config: str, corners: Sequence[Sequence[str]], n_gpus: int | None = 1,
                    timeout_s: float = 600.0) -> ComposeReport:
    """Compose every corner (a list of hydra overrides) with verl's own configs in verl's interpreter, with
    verl's ``validate_config`` and the checks it lacks (``hpo/_verl_compose.py``), all in one subprocess.

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
                             text=True, timeout=timeout_s, env={**os.environ, "HYDRA_FULL_ERROR": "1"})
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
    return ComposeReport(results, seconds, tuple(float(r["seconds"]) for r in reply["results"]))


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
    ``hpo._space.check_trainer`` for ``verl_core``), each with the fixed overrides. Unlike ``verl_core``, verl's
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
    ``n_gpus``), objective and early-stopping metrics that verl logs. Raises :class:`VerlConfigError` whose
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
    check_verl_metrics(space, report.corners[0])
    return report


def check_verl_metrics(space: Space, info: ComposedConfig) -> None:
    """The objective's and constraints' metrics, and the early-stopping metric when enabled, must be ones verl
    logs for this config (``val_kwargs.n``, the validation data's sources when known)."""
    from hpo._objective import check_metrics

    def ok(metric: str) -> bool:
        return verl_metric_ok(metric, info.val_n, info.data_sources)

    known = verl_metric_examples(info.val_n, info.data_sources or ("<data_source>",))

    def error(where: str, msg: str) -> VerlConfigError:
        return VerlConfigError(msg.replace("the trainer's evaluations log", "verl logs e.g."), where)

    check_metrics(space.objective, ok, known, error)
    es = space.early_stopping
    if es.enabled and not ok(es.metric):
        hint = (f"verl logs the spread of the {info.val_n} samples of a prompt as "
                f"{verl_metric_examples(info.val_n, info.data_sources or ('<data_source>',))[1]}"
                if info.val_n > 1 else
                "verl logs no validation spread with actor_rollout_ref.rollout.val_kwargs.n=1; set it above 1 "
                "or early_stopping.enabled: false")
        raise VerlConfigError(f"unknown metric {es.metric!r} for a verl trial: {hint}", "early_stopping.metric")

