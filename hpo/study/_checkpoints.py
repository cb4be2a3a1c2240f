"""Trial checkpoints on disk: kept while a trial can be resumed, then deleted, except the best K (issue 21).

A verl trial saves at its last step (fp32 weights plus Adam state: ~6-8 GB at 0.5B, ~100 GB at 7B), and a retry of
an interrupted trial continues from an earlier attempt's checkpoint, so a checkpoint is worth keeping only while its
trial is running or interrupted. Once a trial is finished (:func:`clean_after`), the ``checkpoints/`` directories
of the trial and of every attempt of its retry chain are deleted, unless ``trial.keep_checkpoints`` = K > 0 and the
trial is among the study's K best finished trials; a trial that falls out of the best K loses its checkpoints then.

Only directories inside trial directories the driver made (they hold its marker) are ever deleted, never through a
symbolic link. The size of each trial's checkpoints is recorded before deletion (user attr ``checkpoint_gb``;
``checkpoint_kept`` says whether they stay); :func:`disk_usage` sums what the study's trials hold now.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

CHECKPOINTS = "checkpoints"
TRIAL_MARKER = ".verl-hpo-trial"  # the driver's mark in every trial directory it creates (hpo.study._command)


def dir_bytes(path: Path) -> int:
    """Bytes allocated below ``path`` (symbolic links not followed); 0 when it is missing."""
    total = 0
    stack = [path]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(Path(entry.path))
                        else:
                            total += entry.stat(follow_symlinks=False).st_blocks * 512
                    except OSError:
                        continue
        except OSError:
            continue
    return total


def chain(t: FrozenTrial) -> list[int]:
    """The trial and every earlier attempt it retries (their checkpoints are where a retry resumes from)."""
    history = t.system_attrs.get("retry_history")
    earlier = [int(n) for n in history if isinstance(n, int)] if isinstance(history, list) else []
    return [*earlier, t.number]


def checkpoint_dirs(trials_dir: Path, numbers: Iterable[int]) -> list[Path]:
    """``<trials_dir>/<n>/checkpoints`` of the given trials that exist in a driver-made trial directory."""
    out = []
    for n in numbers:
        trial_dir = trials_dir / str(n)
        ckpt = trial_dir / CHECKPOINTS
        if (trial_dir / TRIAL_MARKER).is_file() and not trial_dir.is_symlink() and ckpt.is_dir() \
                and not ckpt.is_symlink():
            out.append(ckpt)
    return out


def clean_after(study: optuna.Study, trial: FrozenTrial, value: float | None, trials_dir: Path, keep: int,
                finished: Iterable[FrozenTrial]) -> tuple[float, bool, float]:
    """``trial`` has just finished with ``value`` (None: no finite value) and is about to be told: delete the
    checkpoints of its chain unless it is among the ``keep`` best of itself and ``finished`` (the study's other
    finished search trials), and those of a trial it pushed out of the best ``keep``. Returns (GB its checkpoints
    held, whether they are kept, GB freed in all)."""
    maximize = study.directions[0] == optuna.study.StudyDirection.MAXIMIZE
    scored = [(t.values[0], t) for t in finished if t.number != trial.number and t.state == TrialState.COMPLETE
              and t.values and math.isfinite(t.values[0])]
    if value is not None and math.isfinite(value):
        scored.append((value, trial))
    scored.sort(key=lambda vt: -vt[0] if maximize else vt[0])
    best = [t for _, t in scored[:keep]] if keep > 0 else []
    kept_numbers = {n for t in best for n in chain(t)}
    mine = checkpoint_dirs(trials_dir, chain(trial))
    size = sum(dir_bytes(d) for d in mine)
    kept = trial.number in {t.number for t in best}
    drop = [] if kept else mine
    if keep > 0:  # a trial that fell out of the best K loses its checkpoints now
        drop += [d for _, t in scored if t.number != trial.number for d in checkpoint_dirs(trials_dir, chain(t))
                 if int(d.parent.name) not in kept_numbers]
    freed = 0
    for d in drop:
        freed += dir_bytes(d)
        shutil.rmtree(d, ignore_errors=True)
    return size / 2**30, kept, freed / 2**30


def disk_usage(trials_dir: Path) -> float:
    """GB the study's trial directories hold now (checkpoints, logs, metrics)."""
    return dir_bytes(trials_dir) / 2**30
