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
