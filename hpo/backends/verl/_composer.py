"""Composing a space's corners in verl's interpreter, the driver's side of ``hpo/backends/verl/_compose.py``
(:data:`COMPOSE_SCRIPT`): the corners to compose (:func:`space_corners`), the subprocess that composes and validates
them with verl's own code (:func:`compose_corners`, :func:`check_space`) within its time limit
(:func:`compose_timeout`), what its reply holds for the driver (:class:`ComposedConfig` per corner, in a
:class:`ComposeReport`), and the error every verl check raises (:class:`VerlConfigError`, :class:`ComposeTimeout`).
The checks built on it are :mod:`hpo.backends.verl._check` (a space) and :mod:`hpo.backends.verl._interpreter`
(the interpreter). Nothing here imports torch, hydra or verl.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpo.backends.verl._batch import feasible_corners
from hpo.backends.verl._launch import INSTALL_HINT, format_override, is_config_path, verl_overrides
from hpo.experiment import SpaceError

if TYPE_CHECKING:
    from hpo.experiment import Space

COMPOSE_SCRIPT = Path(__file__).with_name("_compose.py")  # run in verl's interpreter: request on stdin, JSON out


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
    no parameter is ever left at verl's default: there is no check of the fixed overrides alone. A corner whose
    values verl refuses together while each of them is in a corner it accepts is left out (a trial drawing it is not
    launched: :func:`~hpo.backends.verl._batch.feasible_corners`)."""
    import itertools

    combos = itertools.islice(itertools.product(*(p.corner_values() for p in space.params)), max_corners)
    kept, _ = feasible_corners(space, [{p.name: v for p, v in zip(space.params, c, strict=True)} for c in combos])
    return [Corner(values, verl_overrides(space.overrides, {p.key: values[p.name] for p in space.params}))
            for values in kept]
