"""Real verl 0.9.1 as Ray jobs (issue 45; docs/ray.md): a local cluster of logical GPUs started as a user would, with
verl's own interpreter (``.venv-verl/bin/ray start --head --num-gpus 1 --num-cpus 16`` and a second node joined to
it), and ``search_spaces/verl_grpo_cpu.yaml`` run with ``trial.executor: ray`` and ``trial.ray.device: cpu``: verl's
``main_ppo`` joins the cluster (no Ray of its own), its actors run in the nodes' interpreter on the CPU platform.

One cluster and one test, to stay inside CI's time (in ``make test-slow``, ``cpu_heavy``; ``make test-ray-verl`` runs it
alone): two real verl trials at once, the driver SIGKILLed and ``resume`` adopting both jobs, and, while those trials
start, the refusals of clusters that cannot run them (each a ``search`` that stops before its study). ~4 min here on 2
quiet cores. Its first runs hung one of the two jobs after the other ended: verl's TransferQueue controller is one
named actor per cluster (``hpo.execution.ray_jobs._isolate`` gives each job its own)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from optuna.trial import TrialState

from hpo.execution.ray_jobs import TERMINAL
from hpo.study._slots import n_finished
from tests.hpo.conftest import PY, ROOT, cli_env, load, run_cli
from tests.hpo.execution.ray_jobs.conftest import RayCluster, head_only, running_cluster, wait_for

VERL_PY = ROOT / ".venv-verl" / "bin" / "python"
VERL_RAY = VERL_PY.parent / "ray"
SPACE = ROOT / "search_spaces" / "verl_grpo_cpu.yaml"
VAL = "val-core/synthetic/arith/acc/mean@1"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.cpu_heavy,  # real verl trials on every core: one test at a time in make test-slow
    pytest.mark.skipif(not VERL_RAY.exists(), reason="real verl is not installed: run `make install-verl`"),
]


@pytest.fixture(scope="module")
def verl_cluster() -> Iterator[RayCluster]:
    """Two nodes of 1 logical GPU and 16 logical CPUs each, started with verl's interpreter."""
    yield from running_cluster("vhv", workers=1, ray=VERL_RAY, cpus=16, gpus=1)


