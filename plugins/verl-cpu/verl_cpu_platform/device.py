"""The CPU platform's device module: ``torch.cpu`` plus the memory API that verl calls on ``torch.cuda``
(``verl/utils/memory_utils.py``: ``memory_reserved``, ``memory_allocated``, ``mem_get_info``, peaks for
``perf/max_memory_allocated_gb``). Memory is the worker process's: resident set size, its peak (``VmHWM``, reset
with ``reset_peak_memory_stats``), and the host's available memory. Anything else is ``torch.cpu``'s."""

from __future__ import annotations

import os
from typing import Any

import torch


def _status_kib(field: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def memory_allocated(device: Any = None) -> int:
    """Bytes resident in this process now."""
    return _status_kib("VmRSS") * 1024


memory_reserved = memory_allocated


def max_memory_allocated(device: Any = None) -> int:
    """Peak resident bytes of this process (since the last :func:`reset_peak_memory_stats`)."""
    return max(_status_kib("VmHWM") * 1024, memory_allocated())


max_memory_reserved = max_memory_allocated


def reset_peak_memory_stats(device: Any = None) -> None:
    try:  # writing 5 to clear_refs resets VmHWM (Linux >= 4.0); elsewhere the peak stays the process's
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of the host: ``MemAvailable`` and ``MemTotal``."""
    info: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                info[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    total = info.get("MemTotal", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return info.get("MemAvailable", total), total


def get_device_name(device: Any = None) -> str:
    """The processor's model name (``perf`` metrics label the device with it)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def get_rng_state(device: Any = None) -> torch.Tensor:
    return torch.get_rng_state()


def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
    torch.set_rng_state(state)


def empty_cache() -> None:
    pass


def ipc_collect() -> None:
    pass


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    pass


def manual_seed(seed: int) -> None:
    torch.manual_seed(seed)


manual_seed_all = manual_seed


def __getattr__(name: str) -> Any:
    return getattr(torch.cpu, name)
