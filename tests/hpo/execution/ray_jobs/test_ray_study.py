"""Studies whose trials run as Ray jobs on a real two-node Ray cluster started by the test (``conftest.py``: a head
``node_a`` and a second raylet ``node_b``, 2 logical GPUs each): the real trainer on the CPU, admission of a trial
that needs both nodes, a driver SIGKILLed mid-trial whose running job ``resume`` adopts, a node killed under a
trial (``killed``, retried, exactly ``n_trials``), early stopping that stops the job; and no job left running.

All slow (``make test-slow``): the cluster takes ~20-40 s to start on 2 cores and every job ~3 s."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from hpo.execution.ray_jobs import TERMINAL, cluster_view
from hpo.study._slots import n_finished
from tests.hpo.conftest import FAKE_TRAINER, PY, ROOT, cli_env, fake_space, load, run_cli
from tests.hpo.execution.ray_jobs.conftest import RayCluster, wait_for

pytestmark = pytest.mark.slow


def ray_space(tmp_path: Path, cluster: RayCluster, name: str, ray: dict[str, Any] | None = None,
              **sections: Any) -> Path:
    trial = {"command": [PY, str(FAKE_TRAINER), "train"], "executor": "ray",
             "ray": {"address": cluster.address, "num_gpus": 2, "num_cpus": 1, **(ray or {})},
             **sections.pop("trial", {})}
    return fake_space(tmp_path, name, trial=trial, **sections)


def start(space: Path, studies: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([PY, "-m", "hpo", "search", "--space", str(space), "--studies-dir", str(studies), *args],
                            cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def trials_of(studies: Path, name: str) -> list[optuna.trial.FrozenTrial]:
    if not (studies / f"{name}.db").is_file():
        return []
    try:
        return load(studies, name).trials
    except KeyError:  # the file is there, the study not yet
        return []


def evaluations(studies: Path, name: str, number: int = 0) -> int:
    """Metrics lines trial ``number`` has written (the trainer runs on this host: its trial directory is here);
    read from the file, not the study, which the driver may still be creating."""
    path = studies / name / "trials" / str(number) / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def alive_jobs(cluster: RayCluster, study: str) -> list[Any]:
    return [j for j in cluster.jobs(study) if str(j.status.value) not in TERMINAL]


def gpus_used(cluster: RayCluster) -> float:
    nodes, _ = cluster_view(cluster.address)
    return sum(n.used.get("GPU", 0.0) for n in nodes)


@pytest.mark.usefixtures("tiny_model_dir")
def test_a_study_of_the_real_trainer_runs_its_trials_as_ray_jobs(ray_cluster: RayCluster, tmp_path: Path) -> None:
    studies = tmp_path / "studies"
    space = tmp_path / "core.yaml"
    space.write_text(yaml.safe_dump({
        "config": "tiny_arith",
        "overrides": {"trainer.total_training_steps": 4, "trainer.test_freq": 2, "trainer.cpu_threads": 1},
        "params": {"kl_coef": {"key": "algorithm.kl_ctrl.kl_coef", "type": "float", "low": 0.01, "high": 0.2}},
        "early_stopping": {"enabled": False},
        "study": {"n_trials": 1, "pruner": {"type": "none"}, "heartbeat_interval": 1, "grace_period": 5},
        "trial": {"timeout_s": 300, "executor": "ray",  # one trial: the fake trainer's tests run several
                  "ray": {"address": ray_cluster.address, "num_gpus": 1, "num_cpus": 1}},
    }))
    res = run_cli(["search", "--space", str(space)], studies, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    trials = load(studies, "core").trials
    assert [t.state for t in trials] == [TrialState.COMPLETE]
    jobs = {j.submission_id: j for j in ray_cluster.jobs("core")}
    assert sorted(jobs) == sorted(f"verl-hpo-core-{t.number}" for t in trials)  # one job per trial
    for t in trials:
        job = jobs[t.user_attrs["ray_job"]]
        assert str(job.status.value) == "SUCCEEDED" and job.metadata["verl_hpo_trial"] == str(t.number)
        assert sorted(t.intermediate_values) == [0, 2, 4] and 0.0 <= t.value <= 1.0
        assert t.user_attrs["exit_code"] == 0 and 0.1 < t.user_attrs["peak_memory_gb"] < 3  # measured on the node
        assert t.user_attrs["memory_mechanism"] == "ray-job"
        trial_dir = studies / "core" / "trials" / str(t.number)
        assert "step" in (trial_dir / "stderr.log").read_text()  # the job's log
        # the lines the job's log carried, kept on the driver's host (what hpo.tracking reads without a shared disk)
        assert (trial_dir / "job-metrics.jsonl").read_text() == (trial_dir / "metrics.jsonl").read_text()
    assert not alive_jobs(ray_cluster, "core")


def test_a_trial_needing_both_nodes_waits_until_both_are_free(ray_cluster: RayCluster, tmp_path: Path) -> None:
    """Another study's one-node trial holds node_a's GPUs (Ray sees them used): the two-node trials wait for it,
    then for each other (the study's own claims: Ray does not see a two-node trial's GPUs until its trainer takes
    them); early stopping stops each job, and the driver waits until Ray reports it STOPPED."""
    studies = tmp_path / "studies"
    # 40 steps of 0.4 s: the big study's driver starts and asks for its nodes while this job runs (a host loaded ~9)
    small = start(ray_space(tmp_path, ray_cluster, "small", {"resources": {"node_a": 1}}, study={"n_trials": 1},
                            overrides={"trainer.total_training_steps": 40, "fake.step_s": 0.4}), studies)
    wait_for(lambda: gpus_used(ray_cluster) >= 2 or small.poll() is not None, 120, "the small trial's job")
    assert small.poll() is None, small.communicate()
    big = start(ray_space(tmp_path, ray_cluster, "big", {"nodes": 2}, trial={"n_jobs": 2},
                          study={"n_trials": 2, "pruner": {"type": "none"}, "heartbeat_interval": 1,
                                 "grace_period": 3},
                          early_stopping={"enabled": True, "threshold": 1.0, "patience": 2, "min_value": 0.0},
                          overrides={"trainer.total_training_steps": 40, "trainer.test_freq": 2, "fake.step_s": 0.1}),
                studies)
    out_small, err_small = small.communicate(timeout=300)
    out_big, err_big = big.communicate(timeout=300)
    assert small.returncode == 0 and big.returncode == 0, (err_small[-2000:], err_big[-2000:])
    small_job = ray_cluster.jobs("small")[0]
    big_jobs = sorted(ray_cluster.jobs("big"), key=lambda j: j.start_time)
    assert len(big_jobs) == 2
    assert big_jobs[0].start_time >= small_job.end_time  # admitted only once node_a was free
    assert big_jobs[1].start_time >= big_jobs[0].end_time  # and not beside the study's other two-node trial
    trials = load(studies, "big").trials
    assert all(t.user_attrs["device_wait_s"] > 0.5 for t in trials)
    assert "waiting for 2 node(s) with CPU=1, GPU=2 each" in out_big
    for t in trials:  # stopped by early stopping: the job was stopped, and Ray says so
        assert t.state == TrialState.COMPLETE and t.user_attrs["stop_reason"] == "converged"
        assert str(next(j for j in big_jobs if j.submission_id == t.user_attrs["ray_job"]).status.value) == "STOPPED"
    assert not alive_jobs(ray_cluster, "big") and not alive_jobs(ray_cluster, "small")


def test_resume_adopts_the_running_job_of_a_sigkilled_driver(ray_cluster: RayCluster, tmp_path: Path) -> None:
    studies = tmp_path / "studies"
    space = ray_space(tmp_path, ray_cluster, "adopt", study={"n_trials": 2, "pruner": {"type": "none"},
                                                             "heartbeat_interval": 1, "grace_period": 3},
                      overrides={"trainer.total_training_steps": 40, "trainer.test_freq": 2, "fake.step_s": 0.3})
    driver = start(space, studies)

    wait_for(lambda: evaluations(studies, "adopt") >= 3 or driver.poll() is not None, 180, "trial 0's first steps")
    assert driver.poll() is None, driver.communicate()
    driver.send_signal(signal.SIGKILL)  # no cleanup at all: its job runs on
    driver.communicate(timeout=30)
    first = trials_of(studies, "adopt")[0]
    job = first.user_attrs["ray_job"]
    assert [j.submission_id for j in alive_jobs(ray_cluster, "adopt")] == [job]
    res = run_cli(["resume", "--study", "adopt"], studies, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    study = load(studies, "adopt")
    trials = study.trials
    assert trials[0].state == TrialState.FAIL and n_finished(study) == 2
    retry = next(t for t in trials if t.system_attrs.get("failed_trial") == 0)
    assert retry.state == TrialState.COMPLETE and retry.user_attrs["ray_job"] == job
    assert retry.user_attrs["ray_job_adopted"] is True
    assert min(retry.intermediate_values) == 0 and max(retry.intermediate_values) == 40  # the whole curve
    jobs = ray_cluster.jobs("adopt")
    assert len(jobs) == 2  # the adopted job and the second trial's: never a duplicate for trial 0
    assert not alive_jobs(ray_cluster, "adopt")


def test_a_trial_whose_node_dies_fails_killed_and_is_retried(ray_cluster: RayCluster, tmp_path: Path) -> None:
    studies = tmp_path / "studies"
    space = ray_space(tmp_path, ray_cluster, "lost", {"num_gpus": 1, "resources": {"node_b": 1}},
                      study={"n_trials": 1, "pruner": {"type": "none"}, "heartbeat_interval": 1, "grace_period": 3},
                      overrides={"trainer.total_training_steps": 20, "trainer.test_freq": 2, "fake.step_s": 0.3})
    driver = start(space, studies)
    try:
        wait_for(lambda: evaluations(studies, "lost") >= 3 or driver.poll() is not None, 180, "trial 0's first steps")
        assert driver.poll() is None, driver.communicate()
        assert ray_cluster.kill("node_b") > 0  # the node and everything on it: raylet, agents, job, trainer
        wait_for(lambda: any(t.state == TrialState.FAIL for t in trials_of(studies, "lost")), 240,
                 "the trial to fail")
    finally:
        ray_cluster.start_worker("node_b")
        ray_cluster.wait_nodes({"node_a", "node_b"})
    out, err = driver.communicate(timeout=300)
    assert driver.returncode == 0, err[-3000:]
    study = load(studies, "lost")
    first, retry = study.trials
    assert first.state == TrialState.FAIL and first.user_attrs["fail_reason"] == "killed"
    assert retry.system_attrs["failed_trial"] == 0 and retry.state == TrialState.COMPLETE
    assert n_finished(study) == 1  # exactly n_trials
    assert "its Ray job lost its node; retry queued" in out
    assert not alive_jobs(ray_cluster, "lost")


def test_a_sigterm_stops_the_job_and_waits_until_ray_says_so(ray_cluster: RayCluster, tmp_path: Path) -> None:
    studies = tmp_path / "studies"
    space = ray_space(tmp_path, ray_cluster, "term", study={"n_trials": 1, "pruner": {"type": "none"},
                                                            "heartbeat_interval": 1, "grace_period": 3},
                      overrides={"trainer.total_training_steps": 60, "fake.step_s": 0.3})
    driver = start(space, studies)
    wait_for(lambda: evaluations(studies, "term") >= 1 or driver.poll() is not None, 180, "a first step")
    driver.send_signal(signal.SIGTERM)
    _, err = driver.communicate(timeout=120)
    assert driver.returncode == 143, err[-3000:]
    assert not alive_jobs(ray_cluster, "term")  # interrupted: stopped, and waited for
    assert str(ray_cluster.jobs("term")[0].status.value) == "STOPPED"


def test_a_verl_trial_runs_as_a_two_node_ray_job(ray_cluster: RayCluster, tmp_path: Path) -> None:
    """backend verl, trial.ray.nodes 2 x num_gpus 2: the corners are composed and validated by verl's own config code
    at 2 x 2 GPUs before the study, the job runs the stand-in main_ppo (verl's interpreter) with
    ``trainer.nnodes=2 trainer.n_gpus_per_node=2``, its entrypoint holds nothing (verl's placement groups take the
    GPUs), and verl's checkpoint shards are per the job's world size of 4."""
    from hpo.backends import verl as _verl
    from tests.hpo.backends.verl.conftest import _SITECUSTOMIZE, SPACE_FILE, STAND_IN, VERL_PY

    if not VERL_PY.exists():
        pytest.skip("the stand-in runs with real verl's code: run `make install-verl` (creates .venv-verl)")
    site = tmp_path / "fake-verl"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(stand_in=str(STAND_IN)))
    raw = yaml.safe_load(SPACE_FILE.read_text())
    raw["overrides"].update({"trainer.total_training_steps": 4, "trainer.test_freq": 2, "trainer.save_freq": 2,
                             "+fake.step_s": 0.1, "actor_rollout_ref.actor.ppo_mini_batch_size": 16})
    raw["params"] = {"fake_x": {"key": "+fake.x", "type": "float", "low": 0.0, "high": 1.0}}
    raw["study"] = {"n_trials": 1, "pruner": {"type": "none"}, "heartbeat_interval": 1, "grace_period": 5}
    raw["trial"] = {"backend": "verl", "python": str(VERL_PY), "timeout_s": 300, "executor": "ray",
                    "keep_checkpoints": 1,
                    "ray": {"address": ray_cluster.address, "nodes": 2, "num_gpus": 2, "num_cpus": 1},
                    "env": {"PYTHONPATH": str(site), "FAKE_VERL_ALL_KEYS": "1", _verl.SKIP_INTERPRETER_CHECK: "1"}}
    space = tmp_path / "verl_ray.yaml"
    space.write_text(yaml.safe_dump(raw, sort_keys=False))
    studies = tmp_path / "studies"
    res = run_cli(["search", "--space", str(space)], studies, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    (trial,) = load(studies, "verl_ray").trials
    assert trial.state == TrialState.COMPLETE and sorted(trial.intermediate_values) == [0, 2, 4]
    trial_dir = studies / "verl_ray" / "trials" / "0"
    argv = yaml.safe_load((trial_dir / "command.json").read_text())["argv"]
    assert argv[:3] == [str(VERL_PY), "-m", "verl.trainer.main_ppo"]
    assert "trainer.nnodes=2" in argv and "trainer.n_gpus_per_node=2" in argv
    shards = sorted(p.name for p in (trial_dir / "checkpoints" / "global_step_4" / "actor").glob("model_*"))
    assert shards == [f"model_world_size_4_rank_{r}.pt" for r in range(4)]
    (job,) = ray_cluster.jobs("verl_ray")
    assert str(job.status.value) == "SUCCEEDED" and job.submission_id == trial.user_attrs["ray_job"]
    assert "verl_hpo_ray_entry" in job.entrypoint and "trainer.nnodes=2" in job.entrypoint


# verl 0.9.1's TransferQueue pattern: a controller created from an actor as a named actor in a fixed namespace, and
# found again by that name from every other worker (transfer_queue/interface.py: init, _init_from_existing)
NAMED_ACTOR_JOB = '''
import json, os, sys, time
import ray

token, meeting, metrics = sys.argv[1], sys.argv[2], sys.argv[3]
ray.init()

@ray.remote
class Controller:
    def __init__(self, token):
        self.token = token
    def owner(self):
        return self.token

@ray.remote(num_cpus=0)
class Runner:  # the TaskRunner: tq.init creates the controller, or connects to the one that exists
    def init(self, token):
        try:
            self.ctl = Controller.options(name="Controller", namespace="transfer_queue").remote(token)
            return True
        except ValueError:
            return False

@ray.remote(num_cpus=0)
def worker_sees():  # any worker of the job: ray.get_actor by the fixed name
    return ray.get(ray.get_actor("Controller", namespace="transfer_queue").owner.remote())

runner = Runner.remote()
created = ray.get(runner.init.remote(token))
open(os.path.join(meeting, token), "w").close()
deadline = time.time() + 120
while len(os.listdir(meeting)) < 2 and time.time() < deadline:  # both jobs hold their controllers now
    time.sleep(0.2)
seen = ray.get(worker_sees.remote())
with open(metrics, "a") as f:
    f.write(json.dumps({"step": 1, "data": {"created": float(created), "own": float(seen == token)}}) + "\\n")
'''


def _two_named_actor_jobs(cluster: RayCluster, tmp_path: Path, env: dict[str, str]) -> list[dict[str, float]]:
    import threading

    from hpo.execution import TrialRun
    from hpo.execution.ray_jobs import RayJob

    script, meeting = tmp_path / "job.py", tmp_path / "meeting"
    script.write_text(NAMED_ACTOR_JOB)
    meeting.mkdir()
    jobs = [RayJob(TrialRun([PY, str(script), token, str(meeting), str(tmp_path / f"{token}.jsonl")], env,
                            tmp_path / token, tmp_path / f"{token}.jsonl"), address=cluster.address,
                   submission_id=f"verl-hpo-isolate-{tmp_path.name}-{token}", note=lambda line: None)
            for token in ("a", "b")]
    results: list[Any] = [None, None]
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, jobs[i].run())) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert all(r is not None and r.exit_code == 0 for r in results), [
        (j.trial.log_dir / "stderr.log").read_text()[-2000:] for j in jobs]
    return [yaml.safe_load((tmp_path / f"{token}.jsonl").read_text())["data"] for token in ("a", "b")]


def test_two_jobs_get_their_own_copy_of_a_trainers_fixed_namespace(ray_cluster: RayCluster, tmp_path: Path) -> None:
    """Two jobs at once that each create a named actor in one fixed namespace (verl's TransferQueue controller): with
    the namespace named private (what the verl backend says) each job creates and finds its own; without it the
    second finds the first's (the collision that hung one of two real verl jobs when the other ended)."""
    from hpo.execution.ray_jobs import PRIVATE_NAMESPACES_ENV

    (tmp_path / "shared").mkdir()
    shared = _two_named_actor_jobs(ray_cluster, tmp_path / "shared", {})
    assert sorted(d["created"] for d in shared) == [0.0, 1.0] and sorted(d["own"] for d in shared) == [0.0, 1.0]
    (tmp_path / "private").mkdir()
    private = _two_named_actor_jobs(ray_cluster, tmp_path / "private", {PRIVATE_NAMESPACES_ENV: "transfer_queue"})
    assert private == [{"created": 1.0, "own": 1.0}] * 2
