"""Retries of a verl trial: the newest complete checkpoint along a retry chain, and the curve its attempts logged.

Every attempt saves into its own ``<trial dir>/checkpoints``. A retry of an interrupted trial (``retry_history`` of
the Optuna trial) continues from the newest complete checkpoint of any earlier attempt of its chain
(:func:`resume_point`; complete = every piece verl's ``_load_checkpoint`` reads, whatever the tracker file says:
verl removes the previous ``actor/`` before it rewrites the tracker) with ``trainer.resume_mode=resume_path
trainer.resume_from_path=<global_step_N>``. The steps that the attempts leading to that checkpoint logged are read
back by :func:`replay_records` (:meth:`ResumePoint.records`). Across hosts this needs the studies directory on a
shared filesystem; without a checkpoint the retry starts afresh.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from hpo.backends._replay import (
    CheckpointLayout,
    CheckpointLost,
    ResumePoint,
    command_argv,
    note_lost,
    real_dir,
    regular_file,
    step_number,
)
from hpo.backends._replay import resume_point as chain_resume_point
from hpo.backends.verl._launch import verl_metrics_path
from hpo.experiment import Space

CHECKPOINT_TRACKER = "latest_checkpointed_iteration.txt"  # verl writes it after each checkpoint; never read here
_STEP_DIR = "global_step_"  # global_step_<step> (hpo.backends._replay.step_number)
_SHARD = re.compile(r"^(model|optim|extra_state)_world_size_([0-9]{1,9})_rank_([0-9]{1,9})\.pt$")


def _shards_complete(folder: Path) -> bool:
    """An FSDP checkpoint of one role (``actor/``, ``critic/``) as verl's ``FSDPCheckpointManager.load_checkpoint``
    opens it: ``model_world_size_W_rank_r.pt`` for every rank r < W, and the ``optim_``/``extra_state_`` shards
    of every rank when that kind was saved at all (``checkpoint.save_contents``). A Megatron checkpoint
    (``dist_ckpt/``) counts when that directory is there. CheckpointLost when ``folder`` is a symbolic link."""
    if not real_dir(folder):
        return False
    try:
        names = [p.name for p in folder.iterdir()]
    except OSError:
        return False
    if "dist_ckpt" in names:
        return True
    shards: dict[str, set[tuple[int, int]]] = {}
    for name in names:
        m = _SHARD.match(name)
        if m:
            shards.setdefault(m.group(1), set()).add((int(m.group(2)), int(m.group(3))))
    model = shards.get("model", set())
    sizes = {w for w, _ in model}
    if len(sizes) != 1:
        return False
    world = sizes.pop()
    if any(len(got) != world for got in shards.values()):  # (before a set of ``world`` ranks is made of a name)
        return False
    return all(got == {(world, r) for r in range(world)} for got in shards.values())


def _complete(step_dir: Path, critic: bool | None) -> bool:
    if _step_of(step_dir) is None or not real_dir(step_dir):
        return False
    if not regular_file(step_dir / "data.pt") or not _shards_complete(step_dir / "actor"):
        return False
    if critic is None:
        critic = any((d / "critic").is_dir() for d in step_dir.parent.glob(f"{_STEP_DIR}*"))
    return not critic or _shards_complete(step_dir / "critic")


def checkpoint_complete(step_dir: Path, critic: bool | None = None) -> bool:
    """Whether a ``global_step_N`` directory holds everything verl 0.9.1's ``_load_checkpoint``
    (``trainer/ppo/v1/trainer_base.py``) reads: ``actor/`` shards, ``critic/`` shards when the run has a critic
    (``critic=None``: when a ``critic/`` directory is there or a sibling step has one), and ``data.pt``, which
    ``_save_checkpoint`` writes after both roles and right before the tracker file. A save removes the previous
    step's ``actor/`` (``max_actor_ckpt_to_keep``) before it rewrites the tracker, so a step the tracker names
    can be half gone, and a step after it can be complete without the tracker naming it. The step's directory,
    its roles' directories and ``data.pt`` must be themselves (no link followed, ``data.pt`` a regular file): a
    checkpoint that fails that is lost (one line to :func:`~hpo.backends._replay.lost_checkpoints`)."""
    try:
        return _complete(step_dir, critic)
    except CheckpointLost as err:
        note_lost(f"{step_dir} not used: {err}")
        return False


def checkpoint_step(checkpoints: Path) -> int | None:
    """The step of the newest complete checkpoint (:func:`checkpoint_complete`) in a ``default_local_dir``,
    whether or not verl's tracker file names it; None when there is none."""
    try:
        steps = sorted({s for d in checkpoints.iterdir() if (s := _step_of(d)) is not None}, reverse=True)
    except OSError:
        return None
    return next((s for s in steps if checkpoint_complete(checkpoints / f"{_STEP_DIR}{s}")), None)


def resumed_from(trial_dir: Path) -> Path | None:
    """The checkpoint an attempt was started from (``trainer.resume_from_path`` in its ``command.json``);
    CheckpointLost when that file is refused (:func:`~hpo.backends._replay.command_argv`)."""
    argv = command_argv(trial_dir) or []
    value = next((a.split("=", 1)[1] for a in argv if a.startswith("trainer.resume_from_path=")), None)
    return None if value in (None, "null") else Path(value.strip("'"))


def _step_of(checkpoint: Path) -> int | None:
    name = checkpoint.name
    return step_number(name[len(_STEP_DIR):]) if name.startswith(_STEP_DIR) else None


LAYOUT = CheckpointLayout(newest=checkpoint_step, step_dir=lambda d, step: d / f"{_STEP_DIR}{step}",
                          step_of=_step_of, resumed_from=resumed_from)


def resume_point(trials_dir: Path, retry_history: Sequence[int]) -> ResumePoint | None:
    """The newest complete ``global_step_N`` along a retry chain and the attempts that led to it (the shared walk,
    :func:`hpo.backends._replay.resume_point`); None when no attempt left a complete checkpoint."""
    return chain_resume_point(trials_dir, retry_history, LAYOUT, verl_metrics_path)


def resume_checkpoints(trials_dir: Path, retry_history: Sequence[int]) -> Path | None:
    """The ``global_step_N`` directory a retry continues from (:func:`resume_point`), else None."""
    point = resume_point(trials_dir, retry_history)
    return None if point is None else point.checkpoint


def attempt_files(trials_dir: Path, retry_history: Sequence[int]) -> list[Path]:
    """The metrics files of the earlier attempts of a chain, oldest first (attempt k ran as trial
    ``retry_history[k]``)."""
    return [verl_metrics_path(trials_dir / str(n), k) for k, n in enumerate(retry_history)]


def retry_note(space: Space) -> str | None:
    """A line when the experiment's checkpoints leave a retried trial nothing to resume (verl's default
    ``trainer.save_freq: -1`` saves only at the last step), else None."""
    fixed = {k.lstrip("+"): v for k, v in space.overrides.items()}
    freq, steps = fixed.get("trainer.save_freq", -1), fixed.get("trainer.total_training_steps")
    try:
        freq = int(freq)
        steps = None if steps is None else int(steps)
    except (TypeError, ValueError):
        return None
    if freq > 0 and (steps is None or freq < steps):
        return None
    return (f"trainer.save_freq={freq}: no checkpoint before the last step, so a retried trial (its driver killed, "
            "its node lost) starts over from step 0; set it to a few evaluations' worth of steps")
