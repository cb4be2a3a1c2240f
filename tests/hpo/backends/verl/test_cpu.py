"""verl on the CPU, the driver's side (issue 33; ``hpo/backends/verl/_cpu.py``): what a trial handed no devices gets
(overrides, environment, TransferQueue sizing). The interpreter check for the CPU platform: ``test_check.py``; the
arith task's prepare step: ``test_arith.py``; the real trainer runs in ``test_real.py``; the plugin's own patches are
tested in ``tests/plugins/``."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpo.backends.verl import verl_argv, verl_env
from hpo.backends.verl._cpu import (
    CPU_OVERRIDES,
    PLUGIN_MODULE,
    cpu_env,
    cpu_overrides,
    storage_units,
    transfer_queue_overrides,
)

TQ = "transfer_queue.backend.SimpleStorage.num_data_storage_units"


def _keys(argv: list[str]) -> dict[str, str]:
    return {a.split("=", 1)[0].lstrip("+"): a.split("=", 1)[1] for a in argv if "=" in a}


def test_a_trial_without_devices_gets_the_cpu_platform_and_one_with_gpus_does_not(tmp_path: Path) -> None:
    cpu = _keys(verl_argv("py", "ppo_trainer", ["data.train_batch_size=8"], "s", 0, tmp_path / "0", n_gpus=0))
    assert cpu["trainer.device"] == "cpu" and cpu["ray_kwargs.ray_init.num_gpus"] == "1"
    assert cpu["actor_rollout_ref.actor.strategy"] == "fsdp2" and cpu["trainer.n_gpus_per_node"] == "1"
    assert cpu[TQ] == "2"
    gpu = _keys(verl_argv("py", "ppo_trainer", ["data.train_batch_size=8"], "s", 0, tmp_path / "0", n_gpus=2))
    assert "trainer.device" not in gpu and "ray_kwargs.ray_init.num_gpus" not in gpu
    assert TQ in gpu and gpu["trainer.n_gpus_per_node"] == "2"


def test_keys_the_experiment_sets_are_left_to_it() -> None:
    mine = ["+actor_rollout_ref.model.override_config.attn_implementation=eager",
            "actor_rollout_ref.actor.strategy=fsdp", f"{TQ}=5", "ray_kwargs.ray_init.num_cpus=4"]
    added = cpu_overrides(mine)
    keys = [a.split("=", 1)[0].lstrip("+") for a in added]
    assert "actor_rollout_ref.model.override_config.attn_implementation" not in keys  # a second '+key' would fail
    assert "actor_rollout_ref.actor.strategy" not in keys and "ray_kwargs.ray_init.num_cpus" not in keys
    assert len(added) == len(CPU_OVERRIDES) - 3
    assert transfer_queue_overrides(mine, cpu_platform=True) == []


@pytest.mark.parametrize(("cpus", "cpu_platform", "units"),
                         [(2, True, 2), (64, True, 2), (2, False, 2), (16, False, 4), (64, False, 8)])
def test_transfer_queue_storage_units_fit_the_host(cpus: int, cpu_platform: bool, units: int) -> None:
    """verl's 8 storage actors of one CPU each never place on a small Ray node (the run hangs in tq.init)."""
    assert storage_units(cpus, cpu_platform) == units
    assert transfer_queue_overrides([], cpu_platform, cpus) == [f"++{TQ}={units}"]


def test_the_cpu_environment_loads_the_plugin_and_keeps_the_trial_s_own(tmp_path: Path) -> None:
    env = cpu_env({"CUDA_VISIBLE_DEVICES": "", "VERL_USE_EXTERNAL_MODULES": "my_mod", "VLLM_CPU_KVCACHE_SPACE": "4"})
    assert env["VERL_USE_EXTERNAL_MODULES"] == f"my_mod,{PLUGIN_MODULE}" and env["VERL_PLATFORM"] == "cpu"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4"  # the trial's value wins
    assert "CUDA_VISIBLE_DEVICES" not in env  # "" makes Ray refuse the logical GPU
    assert cpu_env(env)["VERL_USE_EXTERNAL_MODULES"] == env["VERL_USE_EXTERNAL_MODULES"]  # added once
    trial = verl_env({"CUDA_VISIBLE_DEVICES": ""}, tmp_path / "t", cpu=True)
    assert trial["VERL_PLATFORM"] == "cpu" and "VERL_PLATFORM" not in verl_env({}, tmp_path / "u")
