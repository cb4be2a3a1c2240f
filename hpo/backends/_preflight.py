"""Will a trial fit? The trial's backend estimates its memory against the trial's budget, before anything is
launched (``verl_core``: :mod:`hpo.backends.verl_core._memory`; real verl: :mod:`hpo.backends.verl._memory`; a
custom command or TRL: no estimate, their keys and corners are checked by the trainer).

* Per trial (``trial.preflight: true``; the backend's ``memory``, :meth:`~hpo.backends.MemoryModel.predict`): a
  trial whose estimate times ``1 + trial.preflight_margin`` exceeds its budget is not launched; it is recorded
  with the worst value and ``fail_reason=predicted_oom`` (``predicted_memory_gb``, ``memory_budget_gb``,
  ``memory_problem``).
* Per space (:func:`check_space_fits`, :meth:`~hpo.backends.MemoryModel.corner_predictions`): when every corner
  of the space is predicted not to fit, the search is refused before the study is created (one line naming the
  smallest corner's culprit).
* ``verl-hpo validate --space`` (:func:`validate_space`, :meth:`~hpo.backends.MemoryModel.validate`): every
  corner's checks, warnings and estimate, exit 0 / 2; a backend without a memory model: what was checked, exit 0.

Here: what every estimate shares: :class:`Prediction`, the space's :func:`corners`, the devices trials may use
(:func:`resolve_devices`), the free memory of a trial's GPUs (:func:`gpu_budget`) and the report of every corner's
verdict (:func:`report_corners`).
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from hpo.backends._base import CommandBackend
from hpo.backends._registry import backend_of
from hpo.execution import detect_devices
from hpo.experiment import Space, SpaceError, TrialSpec

if TYPE_CHECKING:
    from hpo.backends._shapes import SequenceLengths

MAX_CORNERS = 64
GiB = 2**30


@dataclass(frozen=True)
class Prediction:
    """One config's estimate against its budget."""

    total: int
    budget: int
    budget_source: str
    device: str
    problem: str | None  # None when it fits (margin included)
    table: str
    worst_total: int | None = None  # verl: the worst-case peak (every sequence at its maximum length)
    warning: str | None = None  # verl: set when the expected peak fits but the worst case does not

    @property
    def fits(self) -> bool:
        return self.problem is None


def resolve_devices(spec: TrialSpec, override: Sequence[str] | None = None) -> list[str]:
    """The devices trials may use (``--devices``, else ``trial.devices``, else detected); SpaceError when a
    trial needs more than there are."""
    devices = list(override) if override is not None else (
        list(spec.devices) if spec.devices is not None else detect_devices())
    if devices and spec.gpus_per_trial > len(devices):
        raise SpaceError(f"trial.gpus_per_trial={spec.gpus_per_trial} but only {len(devices)} device(s) are "
                         f"available ({','.join(devices)})")
    return devices


def gpu_budget(devices: Sequence[str]) -> tuple[int, str] | None:
    """(the free memory of the tightest of ``devices``, where it comes from) by nvidia-smi; None when none of them
    is visible here."""
    from hpo.backends._shapes import gpu_memory

    gpus = gpu_memory()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    order = [d.strip() for d in visible.split(",")] if visible is not None else [str(i) for i in range(len(gpus))]
    free = [gpus[order.index(d)][0] for d in devices if d in order and order.index(d) < len(gpus)]
    if not free:
        return None
    return min(free), f"free memory of GPU {','.join(devices)} (nvidia-smi)"


def read_lengths(path: Path, prompt_metric: str, response_metric: str) -> SequenceLengths:
    """A previous run's largest mean prompt and response lengths (the backend's ``prompt_metric`` and
    ``response_metric``: verl's ``prompt_length/mean`` and ``response_length/mean``) from its metrics file (verl's
    ``file`` logger format, which ``verl_core`` also writes): what ``validate --metrics`` estimates at. SpaceError
    with one line for a file without them."""
    from hpo.backends._shapes import EstimateError, read_sequence_lengths

    try:
        return read_sequence_lengths(path, prompt_metric, response_metric)
    except EstimateError as err:
        raise SpaceError(str(err)) from None


