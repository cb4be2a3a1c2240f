"""verl's platform ``cpu``: what verl asks a device backend (``verl/plugin/platform/platform_base.py``), answered
for the CPU. Collectives go through gloo; Ray places workers on logical ``GPU`` resources (the trial's Ray cluster
is started with ``num_gpus``), so verl's resource pools and placement groups work unchanged."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

from verl_cpu_platform import device


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """The host's CPU as verl's accelerator: one "device" per worker process."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return device  # torch.cpu with the memory API verl calls on torch.cuda

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False  # chosen only by VERL_PLATFORM=cpu, never by auto-detection on a GPU host

    def current_device(self) -> Any:
        # torch.cpu.current_device() is "cpu" too; verl passes this to .to(...) and device=..., where the index 0
        # would mean accelerator 0 ("Cannot access accelerator device when none is available", utils/fsdp_utils.py)
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        pass

    def synchronize(self, device_index: int | None = None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # what Ray sets for a worker holding a logical GPU

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False  # weights reach vLLM through shared memory, not CUDA IPC handles

    def cudart(self) -> Any:
        return None
