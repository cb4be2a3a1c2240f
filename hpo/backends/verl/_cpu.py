"""Real verl on a host without a GPU, and TransferQueue sized to the host on every host.

A verl trial that the driver hands no devices runs verl 0.9.1's own ``main_ppo`` on the CPU: the rollout in
vLLM's CPU build, the actor, reference and critic under FSDP2 with gloo, through the CPU platform plugin
``plugins/verl-cpu`` (module :data:`PLUGIN_MODULE`, installed into verl's interpreter by ``make install-verl``), loaded
by verl's own external-module hook. Nothing in verl is edited. This module holds what the driver adds to such a
trial, each with the error it answers (verl 0.9.1, seen at run time on 2 cores):

* :data:`CPU_OVERRIDES`: config keys; a key the experiment sets itself is left to the experiment.
* :data:`CPU_ENV`: environment (the plugin, the platform, vLLM's CPU sizing).
* :func:`transfer_queue_overrides`: verl's TransferQueue starts ``num_data_storage_units`` storage actors of one
  CPU each (8 by default, ``transfer_queue/storage/simple_storage.py``); a Ray node with fewer free CPUs never places
  them and the run hangs in ``tq.init``. Applied on every host, GPU or not.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from hpo.execution.ray_jobs import PRIVATE_NAMESPACES_ENV

PLUGIN_MODULE = "verl_cpu_platform"  # plugins/verl-cpu
PLATFORM_ENV = "VERL_PLATFORM"
EXTERNAL_MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"

CPU_OVERRIDES: dict[str, str] = {
    # the trainer's device (verl's default is cuda)
    "trainer.device": "cpu",
    # "Total available GPUs 0 is less than total desired GPUs 1" (single_controller/ray/base.py): the trial's Ray
    # cluster declares one logical GPU per worker (trainer.n_gpus_per_node=0 divides by zero in utils/config.py)
    "+ray_kwargs.ray_init.num_gpus": "1",
    # Ray schedules by logical CPUs: verl's actors (task runner, workers, agent loop, reward, storage, vLLM server)
    # ask for more than a small host has, and would wait for ever
    "ray_kwargs.ray_init.num_cpus": "16",
    # flash-attn needs CUDA (workers/config/model.py defaults to flash_attention_2)
    "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
    # FSDP1 refuses CPU parameters with sync_module_states=True (engine/fsdp/transformer_impl.py)
    "actor_rollout_ref.actor.strategy": "fsdp2",
    "actor_rollout_ref.ref.strategy": "fsdp2",
    "critic.strategy": "fsdp2",
    # "Sleep mode is not supported on current platform" (workers/rollout/vllm_rollout/vllm_async_server.py)
    "+actor_rollout_ref.rollout.enable_sleep_mode": "False",
    "actor_rollout_ref.rollout.free_cache_engine": "False",
    # 8 agent-loop and 8 reward workers by default: processes a small host has no room for
    "actor_rollout_ref.rollout.agent.num_workers": "1",
    "reward.num_workers": "1",
}
CPU_ENV: dict[str, str] = {
    PLATFORM_ENV: "cpu",  # the plugin's platform (verl would fall back to nvidia: "NCCL not built in")
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache per vLLM server (vLLM's CPU default takes far more)
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # vLLM would pin its OpenMP threads to cores the trainer also uses
}

STORAGE_UNITS_KEY = "transfer_queue.backend.SimpleStorage.num_data_storage_units"
VERL_STORAGE_UNITS = 8  # verl 0.9.1's default


def _key(override: str) -> str:
    return override.split("=", 1)[0].strip().lstrip("+~")


def host_cpus() -> int:
    """CPUs this process may run on (its affinity; cgroup quotas are not read)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def storage_units(cpus: int, cpu_platform: bool) -> int:
    """TransferQueue storage actors for a trial on a host of ``cpus`` CPUs: 2 on the CPU platform (its Ray cluster
    has 16 logical CPUs, the processes are what costs), else a quarter of the host's CPUs, 2 to verl's 8."""
    return 2 if cpu_platform else min(VERL_STORAGE_UNITS, max(2, cpus // 4))


def transfer_queue_overrides(overrides: Sequence[str], cpu_platform: bool, cpus: int | None = None) -> list[str]:
    """``num_data_storage_units`` that fits the host, unless the experiment sets it."""
    if any(_key(o) == STORAGE_UNITS_KEY for o in overrides):
        return []
    # ++: set or add (a config of the user's own may have no transfer_queue section)
    return [f"++{STORAGE_UNITS_KEY}={storage_units(host_cpus() if cpus is None else cpus, cpu_platform)}"]


# A trial run as a Ray job joins the user's cluster, whose resources `ray start` declared: ray.init refuses
# "When connecting to an existing cluster, num_cpus and num_gpus must not be provided."
CLUSTER_KEYS = ("ray_kwargs.ray_init.num_gpus", "ray_kwargs.ray_init.num_cpus")
# verl's ray.init passes a runtime_env of its own (env_vars such as TOKENIZERS_PARALLELISM); inside a Ray job Ray
# merges it with the job's and refuses any key both set ("Failed to merge the Job's runtime env") unless told
# that verl's wins
JOB_ENV = {"RAY_OVERRIDE_JOB_RUNTIME_ENV": "1",
           # TransferQueue's controller is the named actor TransferQueueController in the fixed namespace
           # transfer_queue: two verl jobs on one cluster would share it, and one job's tq.close() kills it under
           # the other (hpo.execution.ray_jobs._isolate gives each job its own)
           PRIVATE_NAMESPACES_ENV: "transfer_queue"}


def cpu_overrides(overrides: Sequence[str], joins_cluster: bool = False) -> list[str]:
    """:data:`CPU_OVERRIDES` as hydra overrides, without the keys that ``overrides`` (the experiment's) sets;
    ``joins_cluster`` (a Ray job on the user's cluster of logical GPUs): without :data:`CLUSTER_KEYS`."""
    taken = {_key(o) for o in overrides} | (set(CLUSTER_KEYS) if joins_cluster else set())
    return [f"{k}={v}" for k, v in CPU_OVERRIDES.items() if _key(k) not in taken]


def cpu_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the plugin loaded by verl's hook (added to the trial's own ``VERL_USE_EXTERNAL_MODULES``),
    :data:`CPU_ENV` (a value the trial's environment already has is kept) and no ``CUDA_VISIBLE_DEVICES``."""
    out = dict(env)
    # the driver's CUDA_VISIBLE_DEVICES="" (no devices) makes Ray refuse the logical GPU: "Attempting to start
    # raylet with 1 GPU, but CUDA_VISIBLE_DEVICES contains []" (ray/_private/resource_and_label_spec.py)
    out.pop("CUDA_VISIBLE_DEVICES", None)
    modules = [m for m in out.get(EXTERNAL_MODULES_ENV, "").split(",") if m.strip()]
    out[EXTERNAL_MODULES_ENV] = ",".join([*modules, PLUGIN_MODULE] if PLUGIN_MODULE not in modules else modules)
    for k, v in CPU_ENV.items():
        out.setdefault(k, v)
    return out
