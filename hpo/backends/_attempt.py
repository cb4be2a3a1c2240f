"""One attempt of a trial between the driver and its backend: what the driver knows of it (:class:`Attempt`, handed to
both :meth:`~hpo.backends.Backend.configure` and :meth:`~hpo.backends.Backend.command`), what the backend decides
for it (:class:`TrialConfig`), its process (:class:`Command`) and the whole launch (:class:`Launch`).
:meth:`hpo.backends.Backend.plan` turns the first into the last."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from hpo.experiment import Space


class ResumePointLike(Protocol):
    """A checkpoint a retry continues from (``checkpoint``, its ``step``) and the records logged up to it."""

    @property
    def checkpoint(self) -> Path: ...

    @property
    def step(self) -> int: ...

    def records(self) -> list[tuple[int, dict[str, Any]]]: ...


@dataclasses.dataclass
class TrialConfig:
    """One attempt's trainer configuration (:meth:`hpo.backends.Backend.configure`)."""

    overrides: list[str]  # the trainer overrides (fixed, tuned, the attempt's extra and tail), in the trainer's syntax
    total_steps: int | None  # the steps the run is set to train (None: not known; the watch then counts none)
    config_text: str  # what ``config.yaml`` of the trial directory holds
    loaded: Any = None  # the backend's loaded config (verl_core: its TrainerConfig), for its memory model


@dataclasses.dataclass(frozen=True, kw_only=True)
class Attempt:
    """One attempt of a trial as the driver knows it: the input of :meth:`Backend.plan`, :meth:`Backend.configure`
    and :meth:`Backend.command`. Only ``space`` is needed: the rest defaults to a first attempt of trial 0 in
    ``./trial`` with no values (what ``best`` and the checks configure). :meth:`Backend.plan` fills in ``metrics``,
    ``env`` and ``resume_from`` before it asks for the command."""

    space: Space
    values: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the tuned values, by parameter name
    trial_dir: Path = Path("trial")
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # replaces fixed keys (a confirmation's seed)
    tail: tuple[str, ...] = ()  # overrides that come last (a PBT segment's step range)
    study: str = ""
    number: int = 0
    trials_dir: Path | None = None  # the study's trials (attempt k of the chain ran in ``<trials_dir>/<history[k]>``)
    history: tuple[int, ...] = ()  # the retry chain's earlier trial numbers, oldest first (``index`` = its length)
    cwd: str = "."
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)  # the trial's environment (CUDA_VISIBLE_DEVICES,
    # the study's ids, trial.env; from plan on also the trainer's metrics variable)
    devices: int = 0  # devices handed to this attempt (0: none, the CPU)
    ray_job: bool = False  # the attempt runs as a Ray job (trial.ray.num_gpus x trial.ray.nodes)
    start: Path | None = None  # a PBT segment's start checkpoint
    metrics: Path = Path("metrics.jsonl")  # the JSONL metrics file the trainer writes (plan: metrics_path's)
    resume_from: Path | None = None  # plan: the checkpoint to continue from (a retry's resume point, else ``start``)

    @property
    def index(self) -> int:
        """Which attempt of its retry chain this is (0: the first)."""
        return len(self.history)


@dataclasses.dataclass
class Command:
    """The process of one attempt."""

    argv: list[str]
    env: dict[str, str]
    private_tmp: Path | None = None  # a /tmp of the trial's own (verl's fixed socket names under /tmp)


@dataclasses.dataclass
class Launch:
    """What :meth:`Backend.plan` decided for one attempt: its process, files and where it continues from."""

    argv: list[str]
    env: dict[str, str]
    metrics: Path  # the JSONL metrics file the trainer writes
    config: TrialConfig  # overrides, total steps, ``config.yaml`` text, the loaded config (for the memory model)
    resume: ResumePointLike | None = None  # a retry's checkpoint and the curve logged up to it
    private_tmp: Path | None = None
    notes: tuple[str, ...] = ()  # lines for the user: checkpoints of the chain passed over (a file of theirs refused)
