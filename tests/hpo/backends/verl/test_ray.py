"""A verl space run as Ray jobs (``trial.executor: ray``): ``trainer.nnodes`` and ``trainer.n_gpus_per_node`` are the
job's (``trial.ray.nodes`` x ``trial.ray.num_gpus``), in the trial's argv and in the corners verl's own config code
checks before a study is made. The run itself on a real cluster: ``tests/hpo/execution/ray_jobs/test_ray_study.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpo.backends.verl import VerlConfigError, check_verl_space, verl_argv, verl_job_env
from hpo.experiment._space import parse_space, read_yaml
from tests.hpo.conftest import ROOT

VERL_PY = ROOT / ".venv-verl" / "bin" / "python"
SPACE_FILE = ROOT / "search_spaces" / "verl_grpo_gsm8k.yaml"


def test_the_argv_and_environment_of_a_verl_ray_job(tmp_path: Path) -> None:
    argv = verl_argv("python", "ppo_trainer", [], "s", 3, tmp_path, n_gpus=4, nnodes=2)
    assert "trainer.nnodes=2" in argv and "trainer.n_gpus_per_node=4" in argv
    env = verl_job_env({"RAY_ADDRESS": "http://head:8265", "X": "1"}, tmp_path, attempt=1)
    assert env["VERL_FILE_LOGGER_PATH"] == str(tmp_path.absolute() / "metrics.attempt1.jsonl")
    # verl joins the job's cluster: no private RAY_TMPDIR, no token of its own, RAY_ADDRESS left as Ray set it
    assert env["RAY_ADDRESS"] == "http://head:8265" and "RAY_TMPDIR" not in env and "RAY_AUTH_TOKEN" not in env


@pytest.mark.skipif(not VERL_PY.exists(), reason="real verl is not installed: run `make install-verl`")
def test_verl_checks_the_corners_at_the_jobs_world_size() -> None:
    """32 samples per mini-batch pass over 2 nodes x 4 GPUs is 4 per GPU: verl's micro-batch of 8 does not fit,
    which one local GPU would accept."""
    raw = read_yaml(SPACE_FILE)
    raw["params"] = {"mini_batch": {"key": "actor_rollout_ref.actor.ppo_mini_batch_size", "type": "categorical",
                                    "choices": [8]}}
    raw["trial"] = {"backend": "verl", "executor": "ray", "ray": {"nodes": 2, "num_gpus": 4}}
    space = parse_space(raw, str(SPACE_FILE), "verl_ray")
    with pytest.raises(VerlConfigError) as err:
        check_verl_space(space, str(VERL_PY))
    assert "ppo_micro_batch_size_per_gpu=8 does not divide the 4 samples each GPU gets per pass" in str(err.value)


def test_a_cpu_verl_job_joins_the_cluster_with_the_cpu_platform(tmp_path: Path) -> None:
    """trial.ray.device: cpu: the CPU platform's overrides without ray_init's sizes (Ray refuses them when joining a
    cluster), TransferQueue sized to the trial's logical CPUs, and the platform's environment in the job's env_vars
    (what reaches verl's actors), with verl's own runtime_env winning a clash."""
    argv = verl_argv("python", "ppo_trainer", [], "s", 3, tmp_path, n_gpus=1, nnodes=1, cpu=True, joins_cluster=True,
                     cpus=6, checkpoints=tmp_path / "shared" / "3" / "checkpoints")
    assert "trainer.device=cpu" in argv and "actor_rollout_ref.actor.strategy=fsdp2" in argv
    assert not [a for a in argv if "ray_init.num_cpus" in a or "ray_init.num_gpus" in a]
    assert "++transfer_queue.backend.SimpleStorage.num_data_storage_units=2" in argv
    assert f"trainer.default_local_dir={tmp_path}/shared/3/checkpoints" in argv
    local = verl_argv("python", "ppo_trainer", [], "s", 3, tmp_path, n_gpus=0)
    assert "ray_kwargs.ray_init.num_cpus=16" in local and "+ray_kwargs.ray_init.num_gpus=1" in local
    env = verl_job_env({"CUDA_VISIBLE_DEVICES": "0", "X": "1"}, tmp_path, cpu=True)
    assert env["VERL_PLATFORM"] == "cpu" and "verl_cpu_platform" in env["VERL_USE_EXTERNAL_MODULES"]
    assert env["RAY_OVERRIDE_JOB_RUNTIME_ENV"] == "1" and "CUDA_VISIBLE_DEVICES" not in env and env["X"] == "1"
    assert "RAY_TMPDIR" not in env and "VERL_PLATFORM" not in verl_job_env({}, tmp_path)  # a GPU job: none of it


@pytest.mark.parametrize(("node", "nodes", "says"), [
    ({"missing": ["verl", "vllm"], "shared": True}, 1, "cannot import verl, vllm: verl's actors run in the "
     "interpreter `ray start` ran, so install the CPU platform plugin and vLLM's CPU build there"),
    ({"missing": [], "cuda": False, "shared": True}, 1, "has no CUDA torch"),
    ({"missing": [], "shared": False}, 2, "is not the same on node(s) 10.0.0.2 abc as on this host, and a trial of "
     "2 nodes saves there from every node: set trial.ray.shared_dir"),
])
def test_what_the_nodes_report_refuses_the_study(node: dict[str, object], nodes: int, says: str) -> None:
    from hpo.backends.verl._ray import _problems
    from hpo.experiment._ray_spec import RaySpec

    device = "cuda" if "cuda" in node else "cpu"
    found = [{"node": "10.0.0.2 abc", "python": "/venv/bin/python", **node}]
    problems = _problems(found, RaySpec(nodes=nodes, device=device), Path("/ckpt"))
    assert len(problems) == 1 and says in problems[0], problems
    assert not _problems([{**found[0], "missing": [], "cuda": True, "shared": False}], RaySpec(device=device),
                         Path("/ckpt"))  # one-node trials: an unshared directory is a note, not a refusal


def test_shared_checkpoints_are_deleted_only_where_the_driver_made_them(tmp_path: Path) -> None:
    from hpo.record import TRIAL_MARKER
    from hpo.study._checkpoints import checkpoint_dirs

    trials, shared = tmp_path / "trials", tmp_path / "shared"
    for n, marked in ((0, True), (1, False)):
        (trials / str(n)).mkdir(parents=True)
        (trials / str(n) / TRIAL_MARKER).write_text("{}")
        (shared / str(n) / "checkpoints").mkdir(parents=True)
        (trials / str(n) / "checkpoints").symlink_to(shared / str(n) / "checkpoints")
        if marked:
            (shared / str(n) / TRIAL_MARKER).write_text("{}")
    assert checkpoint_dirs(trials, [0, 1]) == []  # a link is never followed
    assert checkpoint_dirs(trials, [0, 1], shared) == [shared / "0" / "checkpoints"]
