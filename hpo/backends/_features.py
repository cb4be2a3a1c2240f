"""What a trainer may do beyond the required core of :class:`~hpo.backends.Backend`: one small typed feature per
concern, each held by the backend as an attribute that is ``None`` when the trainer has none, and asked for only by the
part of the driver that needs it (which says so in one line where the experiment asks for what is missing):

* ``memory`` (:class:`MemoryModel`): a memory estimate of a trial, of the corners of a space, and ``validate``'s
  verdict (:mod:`hpo.backends._preflight`); none: nothing is estimated or refused;
* ``resumable`` (:class:`Resumable`): how its checkpoints look and which of its keys continue a run from one: a retry
  continues its chain's newest checkpoint, and with ``segments`` a PBT segment trains a step range from a checkpoint
  (``study.strategy: pbt`` needs both); none: retries start afresh, PBT is refused;
* ``confirmation`` (:class:`Confirmation`): the keys of a run's seeds, the held-out split and the trainer's version;
  none: ``confirm`` needs ``study.confirm.seed_key``, and runs measure no held-out split;
* ``speed`` (:class:`Speed`): a throughput study's keys and metrics (``study.kind: throughput``); none: the study
  names its own ``study.throughput.neutral_keys`` and objective;
* ``rehearsal`` (:class:`Rehearsal`): ``verl-hpo rehearse``, its flags and its run; none: ``rehearse`` refuses.

Nothing here belongs to one trainer: each feature's defaults are the driver's (``study.confirm.test_files`` under the
trainer's first held-out key, a digest of the command's own files), and memory estimates are typed neutrally
(:class:`PredictionLike`, sequence lengths as whatever the trainer's model reads)."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO, runtime_checkable

from hpo.backends._attempt import ResumePointLike, TrialConfig
from hpo.backends._replay import CheckpointLayout, resume_point
from hpo.experiment import heldout_metric

if TYPE_CHECKING:
    from hpo.experiment import Space

__all__ = ["Confirmation", "MemoryModel", "PredictionLike", "Rehearsal", "Resumable", "SegmentOverrides",
           "SequenceLengths", "Speed"]

SequenceLengths = Any  # the expected prompt and response lengths a memory model reads from a run (its own type)


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


@runtime_checkable
class MemoryModel(Protocol):
    """A trainer's memory estimate (``Backend.memory``), asked by the memory pre-flight (:mod:`hpo.backends._preflight`)
    and by the study loop before each launch."""

    def predict(self, space: Space, config: TrialConfig, devices: Sequence[str]) -> PredictionLike | None:
        """One attempt's estimate on its ``devices`` (none: the CPU) against its budget; None: not estimated (the
        trial launches unjudged)."""

    def corner_predictions(self, space: Space, devices: Sequence[str], lengths: SequenceLengths | None = None
                           ) -> Sequence[tuple[dict[str, Any], PredictionLike]] | None:
        """Each corner of the space (:func:`hpo.backends._preflight.corners`) with its estimate on one trial's
        ``devices``, at the expected sequence ``lengths`` when given (:meth:`sequence_lengths`), for
        :func:`hpo.backends._preflight.check_space_fits`. None: none can be made here, and nothing is refused."""

    def sequence_lengths(self, path: Path) -> SequenceLengths:
        """``validate --metrics``: the expected sequence lengths read from a previous run's metrics file (SpaceError
        with one line when it has none)."""

    def validate(self, space: Space, devices: Sequence[str], out: TextIO,
                 lengths: SequenceLengths | None = None) -> int:
        """``verl-hpo validate``'s memory pre-flight on one trial's ``devices``: each corner's verdict printed to
        ``out`` (:func:`hpo.backends._preflight.report_corners`); 0 when all fit, else 2 with one line on stderr."""


SegmentOverrides = Callable[["Space", int, "str | None"], "tuple[list[str], Path | None]"]
"""A PBT segment that trains to step ``end`` and saves there, continuing ``checkpoint`` when given (the driver's
private copy of it): ``(space, end, checkpoint) -> (overrides, start)``: its overrides (the trainer's own keys) and
the checkpoint the attempt resumes (``Attempt.start``, handed to :meth:`~hpo.backends.Backend.command` as
``resume_from``)."""


@dataclasses.dataclass(frozen=True)
class Resumable:
    """A trainer that continues a run from one of its checkpoints (``Backend.resumable``).

    ``layout``: how its checkpoints look in an attempt's ``<trial dir>/checkpoints``
    (:class:`~hpo.backends._replay.CheckpointLayout`): a retry continues from the newest complete one of its chain
    (:meth:`resume_point`), which the backend's :meth:`~hpo.backends.Backend.command` gets as ``attempt.resume_from``;
    ``resume_overrides(checkpoint)``: the trainer's own overrides that continue a run from ``checkpoint`` (what
    ``verl-hpo best --format command`` of a PBT study adds to continue its best checkpoint);
    ``segments``: a PBT segment's overrides (:data:`SegmentOverrides`); None: the trainer resumes retries but cannot
    take new hyperparameters at a checkpoint, and ``study.strategy: pbt`` is refused;
    ``save_at(step)``: the trainer's own overrides that make a run also save a complete checkpoint at ``step``,
    changing neither its length nor its math (a proxy search's promoted run, which a confirmation run on the same seed
    then continues: :mod:`hpo.study._continuation`); the checkpoint must be complete before that step's metrics line
    is written, since the driver stops the run right after it. None: a confirmation never continues a promoted run."""

    layout: CheckpointLayout
    resume_overrides: Callable[[Path], list[str]]
    segments: SegmentOverrides | None = None
    save_at: Callable[[int], list[str]] | None = None

    def resume_point(self, trials_dir: Path, history: Sequence[int],
                     metrics_path: Callable[[Path, int], Path]) -> ResumePointLike | None:
        """The newest complete checkpoint of the retry chain ``history`` and the curve logged up to it, by the walk
        every resumable trainer shares (:func:`hpo.backends._replay.resume_point`); None: nothing to resume."""
        return resume_point(trials_dir, history, self.layout, metrics_path)

    def step_name(self, step: int) -> str:
        """The name of the checkpoint at ``step`` inside a checkpoints directory (``global_step_<N>``, ...)."""
        return self.layout.step_dir(Path("checkpoints"), step).name


@dataclasses.dataclass(frozen=True)
class Confirmation:
    """What a confirmation run of this trainer changes and how it is scored (``Backend.confirmation``).

    ``seed_keys``: the trainer keys of every seed of a run (no default: a trainer names its own; the experiment's
    ``study.confirm.seed_key`` wins over them); ``heldout_keys``: the keys of its held-out split (the first: what a
    confirmation run sets from ``study.confirm.test_files``), kept out of a search with ``heldout_prefixes`` (a
    validation metric's prefix -> its name on the held-out split; ``""``: any other metric) by
    :mod:`hpo.experiment._heldout`. A trainer overrides the methods whose defaults do not describe it."""

    seed_keys: tuple[str, ...]
    heldout_keys: tuple[str, ...] = ()
    heldout_prefixes: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def default_seed(self, space: Space, key: str) -> int | None:
        """The seed a run gets under ``key`` when the experiment does not set it (None: unknown)."""
        return None

    def heldout_overrides(self, space: Space) -> dict[str, Any]:
        """What a confirmation run adds to be measured on the held-out test split ({}: none): the first of
        :attr:`heldout_keys` set to ``study.confirm.test_files``."""
        files = space.study.confirm.test_files
        return {self.heldout_keys[0]: files} if files and self.heldout_keys else {}

    def heldout_metric(self, space: Space) -> str | None:
        """The metric a confirmation run's held-out value is read from (None without a held-out split):
        ``study.confirm.test_metric``, else the objective's metric under the trainer's held-out prefix."""
        if not self.heldout_overrides(space):
            return None
        return space.study.confirm.test_metric or heldout_metric(space.objective.primary_metric, self.heldout_prefixes)

    def heldout_note(self, space: Space) -> str:
        """One line on where confirmation runs measure the held-out value ("" when they do not)."""
        extra = self.heldout_overrides(space)
        if not extra:
            return ""
        split = next(iter(extra.values()))
        return f"confirmation runs also evaluate the held-out test split {split} at their last step"

    def check_heldout(self, space: Space) -> None:
        """Before confirmation runs launch (after the prepare step): SpaceError, one line, when the held-out data
        they would read is missing (the default: nothing to check here, the trainer reports it)."""

    def trainer_version(self, space: Space) -> str | None:
        """What, beside the experiment's own keys, decides a run's result on this host (the trainer's code and the
        libraries it runs on), as a digest; None when unknown: a confirmation's baseline runs are then never reused
        from another study (:func:`hpo.study._confirm.baseline_key`). The default: the contents of the files the
        trial's command names (its script) and the interpreter's version; a trainer whose result depends on other
        code that changes sets ``study.confirm.reuse_baseline: false``."""
        digest = hashlib.sha256(sys.version.encode())
        for arg in space.trial.command or ():
            path = Path(arg)
            try:
                if path.is_file() and path.stat().st_size < 50_000_000:
                    digest.update(arg.encode() + b"\0" + path.read_bytes())
            except OSError:
                return None
        return digest.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class Speed:
    """A throughput study of this trainer (``Backend.speed``, ``study.kind: throughput``,
    :mod:`hpo.experiment._throughput`): ``keys``, fnmatch patterns of the keys that change speed and memory but not the
    update (``study.throughput.neutral_keys`` adds to them); ``metrics``, the metrics it is scored on, each with the
    direction a faster run moves it (the first: the default objective); ``memory_metrics``, the peak-memory metrics it
    may minimize beside them; ``math_metrics``, the first-step metrics whose agreement shows the same math."""

    keys: tuple[str, ...] = ()
    metrics: Mapping[str, str] = dataclasses.field(default_factory=dict)
    memory_metrics: tuple[str, ...] = ()
    math_metrics: tuple[str, ...] = ()


@runtime_checkable
class Rehearsal(Protocol):
    """``verl-hpo rehearse`` of this trainer's experiments (``Backend.rehearsal``): its own flags, added to the
    ``rehearse`` parser under its name, and its run."""

    def add_arguments(self, parser: argparse._ActionsContainer) -> None:
        """Add the rehearsal's flags (an argument group of the ``rehearse`` parser; they must not clash with another
        trainer's)."""

    def run(self, space: Space, args: argparse.Namespace) -> int:
        """Rehearse ``space`` (the experiment's quick load: schema and the trainer's quick checks); the exit code.
        ``args``: the parsed flags, with ``space`` and ``override`` as given, ``spaces_dir`` (where a bare name is
        looked up) and ``studies_dir`` (absolute) resolved. A bad flag or experiment: SpaceError, one line."""
