"""What a rollout engine is asked for: :class:`SamplingParams`, shared by the engines (:mod:`verl_core.rollout`,
:mod:`verl_core.vllm_rollout`) and the stages that call them. Below both engines, so neither imports the other for
it (``rollout.build_rollout`` imports the vLLM engine lazily)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    max_new_tokens: int = 16
    log_probs: bool = False  # ask the engine for the sampled tokens' log-probs (see HFRollout.last_log_probs)
