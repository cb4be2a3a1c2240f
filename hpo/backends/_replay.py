"""A retry chain's resume point, for any backend that saves checkpoints: the newest complete checkpoint of the
chain's attempts (:func:`resume_point`, the one walk the backends share; each says how its checkpoints look with a
:class:`CheckpointLayout`), and one curve from the metrics files of the attempts that led to it: what a retry
replays into its pruner, aggregate and diagnosis before its process logs anything (:meth:`ResumePoint.records`).

Attempt k of a chain ran as trial ``history[k]`` and saved into ``<trials_dir>/<history[k]>/checkpoints``; an
attempt that was itself resumed names its start checkpoint in its ``command.json`` (the layout reads it back), so
the lineage of a checkpoint is followed back through the attempts that trained towards it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hpo.execution._metrics import MetricsTail


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


@dataclasses.dataclass(frozen=True)
class CheckpointLayout:
    """How one trainer's checkpoints look on disk, for :func:`resume_point`."""

    newest: Callable[[Path], int | None]  # a checkpoints directory -> the step of its newest complete checkpoint
    step_dir: Callable[[Path, int], Path]  # (checkpoints directory, step) -> that checkpoint's directory
    step_of: Callable[[Path], int | None]  # a checkpoint directory -> its step (None: not one of this trainer's)
    resumed_from: Callable[[Path], Path | None]  # an attempt's trial directory -> the checkpoint it started from


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """Where a retry continues (``checkpoint``, at ``step``) and the metrics files of the attempts whose training led
    to it (``lineage``, oldest first; ``starts``: the step each of them resumed from, None for a fresh start)."""

    checkpoint: Path
    step: int
    lineage: tuple[Path, ...]
    starts: tuple[int | None, ...]

    def records(self) -> list[tuple[int, dict[str, Any]]]:
        """The steps the lineage logged up to the checkpoint, as one curve."""
        return replay_records(self.lineage, self.step, self.starts)


def resume_point(trials_dir: Path, history: Sequence[int], layout: CheckpointLayout,
                 metrics: Callable[[Path, int], Path]) -> ResumePoint | None:
    """The newest complete checkpoint along a retry chain (attempt k ran as trial ``history[k]``; the later attempt
    wins a tie), and the lineage of attempts that led to it (``metrics(trial_dir, k)``: attempt k's metrics file);
    None when no attempt left one (the retry starts afresh). A start checkpoint outside the chain ends the lineage
    there (a PBT segment's parent is not replayed)."""
    best: tuple[int, int] | None = None  # (step, attempt)
    for k, number in enumerate(history):
        step = layout.newest(trials_dir / str(number) / "checkpoints")
        if step is not None and (best is None or step >= best[0]):
            best = (step, k)
    if best is None:
        return None
    step, k = best
    index = {str(n): i for i, n in enumerate(history)}
    chain: list[tuple[int, int | None]] = []  # (attempt, the step it resumed from)
    attempt: int | None = k
    while attempt is not None and attempt not in {a for a, _ in chain}:
        source = layout.resumed_from(trials_dir / str(history[attempt]))
        start = None if source is None else layout.step_of(source)
        chain.append((attempt, start))
        attempt = index.get(source.parent.parent.name) if source is not None and start is not None else None
    chain.reverse()
    return ResumePoint(layout.step_dir(trials_dir / str(history[k]) / "checkpoints", step), step,
                       tuple(metrics(trials_dir / str(history[a]), a) for a, _ in chain),
                       tuple(s for _, s in chain))
