"""GPU utilization through NVML (``nvidia-ml-py``), for the trainer's ``perf/gpu_util`` metric.

verl's performance-tuning guide reads GPU utilization (its ``actor_gpu_util``) beside
``perf/max_memory_allocated_gb`` to tell a compute-bound step from one starved by the rollout or the host.
NVML reports, per device, the percentage of time over the last sample period (1/6 s to 1 s, driver
dependent) during which a kernel was running, and the memory in use by all processes.

Every function returns ``{}`` (never raises) when ``pynvml`` is not installed, no NVIDIA driver is loaded
or the device cannot be queried, so callers need no guard: CPU runs simply log nothing.
"""

from __future__ import annotations

import os
from typing import Any

_handles: dict[int, Any] | None = None


def _nvml() -> Any | None:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    return pynvml


def _handle(index: int) -> Any | None:
    """NVML handle of the ``index``-th *visible* device (CUDA_VISIBLE_DEVICES mapped to NVML's numbering)."""
    global _handles
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        if _handles is None:
            nvml.nvmlInit()
            _handles = {}
        if index not in _handles:
            visible = [x.strip() for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
            physical = int(visible[index]) if index < len(visible) and visible[index].isdigit() else index
            _handles[index] = nvml.nvmlDeviceGetHandleByIndex(physical)
        return _handles[index]
    except Exception:  # NVMLError_* (no driver, no device, insufficient permissions)
        return None


def gpu_utilization(index: int = 0) -> dict[str, float]:
    """``{"perf/gpu_util": %, "perf/gpu_mem_util": %, "perf/gpu_memory_used_gb": GiB}`` of visible device
    ``index`` right now, or ``{}`` when NVML is unavailable."""
    handle = _handle(index)
    nvml = _nvml()
    if handle is None or nvml is None:
        return {}
    try:
        rates = nvml.nvmlDeviceGetUtilizationRates(handle)
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
    except Exception:
        return {}
    return {"perf/gpu_util": float(rates.gpu), "perf/gpu_mem_util": float(rates.memory),
            "perf/gpu_memory_used_gb": float(mem.used) / 1024**3}


class UtilizationSampler:
    """Mean GPU utilization over a stretch of code (a stage), sampled in a background thread.

    ``with UtilizationSampler() as s: ...`` then ``s.mean()`` -> percent, or None without NVML. One reading
    at the end of a step says little (the last stage may be host-bound); the mean over the stage is what
    the tuning guide's ``actor_gpu_util`` means.
    """

    def __init__(self, index: int = 0, period_s: float = 0.1, enabled: bool = True) -> None:
        import threading

        self.index, self.period_s, self.enabled = index, period_s, enabled
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            util = gpu_utilization(self.index).get("perf/gpu_util")
            if util is None:
                return
            self.samples.append(util)
            self._stop.wait(self.period_s)

    def __enter__(self) -> UtilizationSampler:
        if self.enabled and _handle(self.index) is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None
