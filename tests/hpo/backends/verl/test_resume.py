"""A retry of a verl trial (``hpo/backends/verl/_resume.py``): the newest complete checkpoint of its retry chain (every
piece verl's loader reads, on hand-made FSDP checkpoints), the curve its attempts logged up to it, and, with the
stand-in for ``main_ppo`` (``conftest.py``), an attempt killed after a checkpoint continued by the next one; a study
whose retries start over is said."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
from pathlib import Path

import pytest

from hpo.backends import load_space
from hpo.backends import verl as _verl
from hpo.backends.verl import replay_records, resume_checkpoints
from hpo.backends.verl._resume import retry_note
from hpo.execution import MetricsTail
from tests.hpo.backends.verl.conftest import CPU_SPACE, VAL, launch, run_until, steps

pytestmark = pytest.mark.cpu_heavy  # verl on every core: make test-slow runs these one at a time


# ----------------------------------------------------------------------------- checkpoints and the retry chain
def fake_checkpoint(root: Path, step: int, actor: bool = True, data: bool = True, world: int = 1,
                    critic: bool = False, tracker: bool = True) -> Path:
    """A verl 0.9.1 FSDP checkpoint laid out as FSDPCheckpointManager and _save_checkpoint write it."""
    folder = root / f"global_step_{step}"
    for role, wanted in (("actor", actor), ("critic", critic)):
        if wanted:
            (folder / role / "huggingface").mkdir(parents=True, exist_ok=True)
            for r in range(world):
                for kind in ("model", "optim", "extra_state"):
                    (folder / role / f"{kind}_world_size_{world}_rank_{r}.pt").write_bytes(b"x")
    folder.mkdir(parents=True, exist_ok=True)
    if data:
        (folder / "data.pt").write_bytes(b"x")
    if tracker:
        (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    return folder


def test_checkpoint_step_checks_every_piece_verl_loads(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    fake_checkpoint(root, 3)
    assert _verl.checkpoint_step(root) == 3
    fake_checkpoint(root, 6, data=False, tracker=False)  # killed mid-save: actor/ written, no data.pt
    assert _verl.checkpoint_step(root) == 3
    (root / "global_step_6" / "data.pt").write_bytes(b"x")  # killed right before the tracker: complete
    assert _verl.checkpoint_step(root) == 6
    half = tmp_path / "half"  # max_actor_ckpt_to_keep=1: the tracker's step lost its actor/ to the next save
    fake_checkpoint(half, 3)
    fake_checkpoint(half, 6, data=False, tracker=False)
    import shutil

    shutil.rmtree(half / "global_step_3" / "actor")
    assert (half / "latest_checkpointed_iteration.txt").read_text() == "3"
    assert _verl.checkpoint_step(half) is None
    two = tmp_path / "two"  # a rank's shard missing
    fake_checkpoint(two, 2, world=2)
    assert _verl.checkpoint_step(two) == 2
    (two / "global_step_2" / "actor" / "optim_world_size_2_rank_1.pt").unlink()
    assert _verl.checkpoint_step(two) is None
    critic = tmp_path / "critic"  # a run with a critic needs critic/ too
    fake_checkpoint(critic, 4, critic=True)
    fake_checkpoint(critic, 8)
    assert _verl.checkpoint_step(critic) == 4
    assert _verl.checkpoint_step(tmp_path / "none") is None


def test_resume_point_is_the_newest_complete_checkpoint_of_the_whole_chain(tmp_path: Path) -> None:
    trials = tmp_path / "trials"

    def attempt(number: int, resumed_from: Path | None) -> None:
        (trials / str(number)).mkdir(parents=True, exist_ok=True)
        argv = ["py", "-m", "verl.trainer.main_ppo"] + (
            [f"trainer.resume_from_path={resumed_from}"] if resumed_from else ["trainer.resume_mode=auto"])
        (trials / str(number) / "command.json").write_text(json.dumps({"argv": argv}))

    attempt(4, None)  # attempt 0: saved step 6
    fake_checkpoint(trials / "4" / "checkpoints", 6)
    attempt(9, trials / "4" / "checkpoints" / "global_step_6")  # attempt 1: resumed from 6, saved 9
    fake_checkpoint(trials / "9" / "checkpoints", 9)
    attempt(12, None)  # attempt 2: no checkpoint found then (say), saved nothing
    point = _verl.resume_point(trials, (4, 9, 12))
    assert point is not None and point.checkpoint == trials / "9" / "checkpoints" / "global_step_9"
    assert point.step == 9 and point.starts == (None, 6)
    assert point.lineage == (trials / "4" / "metrics.jsonl", trials / "9" / "metrics.attempt1.jsonl")
    assert resume_checkpoints(trials, (4, 9, 12)) == point.checkpoint
    assert resume_checkpoints(trials, (4,)) == trials / "4" / "checkpoints" / "global_step_6"
    # attempt 2 restarted from scratch and saved step 3: older than 9, not used
    fake_checkpoint(trials / "12" / "checkpoints", 3)
    assert resume_checkpoints(trials, (4, 9, 12)) == point.checkpoint
    assert resume_checkpoints(trials, ()) is None and resume_checkpoints(trials, (77,)) is None


def test_replay_follows_the_lineage_of_the_checkpoint(tmp_path: Path) -> None:
    def log(path: Path, steps_: range, scale: int) -> Path:
        path.write_text("".join(json.dumps({"step": s, "data": {"x": scale * s}}) + "\n" for s in steps_))
        return path

    a = log(tmp_path / "a.jsonl", range(0, 8), 1)  # resumed from nothing, killed at 7
    b = log(tmp_path / "b.jsonl", range(6, 12), 10)  # resumed from a's step 6, killed at 11
    assert replay_records([a, b], upto_step=9, starts=[None, 6]) == [
        *[(s, {"x": s}) for s in range(6)], *[(s, {"x": 10 * s}) for s in range(6, 10)]]
    # at the resume step both attempts' records are merged, the later one winning
    c = tmp_path / "c.jsonl"
    c.write_text(json.dumps({"step": 6, "data": {"val": 1}}) + "\n")
    assert replay_records([a, c], upto_step=6, starts=[None, 6])[-1] == (6, {"x": 6, "val": 1})
    # a fresh start in the lineage drops everything before it
    assert replay_records([a, log(tmp_path / "d.jsonl", range(0, 3), 5)], upto_step=9, starts=[None, None]) == [
        (0, {"x": 0}), (1, {"x": 5}), (2, {"x": 10})]
    # without starts: from each file's first step
    assert [d["x"] for _, d in replay_records([a, b], upto_step=7)] == [0, 1, 2, 3, 4, 5, 60, 70]
    assert replay_records([a, tmp_path / "missing.jsonl"], upto_step=1) == [(0, {"x": 0}), (1, {"x": 1})]


# ----------------------------------------------------------------------------- with the stand-in main_ppo
@pytest.mark.slow  # a real verl (or stand-in) process: ~20-60 s; make test-slow / CI
def test_kill_then_retry_resumes_from_the_last_checkpoint(fake_verl: dict[str, str], tmp_path: Path) -> None:
    """Three attempts: the first is killed after its checkpoint at step 6, the second resumes from it, saves
    step 9 in its own directory and is killed; the third continues from step 9 (the newest checkpoint of the
    chain, not the first attempt's), and the replayed curve equals an uninterrupted run's."""
    trials = tmp_path / "trials"
    longer = {"trainer.total_training_steps": 12}
    argv, env, first = launch(fake_verl, trials, 0, ["++fake.step_s=0.3"], fixed=longer)
    run_until(argv, env, trials / "0" / "checkpoints" / "latest_checkpointed_iteration.txt", "6")
    killed_at = steps(first)
    assert killed_at[0] == 0 and 5 <= killed_at[-1] < 9 and killed_at == list(range(killed_at[-1] + 1))

    assert resume_checkpoints(trials, (0,)) == trials / "0" / "checkpoints" / "global_step_6"
    argv, env, second = launch(fake_verl, trials, 1, ["++fake.step_s=0.3"], history=(0,), fixed=longer)
    assert "trainer.resume_mode=resume_path" in argv
    assert f"trainer.default_local_dir={trials / '1' / 'checkpoints'}" in argv  # each attempt saves its own
    run_until(argv, env, trials / "1" / "checkpoints" / "latest_checkpointed_iteration.txt", "9")
    assert steps(second)[0] == 6 and steps(first) == killed_at  # "wb" went to a file of its own

    point = _verl.resume_point(trials, (0, 1))
    assert point is not None and point.checkpoint == trials / "1" / "checkpoints" / "global_step_9"
    assert point.lineage == (first, second) and point.starts == (None, 6)
    argv, env, third = launch(fake_verl, trials, 2, [], history=(0, 1), fixed=longer)
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Resuming from" in res.stdout and steps(third) == list(range(9, 13))

    curve = {s: d[VAL] for s, d in [*point.records(), *MetricsTail(third).read()] if VAL in d}
    argv, env, whole = launch(fake_verl, tmp_path / "uninterrupted", 0, [], fixed=longer)
    assert subprocess.run(argv, env=env, capture_output=True, timeout=300).returncode == 0
    # as if never interrupted, plus the resumed run's validation of its checkpoint at step 9 (val_before_train)
    assert curve == {**{s: d[VAL] for s, d in MetricsTail(whole).read() if VAL in d}, 9: pytest.approx(0.72)}


@pytest.mark.slow  # a real verl (or stand-in) process: ~20-60 s; make test-slow / CI
def test_a_half_deleted_checkpoint_is_not_resumed(fake_verl: dict[str, str], tmp_path: Path) -> None:
    """verl removes the previous step's actor/ (max_actor_ckpt_to_keep=1) before it rewrites the tracker: killed
    in between, the tracker names a step whose actor/ is gone. Resuming it would crash as verl's loader does;
    the retry starts afresh instead."""
    trials = tmp_path / "trials"
    argv, env, _ = launch(fake_verl, trials, 0, ["+fake.kill_after_actor_save=6"],
                          fixed={"trainer.max_actor_ckpt_to_keep": 1})
    assert subprocess.run(argv, env=env, capture_output=True, timeout=300).returncode == -signal.SIGKILL
    ckpt = trials / "0" / "checkpoints"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "3"
    assert not (ckpt / "global_step_3" / "actor").exists() and (ckpt / "global_step_6" / "actor").is_dir()
    assert _verl.checkpoint_step(ckpt) is None and resume_checkpoints(trials, (0,)) is None
    # what resuming the tracker's step would do: verl's own loader fails on the missing shard
    crash, env2, _ = launch(fake_verl, trials, 1, [])
    crash = [a for a in crash if not a.startswith("trainer.resume_mode=")] + [
        "trainer.resume_mode=resume_path", f"trainer.resume_from_path={ckpt / 'global_step_3'}"]
    res = subprocess.run(crash, env=env2, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1 and "FileNotFoundError" in res.stderr
    argv, env, metrics = launch(fake_verl, trials, 2, [], history=(0,))
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert steps(metrics) == list(range(11))


def test_a_study_whose_retries_start_over_is_said() -> None:
    """verl's default trainer.save_freq (-1) saves only at the last step: validate and rehearse say a retry starts
    over (issue 43 item 6); the shipped verl_grpo_cpu saves every 4 of 8 steps."""
    shipped = load_space(str(CPU_SPACE))
    assert retry_note(shipped) is None
    none = dataclasses.replace(shipped, overrides={k: v for k, v in shipped.overrides.items()
                                                   if k != "trainer.save_freq"})
    assert "trainer.save_freq=-1: no checkpoint before the last step" in (retry_note(none) or "")
    last = dataclasses.replace(shipped, overrides={**shipped.overrides, "trainer.save_freq": 8})
    assert "starts over from step 0" in (retry_note(last) or "")