def corners(space: Space) -> list[dict[str, Any]]:
    """Every parameter at its ends (or each choice), jointly; at most MAX_CORNERS."""
    combos = itertools.islice(itertools.product(*(p.corner_values() for p in space.params)), MAX_CORNERS)
    return [{p.name: v for p, v in zip(space.params, combo, strict=True)} for combo in combos]


def shown(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in values.items())


def check_space_fits(space: Space, devices: Sequence[str], *, lengths: SequenceLengths | None = None) -> None:
    """SpaceError when no corner of the space is predicted to fit (a study that could only record failures), by its
    backend's estimate on one trial's share of ``devices`` (none: nothing to check); at the expected ``lengths``
    when given (verl)."""
    if not space.trial.preflight:
        return
    per_trial = list(devices[: space.trial.gpus_per_trial])
    memory = backend_of(space).memory
    predictions = None if memory is None else memory.corner_predictions(space, per_trial, lengths)
    if predictions and not any(p.fits for _, p in predictions):
        values, smallest = min(predictions, key=lambda cp: cp[1].total)
        raise SpaceError(f"{space.source}: every corner of the space is predicted not to fit in memory (smallest: "
                         f"{shown(values)} {smallest.problem}); lower the batch sizes or raise "
                         "trial.memory_limit_gb, or set trial.preflight: false")


def validate_space(space: Space, devices: Sequence[str], out: TextIO, *,
                   lengths: SequenceLengths | None = None) -> int:
    """Print every corner's verdict (and the largest corner's table), by the space's backend on one trial's share of
    ``devices``; 0 when all fit, else 2 with one line. ``lengths``: expected sequence lengths (``verl-hpo validate
    --metrics``; verl spaces). Without a memory model: what was checked, and 0."""
    backend = backend_of(space)
    if backend.memory is not None:
        return backend.memory.validate(space, list(devices[: space.trial.gpus_per_trial]), out, lengths)
    what = ("trial.command is not the default trainer: only the space itself was checked"
            if backend.name == CommandBackend.name else
            f"trial.backend {backend.name}: keys and corners checked by the trainer; no memory estimate")
    print(f"{space.source}: {what}", file=out)
    print("All checks passed", file=out)
    return 0


def report_corners(space: Space, results: Sequence[tuple[dict[str, Any], Prediction]], warnings: list[str],
                   out: TextIO) -> int:
    """Every corner's verdict, the warnings, the largest corner's table; 0 when all fit, else 2 with one line."""
    worst: tuple[dict[str, Any], Prediction] | None = None
    bad: list[tuple[dict[str, Any], Prediction]] = []
    for values, pred in results:
        verdict = "DOES NOT FIT" if not pred.fits else "fits (worst case does not)" if pred.warning else "fits"
        worst_case = (f", worst case {pred.worst_total / GiB:.3f} GiB" if pred.worst_total is not None
                      and pred.worst_total != pred.total else "")
        device = ("a GPU, when the trials get one" if pred.device == "cuda" and space.trial.gpus_per_trial == 0
                  else pred.device)  # a CPU study's trial is never said to run "on cuda"
        print(f"corner {shown(values)}: {pred.total / GiB:.3f} GiB{worst_case} of {pred.budget / GiB:.3f} GiB "
              f"({pred.budget_source}) on {device}: {verdict}", file=out)
        if pred.warning:
            warnings = [*warnings, f"corner {shown(values)}: {pred.warning}"]
        if worst is None or pred.total > worst[1].total:
            worst = (values, pred)
        if not pred.fits:
            bad.append((values, pred))
    for w in warnings:
        print(f"warning: {w}", file=out)
    if worst is not None:
        print(f"\nlargest corner ({shown(worst[0])}):\n{worst[1].table}\n", file=out)
    if bad:
        values, pred = bad[0]
        print(f"error: {space.source}: {len(bad)} corner(s) predicted not to fit in memory; first: {shown(values)} "
              f"{pred.problem}", file=sys.stderr)
        return 2
    print("All checks passed", file=out)
    return 0
