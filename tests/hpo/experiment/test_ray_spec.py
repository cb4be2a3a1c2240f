"""``trial.executor`` and ``trial.ray`` (hpo/experiment/_ray_spec.py): what a Ray-job trial asks of the cluster, and
one-line errors naming the file, the field and the value."""

from __future__ import annotations

from typing import Any

import pytest

from hpo.experiment._space import SpaceError, parse_space

RAW: dict[str, Any] = {"config": "tiny_arith",
                       "params": {"lr": {"key": "actor_rollout_ref.actor.optim.lr", "type": "float", "low": 1e-5,
                                         "high": 1e-3}}}


def space(trial: dict[str, Any]) -> Any:
    return parse_space({**RAW, "trial": trial}, "exp.yaml", "exp")


def test_the_ray_section_parses_and_defaults_to_local() -> None:
    assert space({}).trial.executor == "local"
    ray = space({"executor": "ray", "ray": {"address": "http://head:8265", "nodes": 2, "num_gpus": 8, "num_cpus": 16,
                                            "resources": {"a100": 1}, "runtime_env": {
                                                "working_dir": ".", "env_vars": {"HF_HOME": "/shared"},
                                                "pip": ["x==1"]}}}).trial.ray
    assert (ray.nodes, ray.num_gpus, ray.num_cpus) == (2, 8, 16.0)
    assert ray.per_node() == {"GPU": 8.0, "CPU": 16.0, "a100": 1.0}
    assert ray.runtime_env["pip"] == ["x==1"]  # handed to Ray as it is
    assert space({"executor": "ray", "ray": {"num_gpus": 0, "num_cpus": 0}}).trial.ray.per_node() == {}
    assert (ray.device, ray.shared_dir) == ("cuda", None)  # real GPUs; checkpoints in the studies directory
    cpu = space({"executor": "ray", "ray": {"device": "cpu", "shared_dir": "/mnt/ckpt "}}).trial.ray
    assert (cpu.device, cpu.shared_dir) == ("cpu", "/mnt/ckpt")


@pytest.mark.parametrize(("ray", "message"), [
    ({"nodes": 0}, "exp.yaml: trial.ray.nodes: expected an integer >= 1, got 0"),
    ({"num_gpus": 1.5}, "exp.yaml: trial.ray.num_gpus: expected an integer >= 0 (GPUs per node), got 1.5"),
    ({"num_cpus": -1}, "exp.yaml: trial.ray.num_cpus: expected a number >= 0 (CPUs per node), got -1"),
    ({"resources": {"GPU": 1}}, "exp.yaml: trial.ray.resources: 'GPU' is not a custom resource name"),
    ({"resources": {"a100": 0}}, "exp.yaml: trial.ray.resources.a100: expected a positive number, got 0"),
    ({"address": "ray://head:10001"}, "exp.yaml: trial.ray.address: 'ray://head:10001': expected the dashboard's"),
    ({"runtime_env": {"env_vars": {"A": 1}}}, "exp.yaml: trial.ray.runtime_env.env_vars: expected a mapping of"),
    ({"runtime_env": ["x"]}, "exp.yaml: trial.ray.runtime_env: expected a mapping (Ray's runtime_env)"),
    ({"runtime_env": {"env_vars": {"HF_TOKEN": "hf_s3cr3t"}}}, "exp.yaml: trial.ray.runtime_env.env_vars.HF_TOKEN: "
     "names a secret, and the study stores and shows trial.ray as written: set it in trial.env instead"),
    ({"gpus": 1}, "exp.yaml: trial.ray.gpus: unknown field (value 1); known: address, nodes, num_gpus"),
    ({"stop_timeout_s": 0}, "exp.yaml: trial.ray.stop_timeout_s: expected a positive number of seconds, got 0"),
    ({"device": "gpu"}, "exp.yaml: trial.ray.device: expected one of cuda, cpu (cpu: the cluster's GPUs are logical"),
    ({"shared_dir": "ckpt"}, "exp.yaml: trial.ray.shared_dir: expected the absolute path of a directory every node"),
    ({"shared_dir": 3}, "exp.yaml: trial.ray.shared_dir: expected the absolute path"),
])
def test_a_bad_ray_field_is_one_line_naming_it(ray: dict[str, Any], message: str) -> None:
    with pytest.raises(SpaceError) as err:
        space({"executor": "ray", "ray": ray})
    assert str(err.value).startswith(message) and "\n" not in str(err.value) and "s3cr3t" not in str(err.value)


def test_an_unknown_executor_is_refused() -> None:
    with pytest.raises(SpaceError, match=r"exp.yaml: trial.executor: 'slurm' is not one of local, ray"):
        space({"executor": "slurm"})
