"""The few places where verl 0.9.1 assumes an accelerator, each patched when verl imports the module (a
``sys.meta_path`` hook, so no verl module is imported earlier than verl itself would). Installed only under
``VERL_PLATFORM=cpu`` (see the package docstring); each patch names the verl file and the error it answers.

* ``torch.distributed.init_process_group``: verl asks for ``cpu:gloo,<device>:<backend>``
  (``verl/utils/distributed.py``), which on the CPU platform is ``cpu:gloo,cpu:gloo``: "Duplicate device type cpu".
  One entry per device type is kept.
* ``verl.utils.model.load_valuehead_model``: the critic is loaded with a hard-coded
  ``attn_implementation="flash_attention_2"`` that no override reaches; flash-attn needs CUDA. Loaded with sdpa.
* ``verl.workers.engine.fsdp.transformer_impl.CPUOffloadPolicy``: FSDP2 forward-only models (the reference) get
  ``CPUOffloadPolicy(pin_memory=True)``; pinning host memory needs an accelerator. No pinning.
* ``transformers``' fast tokenizer ``_encode_plus``: a lock (verl's agent loops share one tokenizer across threads;
  a segfault seen on the CPU).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

ATTN_IMPLEMENTATION = "sdpa"


def dedup_backend(backend: str | None) -> str | None:
    """``"cpu:gloo,cpu:gloo"`` -> ``"cpu:gloo"``: the first backend of each device type (torch refuses two)."""
    if not backend or ":" not in backend:
        return backend
    seen: dict[str, str] = {}
    for part in backend.split(","):
        device, _, name = part.strip().partition(":")
        seen.setdefault(device, name)
    return ",".join(f"{d}:{n}" for d, n in seen.items())


def _patch_init_process_group() -> None:
    import torch.distributed as dist

    original = dist.init_process_group
    if getattr(original, "_verl_cpu", False):
        return

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], str):
            args = (dedup_backend(args[0]), *args[1:])
        if isinstance(kwargs.get("backend"), str):
            kwargs["backend"] = dedup_backend(kwargs["backend"])
        return original(*args, **kwargs)

    init_process_group._verl_cpu = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group


def _patch_valuehead(module: ModuleType) -> None:
    original = module.load_valuehead_model

    @functools.wraps(original)
    def load_valuehead_model(local_path: str, torch_dtype: Any, model_config: Any, trust_remote_code: bool) -> Any:
        from transformers import AutoModelForTokenClassification

        try:
            return AutoModelForTokenClassification.from_pretrained(
                pretrained_model_name_or_path=local_path, torch_dtype=torch_dtype, config=model_config,
                attn_implementation=ATTN_IMPLEMENTATION, trust_remote_code=trust_remote_code)
        except Exception:  # not a token-classification model: verl's own path (a TRL value head)
            return original(local_path, torch_dtype, model_config, trust_remote_code)

    module.load_valuehead_model = load_valuehead_model


def _patch_offload_policy(module: ModuleType) -> None:
    policy = module.CPUOffloadPolicy
    if policy is None:
        return

    def unpinned(*args: Any, **kwargs: Any) -> Any:
        kwargs["pin_memory"] = False
        return policy(*args, **kwargs)

    module.CPUOffloadPolicy = unpinned


def _patch_tokenizer_lock(module: ModuleType) -> None:
    """One thread at a time in a fast tokenizer's ``_encode_plus``: it sets the Rust tokenizer's truncation and
    padding, then encodes, and verl's agent-loop worker runs many agent loops in threads on one tokenizer
    (``verl/experimental/agent_loop/agent_loop.py``; ``utils/tokenizer/continuous_token.py`` encodes in each
    loop's ``__init__``). Seen on 2 cores: "Fatal Python error: Segmentation fault" in ``_encode_plus``, after which
    the trial hangs on the dead worker (1 trial in about 25)."""
    backend = module.TokenizersBackend
    original = backend._encode_plus
    if getattr(original, "_verl_cpu", False):
        return
    lock = threading.RLock()

    @functools.wraps(original)
    def _encode_plus(self: Any, *args: Any, **kwargs: Any) -> Any:
        with lock:
            return original(self, *args, **kwargs)

    _encode_plus._verl_cpu = True  # type: ignore[attr-defined]
    backend._encode_plus = _encode_plus


# module -> the patch applied right after it is executed
ON_IMPORT: dict[str, Callable[[ModuleType], None]] = {
    "verl.utils.model": _patch_valuehead,
    "verl.workers.engine.fsdp.transformer_impl": _patch_offload_policy,
    "transformers.tokenization_utils_tokenizers": _patch_tokenizer_lock,
}


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, patch: Callable[[ModuleType], None]) -> None:
        self.loader, self.patch = loader, patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.patch(module)


class _PatchFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of a module named in :data:`ON_IMPORT` so its patch runs after it."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        patch = ON_IMPORT.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, patch)  # type: ignore[arg-type]
                return spec
        return None


def install() -> None:
    """Apply every patch: at once to a module already imported, else when verl imports it."""
    _patch_init_process_group()
    for name, patch in ON_IMPORT.items():
        if name in sys.modules:
            patch(sys.modules[name])
    if not any(isinstance(f, _PatchFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchFinder())
