"""Checks of a verl space with verl's own code, before a study is created or its trials launch: every corner
composed and validated in verl's interpreter (:func:`compose_corners`, which runs ``hpo/backends/verl/_compose.py``
there), the data files, the metric names verl logs (:func:`verl_metric_ok`), and whether the interpreter can run
the trials where they will run, a GPU or the CPU (:func:`check_verl_launch`). Nothing here imports torch, hydra or verl.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpo.backends.verl._cpu import PLUGIN_MODULE, cpu_overrides, transfer_queue_overrides
from hpo.backends.verl._launch import (
    DRIVER_KEYS,
    GPU_INSTALL_HINT,
    INSTALL_HINT,
    default_python,
    format_override,
    is_config_path,
    override_key,
    verl_overrides,
)
from hpo.execution._devices import detect_devices
from hpo.experiment._space import SpaceError

if TYPE_CHECKING:
    from hpo.experiment._space import Space

COMPOSE_SCRIPT = Path(__file__).with_name("_compose.py")  # run in verl's interpreter: request on stdin, JSON out
# In a trial's environment (trial.env): trials run a stand-in for main_ppo on the CPU (the tests), so the
# interpreter is not required to have CUDA torch, vLLM or flash-attn.
SKIP_INTERPRETER_CHECK = "VERL_HPO_SKIP_INTERPRETER_CHECK"


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


# How long composing verl's configs in verl's interpreter may take (each subprocess: the load's check of every corner,
# the memory estimate's, the rehearsal's; rehearse's shrink step gets 1.5 times it); a busy host can need more than
# the default, which says nothing against the experiment.
COMPOSE_TIMEOUT_ENV = "VERL_HPO_COMPOSE_TIMEOUT_S"
COMPOSE_TIMEOUT_S = 600.0


class ComposeTimeout(VerlConfigError, SpaceError):
    """Composing verl's configs ran out of :func:`compose_timeout` on this machine: the host was too slow, which says
    nothing against the experiment (``rehearse`` reports it as not finished here, exit 3). ``unfinished`` tells the
    trainer-neutral command so."""

    unfinished = True


def compose_timeout() -> float:
    """Seconds a verl compose subprocess may take: ``$VERL_HPO_COMPOSE_TIMEOUT_S``, else :data:`COMPOSE_TIMEOUT_S`;
    SpaceError (one line) for a value that is not a number of seconds from 0 to a day."""
    from hpo.backends.verl._rows import env_seconds

    return env_seconds(COMPOSE_TIMEOUT_ENV, COMPOSE_TIMEOUT_S, "how long composing verl's configs may take")


def compose_timed_out(what: str, python: str, limit: float) -> str:
    """The line of a compose that ran out of its time: the limit and how to raise it."""
    return (f"{what} in {python} took over {limit:g} s on this machine (a busy or slow host; "
            f"{COMPOSE_TIMEOUT_ENV}=SECONDS raises the limit)")


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
    use_kl_loss: bool | None = None  # None: not known (an older reply)
    use_kl_in_reward: bool | None = None
    reward_model_enable: bool | None = None
    adv_reads: tuple[str, ...] | None = None  # which of algorithm.gamma/lam the estimator reads; None: not known


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
                             "seed_keys": tuple(info.get("seed_keys", ())),
                             "adv_reads": None if info.get("adv_reads") is None else tuple(info["adv_reads"])})


def compose_corners(python: str, config: str, corners: Sequence[Sequence[str]], n_gpus: int | None = 1,
                    timeout_s: float | None = None, env: Mapping[str, str] | None = None,
                    nnodes: int = 1) -> ComposeReport:
    """Compose every corner (a list of hydra overrides) with verl's own configs in verl's interpreter, with
    verl's ``validate_config`` and the checks it lacks (``hpo/backends/verl/_compose.py``), all in one subprocess.

    Each corner gets ``trainer.n_gpus_per_node=<n_gpus> trainer.nnodes=<nnodes>`` last, as trials do
    (``n_gpus=None``: the corner's own; a Ray-job study: ``trial.ray.num_gpus`` and ``trial.ray.nodes``). The
    report holds per corner its :class:`ComposedConfig` or its :class:`VerlConfigError` (one line; ``.corner``;
    ``.key``/``.value`` of the culprit where known). Raises :class:`VerlConfigError` when ``python`` does not exist
    or has no verl, or the config does not exist; :class:`ComposeTimeout` past ``timeout_s`` (None:
    :func:`compose_timeout`).
    """
    timeout_s = compose_timeout() if timeout_s is None else timeout_s
    config_dir, config_name = None, config
    if is_config_path(config):
        path = Path(config).expanduser().resolve()
        if not path.is_file():
            raise VerlConfigError(f"config {config!r}: no such file", "config")
        config_dir, config_name = str(path.parent), path.stem
    gpus = [] if n_gpus is None else [format_override("trainer.n_gpus_per_node", max(1, n_gpus)),
                                      format_override("trainer.nnodes", nnodes)]
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
        raise ComposeTimeout(compose_timed_out(f"composing {len(corners)} verl configs", python, timeout_s),
                             "config") from None
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
                timeout_s: float | None = None, nnodes: int = 1) -> ComposeReport:
    """:func:`compose_corners`, raising the :class:`VerlConfigError` of the first bad corner."""
    report = compose_corners(python, config, corners, n_gpus, timeout_s, nnodes=nnodes)
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
    from hpo.backends.verl._data import bad_rows, missing_files, missing_reward

    for key, value in space.overrides.items():  # before verl's interpreter starts: a typo costs nothing
        if override_key(key) in ("reward.custom_reward_function.path", "custom_reward_function.path"):
            problem = missing_reward(value)
            if problem:
                raise VerlConfigError(problem, f"overrides.{key}", key=override_key(key))
    corners = space_corners(space)
    try:
        report = check_space(python, space.config, [c.overrides for c in corners],
                             trial_gpus(space) if n_gpus is None else n_gpus, nnodes=trial_nodes(space))
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
    prompt_key = str(next((v for k, v in space.overrides.items() if override_key(k) == "data.prompt_key"), "prompt"))
    for i, info in enumerate(report.corners):
        for key, files in (("data.train_files", info.train_files), ("data.val_files", info.val_files)):
            problem = missing_files(key, files) or (bad_rows(key, files, prompt_key) if i == 0 else None)
            if problem:
                fixed = next((k for k in space.overrides if override_key(k) == key), None)
                raise VerlConfigError(problem, f"overrides.{fixed}" if fixed else "params", key=key)
    check_verl_metrics(space, report.corners[0])
    tuned = [(f"params.{p.name}", p.key) for p in space.params]
    every = [unread_tuned(tuned, {k: v for k, v in dataclasses.asdict(c).items() if v is not None})
             for c in report.corners]
    dead = [d for d in every[0] if all(any(o[0] == d[0] for o in other) for other in every[1:])]  # in no corner
    if dead:  # every trial would spend a dimension of the search on a value nothing reads
        raise VerlConfigError(dead[0][1], dead[0][0], key=space.param(dead[0][0].split(".", 1)[1]).key)
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
    if es.enabled and es.metric is not None and not ok(es.metric):
        hint = (f"verl logs the spread of the {info.val_n} samples of a prompt as "
                f"{verl_metric_examples(info.val_n, info.data_sources or ('<data_source>',), info.val_core_var)[1]}"
                if info.val_n > 1 else
                "verl logs no validation spread with actor_rollout_ref.rollout.val_kwargs.n=1; set it above 1 "
                "or early_stopping.enabled: false")
        raise VerlConfigError(f"unknown metric {es.metric!r} for a verl trial: {hint}", "early_stopping.metric")


# ----------------------------------------------------------------------------- can this interpreter run the trials?
def interpreter_problem(interpreter: Mapping[str, Any], info: ComposedConfig, python: str,
                        cpu: bool = False) -> str | None:
    """Why ``python`` (described by ``hpo/backends/verl/_compose.py``'s ``probe_interpreter``) cannot run a trial of the
    composed config ``info``, as one line naming the fix; None when it can.

    On the CPU (``cpu``: the trials get no devices) verl runs through the CPU platform plugin
    (:mod:`hpo.backends.verl._cpu`): the interpreter needs it and, for ``rollout.name=vllm``, vLLM's CPU build under
    a ``vllm`` version that verl can read (both installed by ``make install-verl``). On a GPU:

    * torch must be a CUDA build (``make install-verl`` installs the CPU wheel);
    * ``rollout.name=vllm`` needs vLLM (``sglang`` SGLang) in the same interpreter;
    * the actor and reference load with ``override_config.attn_implementation`` (verl's default
      ``flash_attention_2``, ``workers/config/model.py``) and a critic always with ``flash_attention_2``
      (``utils/model.py`` ``load_valuehead_model``): both need the ``flash_attn`` package, which ``verl[vllm]``
      does not install.
    """
    shown = f"trial.python={python!r}"
    if cpu:
        if not interpreter.get("verl_cpu_platform"):
            return (f"the trials get no GPU, so verl runs on the CPU, but {shown} has no CPU platform plugin "
                    f"({PLUGIN_MODULE}): {INSTALL_HINT}")
        if info.rollout_name == "vllm" and "cpu" not in str(interpreter.get("vllm_version") or ""):
            return (f"actor_rollout_ref.rollout.name=vllm on the CPU needs vLLM's CPU build with a vllm version verl "
                    f"can read, and {shown} has vllm {interpreter.get('vllm_version') or '(none)'}: {INSTALL_HINT}")
        if info.rollout_name not in ("vllm", None):
            return (f"actor_rollout_ref.rollout.name={info.rollout_name}: on the CPU verl 0.9.1 can roll out with "
                    "vllm only (vLLM's CPU build; SGLang has no CPU install)")
        return None
    if not interpreter.get("torch_cuda"):
        return (f"{shown} has torch {interpreter.get('torch') or '(none)'} without CUDA, so its trials need a GPU "
                f"build: {GPU_INSTALL_HINT}; or run them on the CPU with trial.gpus_per_trial: 0")
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


def trial_gpus(space: Space) -> int:
    """GPUs per node of a trial: ``trial.ray.num_gpus`` for a Ray-job study, else ``trial.gpus_per_trial``."""
    return space.trial.ray.num_gpus if space.trial.executor == "ray" else space.trial.gpus_per_trial


def trial_nodes(space: Space) -> int:
    """Nodes of a trial: ``trial.ray.nodes`` for a Ray-job study (``trainer.nnodes``), else 1."""
    return space.trial.ray.nodes if space.trial.executor == "ray" else 1


def trial_base_env(space: Space) -> dict[str, str]:
    """The environment a trial's interpreter starts from: the driver's plus ``trial.env``."""
    return {**os.environ, **space.trial.env}


def trials_on_cpu(space: Space) -> bool:
    """Whether the study's trials run verl on the CPU: a local trial that gets no devices
    (``trial.gpus_per_trial: 0``, or no GPU is visible and ``trial.devices`` names none)."""
    if space.trial.executor == "ray":  # the cluster's GPUs are logical ones (trial.ray.device: cpu) or real
        return space.trial.ray.device == "cpu"
    return space.trial.gpus_per_trial == 0 or not (space.trial.devices or detect_devices())


def check_verl_launch(space: Space, python: str | None = None, cpu: bool | None = None) -> None:
    """Before a verl search or resume launches trials: the interpreter (``trial.python``, run with the trials'
    ``trial.env``) can run every corner where the trials will run (:func:`interpreter_problem`; ``cpu``: on the
    CPU, None: :func:`trials_on_cpu`), each corner composed with what the driver adds there (the CPU platform's
    overrides, TransferQueue's size). Raises :class:`VerlConfigError` (``.where`` ``trial.python``). Skipped when the
    trials' environment sets :data:`SKIP_INTERPRETER_CHECK` (a stand-in ``main_ppo``, as some tests run)."""
    env = trial_base_env(space)
    if env.get(SKIP_INTERPRETER_CHECK, "") not in ("", "0"):
        return
    cpu = trials_on_cpu(space) if cpu is None else cpu
    python = python or space.trial.python or default_python()
    corners = [[*(cpu_overrides(c.overrides) if cpu else []), *transfer_queue_overrides(c.overrides, cpu),
                *c.overrides] for c in space_corners(space)]
    report = compose_corners(python, space.config, corners, 0 if cpu else trial_gpus(space), env=env,
                             nnodes=trial_nodes(space))
    for info in report.corners:
        problem = interpreter_problem(report.interpreter or {}, info, python, cpu)
        if problem is not None:
            raise VerlConfigError(problem, "trial.python")
    if report.first_error is not None:
        raise report.first_error


def unread_tuned(keys: Sequence[tuple[str, str]], info: dict[str, Any]) -> list[tuple[str, str]]:
    """The tuned keys (``(field, key)``) that no worker of this run reads, decided from one composed corner's
    ``info`` (:func:`hpo.backends.verl._compose_checks.describe`): a critic key without a critic, a reference key
    without a reference policy, a reward-model key without a reward model, the KL-loss coefficient without
    ``use_kl_loss``, the in-reward KL controller without ``use_kl_in_reward``, another rollout engine's
    ``engine_kwargs``, ``algorithm.gamma``/``algorithm.lam`` that the advantage estimator does not read (``adv_reads``,
    from verl's code: GAE reads both, GRPO neither). ``(field, why)`` each; keys it cannot decide (``info`` lacks
    the fact) are left out."""
    rollout = str(info.get("rollout_name") or "")
    no_rm = "this run has no reward model (reward.reward_model.enable)"
    no_critic = f"this run has no critic (algorithm.adv_estimator={info.get('adv_estimator')})"
    rules = (
        ("critic.", "use_critic", False, no_critic),
        ("actor_rollout_ref.ref.", "use_reference_policy", False, "this run has no reference policy"),
        ("reward.reward_model.", "reward_model_enable", False, no_rm),
        ("reward_model.", "reward_model_enable", False, no_rm),
        ("actor_rollout_ref.actor.kl_loss", "use_kl_loss", False, "actor_rollout_ref.actor.use_kl_loss is false"),
        ("algorithm.kl_ctrl.", "use_kl_in_reward", False, "algorithm.use_kl_in_reward is false"),
    )
    out = []
    for where, key in keys:
        bare = key.lstrip("+~")
        for prefix, fact, off, why in rules:  # a key added with '+' is not verl's: the rehearsal's check names it
            if not key.startswith("+") and bare.startswith(prefix) and fact in info and bool(info[fact]) == off:
                out.append((where, f"{key}: {why}, so no worker reads it"))
                break
        else:
            reads = info.get("adv_reads")
            name = bare.removeprefix("algorithm.")
            if not key.startswith("+") and name in ("gamma", "lam") and bare != name and reads is not None \
                    and name not in reads:
                out.append((where, f"{key}: algorithm.adv_estimator={info.get('adv_estimator')} does not read it "
                                   "(verl's gae does), so no worker reads it"))
                continue
            engine = re.match(r"actor_rollout_ref\.rollout\.engine_kwargs\.([a-z_]+)\.", bare)
            if engine and rollout and engine.group(1) != rollout:
                out.append((where, f"{key}: the rollout engine is {rollout}, not {engine.group(1)}, so no worker "
                                   "reads it"))
    return out
