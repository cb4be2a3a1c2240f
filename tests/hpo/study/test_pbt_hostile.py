"""Population-based training through the driver (``python -m hpo search``) with a trainer that turns on its
checkpoints (``tests/hpo/pbt_trainer.py``, run as ``python -m verl_core``): one that deletes its checkpoint, or
swaps it for a symbolic link, after every segment; one that rewrites the checkpoint it resumed from; and a
population whose every member collapses. A study always ends, one line per lost checkpoint; no checkpoint but a
segment's own changes; nothing of the trial's choosing is linked into the studies directory; ``best`` and
``confirm`` recommend no collapsed member."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from optuna.trial import TrialState

from tests.hpo.conftest import load, run_cli
from tests.hpo.pbt_trainer import stand_in_env

POPULATION, TOTAL, INTERVAL, MAX_ROLLBACKS = 3, 6, 2, 1
NORMAL = POPULATION * TOTAL // INTERVAL  # segments of a population none of whose segments fails


def pbt_space(tmp_path: Path, low: float = 1e-6, high: float = 1e-3) -> Path:
    space: dict[str, Any] = {
        "config": "tiny_arith",
        "overrides": {"trainer.total_training_steps": TOTAL, "trainer.test_freq": 1},
        "params": {"actor_lr": {"key": "actor_rollout_ref.actor.optim.lr", "type": "float", "low": low,
                                "high": high, "log": True}},
        "objective": {"metric": "eval/reward_mean", "direction": "maximize"},
        "early_stopping": {"enabled": False},
        "study": {"strategy": "pbt", "heartbeat_interval": 1, "grace_period": 5, "pruner": {"type": "none"},
                  "pbt": {"population": POPULATION, "interval_steps": INTERVAL, "max_rollbacks": MAX_ROLLBACKS,
                          "resample_probability": 0.0, "quantile": 0.34}},
        "trial": {"n_jobs": 1, "preflight": False, "timeout_s": 60},
    }
    path = tmp_path / "pbt.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def inodes(root: Path) -> set[tuple[int, int]]:
    """The files below ``root`` (no symbolic link followed), by inode."""
    out = set()
    for folder, _, files in os.walk(root):
        for name in files:
            st = os.lstat(os.path.join(folder, name))
            out.add((st.st_ino, st.st_dev))
    return out


def search(tmp_path: Path, studies: Path, hostile: str, **space: float) -> Any:
    """The study (a stalled one fails at run_cli's timeout: several times what it takes on a loaded machine)."""
    env = stand_in_env(tmp_path / "site", hostile)
    return run_cli(["search", "--space", str(pbt_space(tmp_path, **space)), "--study", "s"], studies, timeout=240,
                   **env)


@pytest.mark.slow  # a study through the driver and its dashboard: ~15 s each on 2 cores
@pytest.mark.parametrize("hostile", ["delete", "symlink", "etc"])
def test_a_study_whose_checkpoints_vanish_ends_with_a_line_per_lost_one(tmp_path: Path, studies: Path,
                                                                         hostile: str) -> None:
    res = search(tmp_path, studies, hostile)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    trials = load(studies, "s").trials
    segs = [t for t in trials if "pbt:member" in t.system_attrs and t.user_attrs.get("stop_reason") != "surplus"]
    ran = [t for t in segs if t.state == TrialState.COMPLETE and t.user_attrs.get("last_step") ==
           t.system_attrs["pbt:end"]]
    # every segment lost its checkpoint: each member retried its first interval while it had retries, then stopped
    assert len(segs) <= NORMAL and all(t.system_attrs["pbt:start"] == 0 for t in segs)
    assert len(segs) == POPULATION * (MAX_ROLLBACKS + 1), [(t.number, t.system_attrs["pbt:action"]) for t in segs]
    lost = [line for line in out.splitlines() if "is lost" in line]
    assert sorted(int(line.split("trial ")[1].split()[0]) for line in lost) == sorted(t.number for t in ran), lost
    want = "is gone" if hostile == "delete" else "is a symbolic link"
    assert all(want in line for line in lost), lost
    # each was found by the audit before deciding (its line names the step), none by a decision that failed to
    # queue and decided again (its line names the action: "... for its continue is lost")
    audited = {f"pbt: member {t.system_attrs['pbt:member']}: the checkpoint of trial {t.number} "
               f"(step {t.system_attrs['pbt:end']}) is lost: " for t in ran}
    assert sorted(line[:line.index("is lost: ") + 9] for line in lost) == sorted(audited), lost
    assert sum("stops at step 0" in line for line in out.splitlines()) == POPULATION, out[-3000:]

    if hostile == "symlink":  # nothing of the trial's choosing is linked into the studies directory
        assert inodes(tmp_path / "outside") and not inodes(tmp_path / "outside") & inodes(studies)
    best = run_cli(["best", "--study", "s", "--format", "schedule"], studies)
    assert best.returncode == 0, best.stderr
    found = json.loads(best.stdout)
    assert found["checkpoint"] is None and want in found["checkpoint_problem"]
    assert f"checkpoint none ({found['checkpoint_problem']})" in best.stderr


@pytest.mark.slow  # a population of 3 over 3 intervals through the driver: ~15 s on 2 cores
def test_a_trainer_that_rewrites_its_resume_checkpoint_changes_no_other(tmp_path: Path, studies: Path) -> None:
    res = search(tmp_path, studies, "write")
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    rewrites = [json.loads(line) for line in (tmp_path / "rewrites.jsonl").read_text().splitlines()]
    assert len(rewrites) == NORMAL - POPULATION  # every segment after the first resumed, and rewrote its copy
    assert all(r["checked"] > 0 and r["changed"] == [] for r in rewrites), rewrites
    trials = load(studies, "s").trials
    for m in range(POPULATION):  # the population trained on from the checkpoints as they were saved
        assert any(t.system_attrs.get("pbt:member") == m and t.state == TrialState.COMPLETE
                   and t.user_attrs.get("last_step") == TOTAL for t in trials), m
    assert not list((studies / "s" / "pbt").rglob("trial-*"))  # the segments' own copies went with them


@pytest.mark.slow  # 6 collapsing segments through the driver, then best and confirm: ~20 s on 2 cores
def test_every_member_collapsed_best_and_confirm_say_so(tmp_path: Path, studies: Path) -> None:
    res = search(tmp_path, studies, "", low=1e-2, high=1.0)  # every lr collapses, halved once: still too high
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    trials = load(studies, "s").trials
    assert all(t.user_attrs.get("stop_reason") == "collapsed:nan" for t in trials if "pbt:member" in t.system_attrs)
    for cmd in (["best", "--study", "s"], ["confirm", "--study", "s", "--top", "1", "--seeds", "1"]):
        got = run_cli(cmd, studies)
        assert got.returncode == 1, (cmd, got.returncode, got.stdout, got.stderr)
        lines = got.stderr.strip().splitlines()
        assert len(lines) == 1 and "no member is healthy" in lines[0], (cmd, got.stderr)
        assert lines[0].count("collapsed:nan") == POPULATION and got.stdout == "", (cmd, got.stdout)
