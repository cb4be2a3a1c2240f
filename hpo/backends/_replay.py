"""A retry chain's resume point, for any backend that saves checkpoints: the newest complete checkpoint of the
chain's attempts (:func:`resume_point`, the one walk the backends share; each says how its checkpoints look with a
:class:`CheckpointLayout`), and one curve from the metrics files of the attempts that led to it: what a retry
replays into its pruner, aggregate and diagnosis before its process logs anything (:meth:`ResumePoint.records`).

Attempt k of a chain ran as trial ``history[k]`` and saved into ``<trials_dir>/<history[k]>/checkpoints``; an
attempt that was itself resumed names its start checkpoint in its ``command.json`` (the layout reads it back), so
the lineage of a checkpoint is followed back through the attempts that trained towards it.

Everything under a trial's directory is the trial's (or a previous run's) output, read as untrusted: a layout reads
a file there with :func:`read_trial_file` (no link followed, a regular file, a size cap: a FIFO never blocks,
``/dev/zero`` is never read), a checkpoint's step only from ``0``..:data:`MAX_STEP` in plain digits
(:func:`step_number`). A checkpoint one of whose files is refused, or whose numbers are odd, is lost: the layout
raises :class:`CheckpointLost` (one line), the walk passes it over (an earlier good checkpoint, else a fresh start)
and says so in one line to whoever collects them (:func:`lost_checkpoints`: the driver prints it beside the trial)."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import os
import re
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from hpo.analysis import FileRefused, check_regular, read_trial_file
from hpo.execution import MAX_STEP, MetricsFileError, MetricsTail

MAX_COMMAND_BYTES = 4 << 20  # a trial's command.json: argv (the driver caps it at 512 KiB) twice (argv, shell), the env
_DIGITS = re.compile(r"0|[1-9][0-9]{0,9}")
_NOTES: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("lost_checkpoints", default=None)


class CheckpointLost(Exception):
    """A checkpoint (or the record of how an attempt started) that a layout will not use: a file of it refused (a
    link, a FIFO, a device, too large) or a value out of range. ``str(err)`` is one line naming the file."""


@contextlib.contextmanager
def lost_checkpoints() -> Iterator[list[str]]:
    """Collects the lines :func:`note_lost` gives while the block runs (in this thread or context)."""
    notes: list[str] = []
    token = _NOTES.set(notes)
    try:
        yield notes
    finally:
        _NOTES.reset(token)


def note_lost(line: str) -> None:
    """A layout passed over a checkpoint (:class:`CheckpointLost`): one line for :func:`lost_checkpoints`."""
    notes = _NOTES.get()
    if notes is not None:
        notes.append(line)


def step_number(text: str) -> int | None:
    """The step a checkpoint's name gives (``global_step_<text>``, ``checkpoint-<text>``): plain ASCII digits, no
    leading zero, at most :data:`MAX_STEP`; None otherwise (not a checkpoint of the trainer)."""
    if not _DIGITS.fullmatch(text):
        return None
    step = int(text)
    return step if step <= MAX_STEP else None


def read_checkpoint_file(path: Path, limit: int) -> bytes | None:
    """A file of a trial's directory that a layout reads: its bytes; None when it is not there (yet);
    CheckpointLost when it is refused (a link, a FIFO, a device, a directory, over ``limit``) or unreadable."""
    try:
        return read_trial_file(path, limit)
    except FileNotFoundError:
        return None
    except FileRefused as err:
        raise CheckpointLost(str(err)) from None
    except OSError as err:
        raise CheckpointLost(f"{path}: {err.strerror or type(err).__name__}") from None


def regular_file(path: Path) -> bool:
    """``path`` is a regular file itself (not read); False when it is not there; CheckpointLost when it is a link,
    a FIFO, a device or a directory, or cannot be opened."""
    try:
        check_regular(path, str(path), follow=False)
    except FileNotFoundError:
        return False
    except FileRefused as err:
        raise CheckpointLost(str(err)) from None
    except OSError as err:
        raise CheckpointLost(f"{path}: {err.strerror or type(err).__name__}") from None
    return True


def real_dir(path: Path) -> bool:
    """``path`` is a directory itself (not a link to one); CheckpointLost for a link, False when missing."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return False
    if stat.S_ISLNK(mode):
        raise CheckpointLost(f"{path}: is a symbolic link, not followed")
    return stat.S_ISDIR(mode)


