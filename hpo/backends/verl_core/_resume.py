"""How ``verl_core`` continues a run from a checkpoint (the backend's ``resumable`` feature): its checkpoints are
``<trainer.default_local_dir>/global_step_<N>/`` (``verl_core/checkpoint.py``: written into a temporary directory
renamed into place, ``state.pt`` inside), a run continues one with ``trainer.resume_mode=resume_path
trainer.resume_from_path=<it>`` (the run's own config winning over the optimizer hyperparameters the checkpoint
restores), and a PBT segment trains to its last step and saves there. The driver sets ``default_local_dir`` to
``<trial dir>/checkpoints``, so a retry finds its chain's checkpoints by the walk every resumable backend shares
(:func:`hpo.backends._replay.resume_point`)."""

from __future__ import annotations

from pathlib import Path

from hpo.backends._replay import (
    CheckpointLayout,
    CheckpointLost,
    command_argv,
    note_lost,
    real_dir,
    regular_file,
    step_number,
)
from hpo.experiment import Space

STEP_DIR = "global_step_"  # global_step_<step> (hpo.backends._replay.step_number)
RESUME_MODE, RESUME_PATH = "trainer.resume_mode", "trainer.resume_from_path"


def step_of(checkpoint: Path) -> int | None:
    name = checkpoint.name
    return step_number(name[len(STEP_DIR):]) if name.startswith(STEP_DIR) else None


def checkpoint_complete(folder: Path) -> bool:
    """A ``global_step_N`` that ``verl_core`` resumes: a directory itself (no link followed) holding ``state.pt`` as a
    regular file (the rename made it whole). One whose files are refused is lost: one line to
    :func:`~hpo.backends._replay.lost_checkpoints`, never read through."""
    try:
        return step_of(folder) is not None and real_dir(folder) and regular_file(folder / "state.pt")
    except CheckpointLost as err:
        note_lost(f"{folder} not used: {err}")
        return False


def checkpoint_step(checkpoints: Path) -> int | None:
    """The step of the newest complete checkpoint in a checkpoints directory; None when there is none."""
    try:
        steps = sorted({s for d in checkpoints.iterdir() if (s := step_of(d)) is not None}, reverse=True)
    except OSError:
        return None
    return next((s for s in steps if checkpoint_complete(checkpoints / f"{STEP_DIR}{s}")), None)


def resumed_from(trial_dir: Path) -> Path | None:
    """The checkpoint an attempt started from (``trainer.resume_from_path=`` in its ``command.json``, the last one
    given); CheckpointLost when that file is refused (:func:`~hpo.backends._replay.command_argv`)."""
    argv = command_argv(trial_dir) or []
    value = next((a.partition("=")[2] for a in reversed(argv) if a.startswith(f"{RESUME_PATH}=")), None)
    return None if value in (None, "", "null") else Path(value)


LAYOUT = CheckpointLayout(newest=checkpoint_step, step_dir=lambda d, step: d / f"{STEP_DIR}{step}",
                          step_of=step_of, resumed_from=resumed_from)


def resume_overrides(checkpoint: Path) -> list[str]:
    """A run that continues from ``checkpoint``, its own config winning over the hyperparameters it restores."""
    return [f"{RESUME_MODE}=resume_path", f"{RESUME_PATH}={checkpoint}"]


def save_overrides(step: int) -> list[str]:
    """A run that also saves at ``step`` (and its multiples, and its last step): ``trainer.save_freq``. verl_core's
    loop (``verl_core/trainer.py`` ``fit``) saves a step's checkpoint (written under a temporary name, renamed into
    place, the tracker last) before it logs that step's metrics line, and a save reads the state without changing
    it (no random draw: every step reseeds from the seed and its number), so a run stopped right after the line
    leaves the checkpoint whole and trains as it would have without the save."""
    return [f"trainer.save_freq={int(step)}"]


def segment_overrides(space: Space, end: int, checkpoint: str | None) -> tuple[list[str], Path | None]:
    """A PBT segment: trains to step ``end`` and saves there; from ``checkpoint`` (the command adds
    :func:`resume_overrides`), else afresh (no resume of an earlier run's own checkpoints)."""
    out = [f"trainer.total_training_steps={end}", f"trainer.save_freq={end}"]
    if not checkpoint:
        return [*out, f"{RESUME_MODE}=disable"], None
    return out, Path(checkpoint)
