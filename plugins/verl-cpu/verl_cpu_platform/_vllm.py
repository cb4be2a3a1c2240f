"""vLLM's side of the CPU platform: a ``vllm.general_plugins`` entry point, which vLLM runs in each of its
processes (API server, engine core, workers) before the model is loaded.

vLLM's CPU backend repacks every linear layer's weight for oneDNN after loading and drops the original
(``vllm/model_executor/layers/utils.py`` ``dispatch_cpu_unquantized_gemm``, called from ``linear.py`` and
``vocab_parallel_embedding.py``); verl's weight sync then writes into a parameter that is gone
("'Parameter' object has no attribute 'weight_loader'", through ``verl/workers/rollout/vllm_rollout/utils.py``), and
the packed copy would keep computing with the initial weights. Under ``VERL_PLATFORM=cpu`` linear layers compute
with ``torch.nn.functional.linear`` on their live weight, which every sync updates in place.
"""

from __future__ import annotations

import os
from typing import Any


def _live_weight_gemm(original: Any) -> Any:
    import torch

    def dispatch_cpu_unquantized_gemm(layer: torch.nn.Module, remove_weight: bool) -> None:
        weight = getattr(layer, "weight", None)
        if weight is None or weight.is_meta or weight.ndim != 2:
            return original(layer, remove_weight)
        layer.cpu_linear = lambda x, w, b: torch.nn.functional.linear(x, w, b)

    dispatch_cpu_unquantized_gemm._verl_cpu = True  # type: ignore[attr-defined]
    return dispatch_cpu_unquantized_gemm


def register() -> None:
    """The entry point: a no-op unless ``VERL_PLATFORM=cpu``."""
    if os.environ.get("VERL_PLATFORM", "").strip().lower() != "cpu":
        return
    from vllm.model_executor.layers import utils

    if not getattr(utils.dispatch_cpu_unquantized_gemm, "_verl_cpu", False):
        utils.dispatch_cpu_unquantized_gemm = _live_weight_gemm(utils.dispatch_cpu_unquantized_gemm)