def verl_space(tmp_path: Path, address: str, name: str, n_trials: int = 2, **ray: Any) -> Path:
    raw = yaml.safe_load(SPACE.read_text())
    raw["overrides"].update({"trainer.total_training_steps": 2, "trainer.test_freq": 2, "trainer.save_freq": 2})
    raw["study"] = {"n_trials": n_trials, "sampler": {"type": "random", "seed": 0}, "pruner": {"type": "none"},
                    "heartbeat_interval": 1, "grace_period": 5}
    raw["trial"] = {**raw["trial"], "python": str(VERL_PY), "timeout_s": 1500, "n_jobs": 2, "executor": "ray",
                    "keep_checkpoints": 2,  # the two trials' checkpoints stay (asserted below)
                    "ray": {"address": address, "num_gpus": 1, "num_cpus": 6, "device": "cpu", **ray}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def refused(space: Path, studies: Path, name: str) -> str:
    """The one line of a refusal before the study is created (exit 2, no study file)."""
    res = run_cli(["search", "--space", str(space)], studies, timeout=600)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert not (studies / f"{name}.db").exists()
    return lines[0]


def refusals(verl_cluster: RayCluster, tmp_path: Path) -> None:
    """A cluster that cannot run the trials is refused before the study: one line, exit 2, no study."""
    studies = tmp_path / "refused"
    line = refused(verl_space(tmp_path, verl_cluster.address, "big", num_gpus=2), studies, "big")
    assert "trial.ray" in line and "a trial needs 1 node(s) with CPU=6, GPU=2 each" in line
    assert "0 of them with that much" in line
    line = refused(verl_space(tmp_path, verl_cluster.address, "gpu", device="cuda"), studies, "gpu")
    assert "trial.ray" in line and "has no CUDA torch" in line and "trial.ray.device: cpu" in line
    # a cluster started with an interpreter that has no verl (the driver's own venv): its actors could not import it
    with head_only() as bare:
        line = refused(verl_space(tmp_path, bare.address, "bare", num_cpus=1), studies, "bare")  # 2 CPUs
    assert "cannot import verl, vllm, verl_cpu_platform" in line and "interpreter `ray start` ran" in line


def _alive(cluster: RayCluster, study: str) -> list[str]:
    return [j.submission_id for j in cluster.jobs(study) if str(j.status.value) not in TERMINAL]


def _study_processes(study: str) -> list[int]:
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("VERL_HPO_STUDY") == study:
                found.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


def test_two_verl_trials_at_once_survive_a_killed_driver(verl_cluster: RayCluster, tmp_path: Path) -> None:
    """Two real verl trials in flight on the two nodes; the driver SIGKILLed once both have logged; ``resume``
    adopts both running jobs (no second submission), and the study ends with both COMPLETE on verl's own metrics,
    checkpoints in ``trial.ray.shared_dir``, and nothing of the study left on the cluster. Meanwhile: the
    refusals (:func:`refusals`)."""
    from ray.util.state import list_actors, list_placement_groups

    studies, shared = tmp_path / "studies", tmp_path / "shared"
    space = verl_space(tmp_path, verl_cluster.address, "vray", shared_dir=str(shared))
    driver = subprocess.Popen([PY, "-m", "hpo", "search", "--space", str(space), "--studies-dir", str(studies)],
                              cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    refusals(verl_cluster, tmp_path)  # while the two trials start: their drivers stop before any study
    trials = studies / "vray" / "trials"
    wait_for(lambda: all(_lines(trials / str(n) / "job-metrics.jsonl") for n in (0, 1)) or driver.poll() is not None,
             1500, "both verl trials' first metrics")
    assert driver.poll() is None, driver.communicate()
    driver.send_signal(signal.SIGKILL)  # no cleanup at all: the jobs run on
    driver.communicate(timeout=30)
    first = load(studies, "vray").trials
    jobs = {t.number: t.user_attrs["ray_job"] for t in first}
    assert sorted(_alive(verl_cluster, "vray")) == sorted(jobs.values())

    res = run_cli(["resume", "--study", "vray"], studies, timeout=1500)
    (tmp_path / "resume.stderr").write_text(res.stderr)
    assert res.returncode == 0, res.stderr[-3000:]
    study = load(studies, "vray")
    assert n_finished(study) == 2, res.stderr[-3000:]
    assert len(verl_cluster.jobs("vray")) == 2  # adopted: never submitted twice
    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert sorted(t.user_attrs["ray_job"] for t in done) == sorted(jobs.values())
    assert all(t.user_attrs.get("ray_job_adopted") is True for t in done)
    for t in done:
        records = [yaml.safe_load(line) for line in _lines(trials / str(t.number) / "job-metrics.jsonl")]
        keys = {k for r in records for k in r["data"]}
        assert {"timing_s/update_weights", VAL} <= keys, sorted(keys)
        assert t.value is not None and 0.0 <= t.value <= 1.0
    for number in jobs:  # verl saved step 2 into the shared directory; the trial directory links to it
        assert (shared / "vray" / str(number) / "checkpoints" / "global_step_2").is_dir()
        assert (trials / str(number) / "checkpoints").resolve() == (shared / "vray" / str(number) / "checkpoints")
    assert not _alive(verl_cluster, "vray")
    controllers = list_actors(address=verl_cluster.address, filters=[("class_name", "=", "TransferQueueController")],
                              detail=True, limit=1000)  # one TransferQueue per job, not one shared by both
    assert sorted(a["ray_namespace"] for a in controllers) == sorted(f"transfer_queue@{j}" for j in jobs.values())
    wait_for(lambda: not list_placement_groups(address=verl_cluster.address, filters=[("state", "=", "CREATED")])
             and not list_actors(address=verl_cluster.address, filters=[("state", "=", "ALIVE")])
             and not _study_processes("vray"), 120, "verl's placement groups, actors and processes to be gone")
