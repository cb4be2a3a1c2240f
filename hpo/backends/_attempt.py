"""One attempt of a trial between the driver and its backend: what the driver knows (:class:`Attempt`), what the
backend decides for it (:class:`TrialConfig`, :class:`Launch`), and what its process hook gets and gives
(:class:`LaunchContext`, :class:`Command`). :meth:`hpo.backends.Backend.plan` turns the first into the last."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from hpo.experiment._space import Space


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

    overrides: list[str]  # the trainer overrides after ``--config`` (fixed, tuned, the driver's extra)
    total_steps: int | None  # trainer.total_training_steps, when known
    config_text: str  # what ``config.yaml`` of the trial directory holds
    loaded: Any = None  # the backend's loaded config (verl_core: its TrainerConfig), for predict
    resume_from: Path | None = None  # a PBT segment's start checkpoint the backend resumes (verl)


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One attempt of a trial as the driver knows it, the input of :meth:`Backend.plan`."""

    space: Space
    study: str
    number: int
    trial_dir: Path
    trials_dir: Path  # the study's trials (the retry chain's attempts are ``<trials_dir>/<number>``)
    history: tuple[int, ...]  # the retry chain's earlier trial numbers, oldest first (attempt = len(history))
    values: Mapping[str, Any]  # the tuned values, by parameter name
    cwd: str
    env: dict[str, str]  # the driver's trial environment (CUDA_VISIBLE_DEVICES, the study's ids, trial.env)
    devices: int  # devices handed to this attempt (0: none, the CPU)
    ray_job: bool = False  # the attempt runs as a Ray job (trial.ray.num_gpus x trial.ray.nodes)
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # replaces fixed keys (a confirmation's seed)
    tail: tuple[str, ...] = ()  # overrides that come last (a PBT segment's step range)
    start: Path | None = None  # a PBT segment's start checkpoint (a retry's resume point comes first)

    @property
    def attempt(self) -> int:
        return len(self.history)


@dataclasses.dataclass(frozen=True)
class LaunchContext:
    """Where and as what one attempt's process runs (:meth:`Backend.command`)."""

    study: str
    number: int
    trial_dir: Path
    attempt: int  # earlier attempts of the retry chain
    metrics: Path
    cwd: str
    env: dict[str, str]  # the driver's trial environment (CUDA_VISIBLE_DEVICES, the study's ids, trial.env)
    devices: int  # devices handed to this attempt (0: none, the CPU)
    ray_job: bool = False  # the attempt runs as a Ray job (trial.ray.num_gpus x trial.ray.nodes)
    resume_from: Path | None = None  # a checkpoint to continue from (a retry's resume point, a PBT segment's start)


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
    config: TrialConfig  # overrides, total steps, ``config.yaml`` text, the loaded config (for ``predict``)
    resume: ResumePointLike | None = None  # a retry's checkpoint and the curve logged up to it
    private_tmp: Path | None = None
    notes: tuple[str, ...] = ()  # lines for the user: checkpoints of the chain passed over (a file of theirs refused)