def command_argv(trial_dir: Path) -> list[str] | None:
    """The argv an attempt was started with (its ``command.json``, which the driver writes before the launch);
    None when there is none; CheckpointLost when it is refused or not the driver's JSON."""
    path = trial_dir / "command.json"
    raw = read_checkpoint_file(path, MAX_COMMAND_BYTES)
    if raw is None:
        return None
    try:
        argv = json.loads(raw)["argv"]
    except (ValueError, RecursionError, KeyError, TypeError):
        argv = None
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise CheckpointLost(f"{path}: not the driver's record of the launch (no argv list of strings)")
    return argv


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
        try:
            records = MetricsTail(path, follow=False).read()
        except MetricsFileError:  # replaced since the walk checked it: nothing of it is replayed
            records = []
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
    # (CheckpointLost: its record is refused, so where its checkpoints come from is unknown: they are not used)


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
    there (a PBT segment's parent is not replayed). An attempt whose lineage cannot be read (a refused
    ``command.json`` or metrics file: :class:`CheckpointLost`) gives no checkpoint; the walk then takes the next
    best. Checkpoints passed over are told in one line to :func:`lost_checkpoints`."""
    with lost_checkpoints() as lost:
        point = _walk(trials_dir, history, layout, metrics)
    if lost:
        more = f" (and {len(lost) - 1} more)" if len(lost) > 1 else ""
        then = f"the retry continues from {point.checkpoint}" if point is not None else "the retry starts afresh"
        note_lost(f"{lost[0]}{more}; {then}")
    return point


def _walk(trials_dir: Path, history: Sequence[int], layout: CheckpointLayout,
          metrics: Callable[[Path, int], Path]) -> ResumePoint | None:
    newest = [layout.newest(trials_dir / str(number) / "checkpoints") for number in history]
    usable = set(range(len(history)))
    while True:
        best: tuple[int, int] | None = None  # (step, attempt)
        for k in sorted(usable):
            step = newest[k]
            if step is not None and (best is None or step >= best[0]):
                best = (step, k)
        if best is None:
            return None
        step, k = best
        try:
            chain = _lineage(trials_dir, history, layout, metrics, k)
        except CheckpointLost as err:
            note_lost(f"{layout.step_dir(trials_dir / str(history[k]) / 'checkpoints', step)} not used: {err}")
            usable.discard(k)
            continue
        return ResumePoint(layout.step_dir(trials_dir / str(history[k]) / "checkpoints", step), step,
                           tuple(metrics(trials_dir / str(history[a]), a) for a, _ in chain),
                           tuple(s for _, s in chain))


def _lineage(trials_dir: Path, history: Sequence[int], layout: CheckpointLayout,
             metrics: Callable[[Path, int], Path], k: int) -> list[tuple[int, int | None]]:
    """(attempt, the step it resumed from) of the attempts that trained towards attempt ``k``'s checkpoints, oldest
    first; CheckpointLost when the record of one of them, or its metrics file, is refused."""
    index = {str(n): i for i, n in enumerate(history)}
    chain: list[tuple[int, int | None]] = []
    attempt: int | None = k
    while attempt is not None and attempt not in {a for a, _ in chain}:
        trial_dir = trials_dir / str(history[attempt])
        _check_metrics(metrics(trial_dir, attempt))
        source = layout.resumed_from(trial_dir)
        start = None if source is None else layout.step_of(source)
        chain.append((attempt, start))
        attempt = index.get(source.parent.parent.name) if source is not None and start is not None else None
    chain.reverse()
    return chain


def _check_metrics(path: Path) -> None:
    """A metrics file to replay: missing (the attempt logged nothing) or a regular file itself (CheckpointLost)."""
    regular_file(path)
