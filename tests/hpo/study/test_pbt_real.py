"""Population-based training end to end with the real trainer (``python -m verl_core train``) through the driver:
a population of 4 on the default task, a collapse rolled back, an exploit continuing another member's checkpoint
with the new learning rate in force (read from ``actor/lr``), the driver SIGKILLed mid-segment and ``resume``,
lineage and schedule in ``best``, only the members' final checkpoints left on disk, and the winning schedule
confirmed from scratch on a fresh seed, range by range."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from optuna.trial import FrozenTrial, TrialState

from hpo.backends import load_space
from hpo.study._optuna import open_study
from hpo.study._population import Population
from tests.hpo.conftest import PY, ROOT, cli_env, load, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("tiny_model_dir")]

FAST = {"trainer.total_training_steps": 4, "trainer.test_freq": 2, "trainer.cpu_threads": 1,
        "trainer.val_before_train": False, "data.train_batch_size": 16,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4, "actor_rollout_ref.actor.ppo_epochs": 1}


def pbt_space(tmp_path: Path) -> Path:
    space: dict[str, Any] = {
        "config": "tiny_arith",
        "overrides": dict(FAST),
        "params": {
            "kl_coef": {"key": "algorithm.kl_ctrl.kl_coef", "type": "float", "low": 0.01, "high": 0.2, "log": True},
            "actor_lr": {"key": "actor_rollout_ref.actor.optim.lr", "type": "float", "low": 1e-8, "high": 1.0,
                         "log": True},
        },
        "objective": {"metric": "eval/reward_mean", "direction": "maximize"},
        "early_stopping": {"enabled": False},
        "diagnosis": {"kl_patience": 1},  # lr 1.0 leaves the trust region at step 1 (ppo_kl ~7 nats)
        "study": {"strategy": "pbt", "heartbeat_interval": 1, "grace_period": 5, "pruner": {"type": "none"},
                  "pbt": {"population": 4, "interval_steps": 2, "quantile": 0.25, "resample_probability": 0.0,
                          "rollback": {"kl_blowup": "actor_lr*0.0001"}}},
        "trial": {"n_jobs": 1, "timeout_s": 300},
    }
    path = tmp_path / "pbt.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def segs(trials: list[FrozenTrial], member: int) -> list[FrozenTrial]:
    return [t for t in trials if t.system_attrs.get("pbt:member") == member]


def metrics(t: FrozenTrial) -> list[dict[str, Any]]:
    path = Path(t.user_attrs["trial_dir"]) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# light enough for the lighter run, but self-contained: taken by a heavy run of make test-slow once its own tests
# are done (the lighter run is CI's longest on stop 64's machine, and test-vllm waits for it)
@pytest.mark.cpu_heavy
@pytest.mark.cpu_heavy_late
def test_population_exploits_rolls_back_survives_sigkill_and_resume(tmp_path: Path, studies: Path) -> None:
    space_file = pbt_space(tmp_path)
    space = load_space(str(space_file))
    studies.mkdir()
    study = open_study(space, "pbt", f"sqlite:///{studies / 'pbt.db'}")
    # member 0 blows up at once, 1 learns fast, 2 slower, 3 not at all (1e-7: the step-2 value is the warm start's)
    Population(space, study, studies / "pbt", 4).queue_initial(
        [{"kl_coef": 0.05, "actor_lr": 1.0}, {"kl_coef": 0.05, "actor_lr": 1e-4},
         {"kl_coef": 0.05, "actor_lr": 1e-5}, {"kl_coef": 0.05, "actor_lr": 1e-7}])
    driver = subprocess.Popen([PY, "-m", "hpo", "resume", "--study", "pbt", "--studies-dir", str(studies)],
                              cwd=ROOT, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 400
    killed_at, frozen = None, []
    while killed_at is None:  # SIGKILL the worker while member 3's exploit segment trains
        assert time.monotonic() < deadline and driver.poll() is None
        for t in load(studies, "pbt").trials:
            if t.system_attrs.get("pbt:member") == 3 and t.state == TrialState.RUNNING \
                    and t.system_attrs.get("pbt:action") == "exploit" and "trial_dir" in t.user_attrs \
                    and (Path(t.user_attrs["trial_dir"]) / "metrics.jsonl").exists():
                # its trainer stopped first, so that the segment cannot end (and be recorded) before the kill lands:
                # a 2-step segment on a busy host could, and then nothing was left to retry
                frozen = _signal([p for p in psutil.process_iter() if t.user_attrs["trial_dir"] in
                                  " ".join(_cmdline(p))], psutil.Process.suspend)
                assert frozen and load(studies, "pbt").trials[t.number].state == TrialState.RUNNING
                killed_at = t.number
                break
        time.sleep(0.1)
    driver.kill()
    driver.wait()
    _signal(frozen, psutil.Process.resume)  # the trainer may now go the way of a trial whose driver died
    trials_dir = studies / "pbt" / "trials"
    left = [p for p in psutil.process_iter() if str(trials_dir) in " ".join(_cmdline(p))]
    assert psutil.wait_procs(left, timeout=30)[1] == [], "a trial survived its driver"

    res = run_cli(["resume", "--study", "pbt"], studies, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    trials = load(studies, "pbt").trials

    for m in range(4):  # every member reached the last step with a checkpoint
        final = [t for t in segs(trials, m) if t.state == TrialState.COMPLETE and t.system_attrs["pbt:end"] == 4
                 and t.user_attrs.get("last_step") == 4 and "stop_reason" not in t.user_attrs]
        assert final, (m, [(t.number, t.state, t.user_attrs.get("stop_reason")) for t in segs(trials, m)])

    # rollback: member 0's first segment collapsed; it restarted (no healthy checkpoint of its own, none of
    # anyone yet) from scratch with the rule's learning rate, which the trainer used
    m0 = segs(trials, 0)
    assert m0[0].user_attrs["stop_reason"] == "collapsed:kl_blowup"
    back = m0[1]
    assert back.system_attrs["pbt:action"] == "rollback" and back.params["actor_lr"] == pytest.approx(1e-4)
    assert [r["step"] for r in metrics(back)][0] == 1

    # exploit: member 3 (bottom) continued a top member's step-2 checkpoint with perturbed values; the killed
    # attempt was retried with the same values and checkpoint copy, and it trained with the new learning rate
    retry = next(t for t in trials if t.user_attrs.get("retry_of") == killed_at)
    killed = trials[killed_at]
    assert killed.state == TrialState.FAIL and retry.state == TrialState.COMPLETE
    assert retry.params == killed.params and retry.system_attrs["pbt:checkpoint"] == killed.system_attrs[
        "pbt:checkpoint"]
    donor = trials[retry.system_attrs["pbt:donor"]]
    assert donor.system_attrs["pbt:member"] in (1, 2) and retry.system_attrs["pbt:start"] == 2
    ratio = retry.params["actor_lr"] / donor.params["actor_lr"]
    assert ratio == pytest.approx(0.8) or ratio == pytest.approx(1.25)

    for t in trials:  # every segment that ran to its end trained with its own values from its start step on
        if t.state == TrialState.COMPLETE and "pbt:member" in t.system_attrs and "stop_reason" not in t.user_attrs:
            rows = metrics(t)
            assert rows[0]["step"] == t.system_attrs["pbt:start"] + 1, t.number
            assert all(r["data"]["actor/lr"] == pytest.approx(t.params["actor_lr"]) for r in rows
                       if "actor/lr" in r["data"]), t.number

    # disk: only the members' final checkpoints are left (the dead lineages' and the copies are gone)
    ckpts = sorted(int(p.parent.parent.name) for p in trials_dir.glob("*/checkpoints/global_step_*"))
    finals = sorted(max((t for t in segs(trials, m) if t.state == TrialState.COMPLETE), key=lambda t: t.number).number
                    for m in range(4))
    assert ckpts == finals
    assert not list((studies / "pbt" / "pbt").glob("*/global_step_*"))

    best = run_cli(["best", "--study", "pbt", "--format", "schedule"], studies)
    assert best.returncode == 0, best.stderr
    sched = json.loads(best.stdout)
    assert sched["schedule"][0]["start"] == 0 and sched["schedule"][-1]["end"] == 4
    assert sched["trial"] in finals and Path(sched["checkpoint"]).is_dir()

    # confirmation: the winning schedule re-run from scratch on a fresh seed with the real trainer, one segment per
    # step range of the schedule, each continuing the previous one's checkpoint and training with its range's
    # learning rate (actor/lr) from the range's first step on; a confirmation run keeps no checkpoint
    res = run_cli(["confirm", "--study", "pbt", "--top", "1", "--seeds", "1"], studies, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    trials = load(studies, "pbt").trials
    chain = sorted((t for t in trials if t.system_attrs.get("hpo:confirm_of") == sched["trial"]),
                   key=lambda t: t.system_attrs["pbt:schedule_index"])
    assert [t.system_attrs["pbt:schedule_index"] for t in chain] == list(range(len(sched["schedule"])))
    assert all(t.state == TrialState.COMPLETE for t in chain), [(t.number, t.state) for t in chain]
    assert len({t.system_attrs["hpo:confirm_seed"] for t in chain}) == 1 and chain[0].system_attrs[
        "hpo:confirm_seed"] != 1  # trainer.seed of the tuning runs
    for t, rng in zip(chain, sched["schedule"], strict=True):
        assert (t.system_attrs["pbt:start"], t.system_attrs["pbt:end"]) == (rng["start"], rng["end"])
        rows = metrics(t)
        assert rows[0]["step"] == rng["start"] + 1 and t.user_attrs["last_step"] == rng["end"], t.number
        assert all(r["data"]["actor/lr"] == pytest.approx(rng["params"]["actor_lr"]) for r in rows
                   if "actor/lr" in r["data"]), t.number
    assert chain[0].system_attrs["pbt:checkpoint"] is None  # from scratch
    assert all(t.system_attrs["pbt:checkpoint"] for t in chain[1:])
    assert not list(Path(chain[-1].user_attrs["trial_dir"]).glob("checkpoints/global_step_*"))


def _signal(procs: list[psutil.Process], how: Any) -> list[psutil.Process]:
    """``how`` (suspend, resume) applied to each of ``procs`` still alive; those it reached."""
    out = []
    for p in procs:
        try:
            how(p)
            out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []
