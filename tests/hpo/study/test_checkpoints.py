"""Trial checkpoints on disk (``hpo/study/_checkpoints.py``), on real trial directories: deleted once a trial is
finished unless it is among the ``trial.keep_checkpoints`` best (a proxy search's proxy and target runs ranked apart,
issue 51, so a small model's high values never push the target's checkpoints out), only ever in a directory the
driver made; and a checkpoint a trial wrote copied without following a link it planted or reading a special file."""

from __future__ import annotations

import os
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from hpo.record import ATTR_FIDELITY, TRIAL_MARKER
from hpo.study._checkpoints import (
    CHECKPOINTS,
    CheckpointUnusable,
    checkpoint_dirs,
    checkpoint_problem,
    clean_after,
    clone_tree,
)


def _trial(study: optuna.Study, trials_dir: Path, value: float, fidelity: str) -> optuna.trial.FrozenTrial:
    study.add_trial(optuna.create_trial(state=TrialState.COMPLETE, value=value, params={}, distributions={},
                                        system_attrs={ATTR_FIDELITY: fidelity}))
    t = study.get_trials(deepcopy=False)[-1]
    d = trials_dir / str(t.number)
    (d / CHECKPOINTS / "global_step_4").mkdir(parents=True)
    (d / CHECKPOINTS / "global_step_4" / "model.bin").write_bytes(b"x" * 1024)
    (d / TRIAL_MARKER).write_text("")
    return t


def test_proxy_and_target_runs_keep_their_best_apart(tmp_path: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", direction="maximize")
    trials_dir = tmp_path / "trials"
    proxies = [_trial(study, trials_dir, v, "proxy") for v in (0.95, 0.97)]  # the small model scores higher
    target = _trial(study, trials_dir, 0.80, "target")
    _, kept, _ = clean_after(study, target, 0.80, trials_dir, 1, proxies)
    assert kept and (trials_dir / str(target.number) / CHECKPOINTS).is_dir()  # the best target run keeps its own
    assert (trials_dir / str(proxies[1].number) / CHECKPOINTS).is_dir()  # and the best proxy run its own
    worse = _trial(study, trials_dir, 0.70, "target")
    _, kept, freed = clean_after(study, worse, 0.70, trials_dir, 1, [*proxies, target])
    assert not kept and freed > 0 and not (trials_dir / str(worse.number) / CHECKPOINTS).exists()
    assert (trials_dir / str(target.number) / CHECKPOINTS).is_dir()


def test_a_held_run_keeps_its_checkpoints_past_the_best_k_and_a_released_one_loses_them(tmp_path: Path) -> None:
    """A proxy search's promoted run the race may still continue is held (hpo.study._continuation): neither its own
    end nor a better target run pushing it out of the best keep_checkpoints deletes its checkpoints; once released
    they go at the next trial's end (unless among the best K)."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", direction="maximize")
    trials_dir = tmp_path / "trials"
    promoted = _trial(study, trials_dir, 0.60, "target")
    _, kept, _ = clean_after(study, promoted, 0.60, trials_dir, 0, [], held={promoted.number})
    assert kept and (trials_dir / str(promoted.number) / CHECKPOINTS).is_dir()  # keep_checkpoints 0: held anyway
    better = _trial(study, trials_dir, 0.90, "target")
    clean_after(study, better, 0.90, trials_dir, 1, [promoted], held={promoted.number})
    assert (trials_dir / str(promoted.number) / CHECKPOINTS).is_dir()  # out of the best 1, still held
    other = _trial(study, trials_dir, 0.50, "target")
    clean_after(study, other, 0.50, trials_dir, 1, [promoted, better], released=[promoted])
    assert not (trials_dir / str(promoted.number) / CHECKPOINTS).exists()
    assert (trials_dir / str(better.number) / CHECKPOINTS).is_dir()  # the best 1 keeps its own


def test_only_a_directory_the_driver_made_holds_checkpoints_it_may_delete(tmp_path: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize")
    trials_dir = tmp_path / "trials"
    made = _trial(study, trials_dir, 0.5, "target")
    theirs = trials_dir / "9" / CHECKPOINTS  # no marker: not the driver's
    theirs.mkdir(parents=True)
    (trials_dir / "10").symlink_to(trials_dir / str(made.number))  # a link to a driver-made directory
    assert checkpoint_dirs(trials_dir, [made.number, 9, 10, 11]) == [trials_dir / str(made.number) / CHECKPOINTS]
    _, kept, _ = clean_after(study, made, 0.5, trials_dir, 0, [])
    assert not kept and not (trials_dir / str(made.number) / CHECKPOINTS).exists() and theirs.is_dir()


def test_a_copy_follows_no_link_and_reads_no_special_file(tmp_path: Path) -> None:
    root = tmp_path / "trials"
    step = root / "3" / CHECKPOINTS / "global_step_4"
    (step / "actor").mkdir(parents=True)
    (step / "actor" / "model.bin").write_bytes(b"w" * 4096)
    parts = ("3", CHECKPOINTS, "global_step_4")
    assert checkpoint_problem(root, parts) is None
    clone_tree(root, parts, tmp_path / "copy", link=False)
    assert (tmp_path / "copy" / "actor" / "model.bin").read_bytes() == b"w" * 4096
    clone_tree(root, parts, tmp_path / "linked", link=True)  # hard links where it can: the same file
    assert (tmp_path / "linked" / "actor" / "model.bin").stat().st_ino == (step / "actor" / "model.bin").stat().st_ino
    secret = tmp_path / "secret"
    secret.write_text("the user's")
    (step / "actor" / "extra.pt").symlink_to(secret)  # planted by the trial
    with pytest.raises(CheckpointUnusable, match="extra.pt is a symbolic link"):
        clone_tree(root, parts, tmp_path / "copy2", link=False)
    assert not (tmp_path / "copy2").exists() and not list(tmp_path.glob(".copy2.tmp*"))  # nothing half-made left
    (step / "actor" / "extra.pt").unlink()
    os.mkfifo(step / "actor" / "pipe")  # reading it would hang the copy
    with pytest.raises(CheckpointUnusable, match="pipe is not a regular file"):
        clone_tree(root, parts, tmp_path / "copy3", link=False)
    away = tmp_path / "elsewhere"
    (root / "3" / CHECKPOINTS).rename(away)
    (root / "3" / CHECKPOINTS).symlink_to(away)  # a component on the way is a link
    assert checkpoint_problem(root, parts) == f"{root / '3' / CHECKPOINTS} is a symbolic link"
    assert checkpoint_problem(root, ("4", CHECKPOINTS)) == f"{root / '4'} is gone"
