"""Peak GPU memory of ``python -m verl.trainer.main_ppo`` (verl 0.9.1: FSDP engine workers, the actor, reference and
critic colocated with vLLM on the same GPUs), phase by phase, from the keys of a composed config.

Pure arithmetic on the shared shapes of :mod:`hpo.backends._shapes`: ``verl/_compose.py`` selects
:data:`VERL_MEMORY_KEYS` in verl's interpreter (hydra interpolations resolved) and :func:`estimate_verl` /
:func:`judge_verl` do the rest here, without verl, torch or ``verl_core``; a model's ``config.json`` comes from
:mod:`hpo.backends.verl._model_config`::

    from hpo.backends._shapes import SequenceLengths, read_sequence_lengths
    from hpo.backends.verl._memory_model import LENGTH_METRICS, judge_verl

    lengths = read_sequence_lengths("run.jsonl", *LENGTH_METRICS)  # or SequenceLengths(prompt=105, response=240)
    v = judge_verl(values, use_critic=True, use_ref=True, lengths=lengths, gpu_total_bytes=80 * 2**30)
    v.verdict(budget)            # "fits" | "worst_case_does_not_fit" | "does_not_fit"

What one GPU holds, step by step (``W`` FSDP ranks = ``n_gpus_per_node x nnodes`` or ``fsdp_size``; ``P`` parameters;
``m`` bytes of ``fsdp_config.model_dtype``, fp32 by default; the source file of verl 0.9.1 for each):

* always: one CUDA context for the colocated training workers (actor, reference and critic share one Ray process,
  ``single_controller/ray/base.py`` ``create_colocated_worker_cls``); the sleeping vLLM server's CUDA context and
  CUDA-graph pool (``workers/rollout/vllm_rollout/vllm_async_server.py``: sleep level 2 frees weights and KV cache,
  not the graphs); training state that is not offloaded: parameters ``P m / W`` and AdamW's two moments
  ``2 P m / W`` (``workers/engine/base.py`` ``BaseEngineCtx``: ``param_offload`` / ``optimizer_offload`` move them
  to the CPU outside the passes that need them);
* ``rollout``: vLLM awake, ``gpu_memory_utilization`` of the GPU's *total* memory (weights, activations, KV cache);
* ``old_log_prob`` (``workers/engine_workers.py`` ``compute_log_prob``, eval mode): actor parameters loaded, the
  unsharded bf16 root unit (embedding, LM head) and two decoder layers (FSDP prefetch), one layer's activations
  and the logits of one micro-batch, with the entropy verl logs (``transformer_impl.py`` ``prepare_model_outputs``);
* ``ref``: the reference is a forward-only engine that FSDP keeps on the CPU (``CPUOffload(offload_params=True)``
  in ``_build_fsdp_module``): only its unsharded units and the micro-batch are on the GPU;
* ``values`` / ``update_critic`` / ``critic_step``: the critic's forward, its micro-batch forward/backward and its
  AdamW step (GAE only);
* ``update_actor``: parameters, optimizer and fp32 gradients ``P m / W`` (zeroed to None when the update ends),
  one micro-batch's activations (bf16; checkpointed layer inputs with gradient checkpointing) and logits; the
  unsharded units and their gradients; with ``use_no_sync_for_gradient_accumulation`` and ``W > 1`` the unsharded
  bf16 gradient of the whole model ``2 P`` (``_gradient_sync_context``); ``actor_step``: AdamW's foreach step
  (``torch.optim.AdamW``), one more ``P m / W`` of temporaries beside gradients and moments;
* ``weight_sync`` (``engine_workers.py`` ``update_weights``): vLLM's weights woken up (``2 P / TP``, KV cache still
  asleep), the actor's parameters loaded, the state dict (FSDP1 on one GPU: ``FULL_STATE_DICT``, a clone of every
  parameter ``P m``; on several: sharded clones ``P m / W``; FSDP2: views), one gathered parameter and the CUDA-IPC
  bucket (``checkpoint_engine.update_weights_bucket_megabytes``, allocated whole:
  ``vllm_rollout/bucketed_weight_transfer.py``).

The logits: verl removes padding (``use_remove_padding``, packed sequences) and computes log-probs from the bf16
LM-head output with flash-attn's Triton cross-entropy (``utils/torch_functional.py`` ``logprobs_from_logits``: no
fp32 copy, gradient written in place), so a micro-batch's logits cost
:data:`~hpo.backends.verl._memory_stages.LOGITS_BYTES` per real token and
vocabulary entry, more with a temperature other than 1 (a scaled copy) and with the entropy (softmax and product);
none with ``use_fused_kernels``.

How long the sequences are matters for every micro-batch: :func:`judge_verl` estimates twice, at the expected
lengths (:class:`SequenceLengths`, e.g. ``response_length/mean`` and ``prompt_length/mean`` of a previous run's
metrics) and in the worst case (every sequence at ``max_prompt_length + max_response_length``). Without expected
lengths both are the worst case. A token budget (``use_dynamic_bsz``) is capped at what one GPU's share of a
mini-batch holds.

Not estimated: Megatron, sglang's own memory rules, multimodal inputs, multi-turn sequences longer than
``max_prompt_length + max_response_length``, reward-model and distillation workers, allocator fragmentation beyond
the baselines, Ulysses' all-to-all buffers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpo.backends._shapes import MemoryEstimate, ModelShape, SequenceLengths, fmt_gib
from hpo.backends.verl._memory_stages import (
    AR,
    Run,
    actor_state,
    actor_update,
    critic,
    log_prob_passes,
    rollout_engine,
)
from hpo.backends.verl._model_config import read_hub_or_local_config

# verl's mean prompt and response lengths in its metrics (``trainer/ppo/metric_utils.py``): what ``validate
# --metrics`` reads a previous run's expected lengths from
LENGTH_METRICS = ("prompt_length/mean", "response_length/mean")
# The phases of one verl step in the order the trainer runs them (``trainer/ppo/v1/trainer_base.py``).
VERL_PHASES = ("rollout", "old_log_prob", "ref", "values", "update_critic", "critic_step", "update_actor",
               "actor_step", "weight_sync")
VERL_MEMORY_KEYS = (
    "trainer.n_gpus_per_node", "trainer.nnodes", "data.max_prompt_length", "data.max_response_length",
    "data.train_batch_size", f"{AR}.rollout.n", f"{AR}.actor.ppo_mini_batch_size",
    f"{AR}.model.path", f"{AR}.model.enable_gradient_checkpointing", f"{AR}.model.use_fused_kernels",
    f"{AR}.model.use_remove_padding", f"{AR}.model.enable_activation_offload", f"{AR}.model.lora_rank",
    f"{AR}.actor.strategy", f"{AR}.actor.fsdp_config.param_offload", f"{AR}.actor.fsdp_config.optimizer_offload",
    f"{AR}.actor.fsdp_config.offload_policy", f"{AR}.actor.fsdp_config.fsdp_size",
    f"{AR}.actor.fsdp_config.model_dtype", f"{AR}.actor.fsdp_config.mixed_precision.param_dtype",
    f"{AR}.actor.fsdp_config.use_no_sync_for_gradient_accumulation",
    f"{AR}.actor.ppo_micro_batch_size_per_gpu", f"{AR}.actor.use_dynamic_bsz", f"{AR}.actor.ppo_max_token_len_per_gpu",
    f"{AR}.actor.ulysses_sequence_parallel_size", f"{AR}.actor.calculate_entropy", f"{AR}.actor.entropy_coeff",
    f"{AR}.actor.entropy_from_logits_with_chunking", f"{AR}.actor.fsdp_config.use_torch_compile",
    f"{AR}.rollout.name", f"{AR}.rollout.gpu_memory_utilization", f"{AR}.rollout.free_cache_engine",
    f"{AR}.rollout.enforce_eager", f"{AR}.rollout.tensor_model_parallel_size", f"{AR}.rollout.temperature",
    f"{AR}.rollout.checkpoint_engine.update_weights_bucket_megabytes",
    f"{AR}.rollout.log_prob_micro_batch_size_per_gpu", f"{AR}.rollout.log_prob_use_dynamic_bsz",
    f"{AR}.rollout.log_prob_max_token_len_per_gpu",
    f"{AR}.ref.log_prob_micro_batch_size_per_gpu", f"{AR}.ref.log_prob_use_dynamic_bsz",
    f"{AR}.ref.log_prob_max_token_len_per_gpu", f"{AR}.ref.entropy_from_logits_with_chunking",
    "critic.model.path", "critic.model.enable_gradient_checkpointing", "critic.model.use_remove_padding",
    "critic.strategy", "critic.fsdp.param_offload", "critic.fsdp.optimizer_offload", "critic.fsdp.offload_policy",
    "critic.fsdp.fsdp_size", "critic.fsdp.model_dtype", "critic.ppo_mini_batch_size",
    "critic.ppo_micro_batch_size_per_gpu", "critic.forward_micro_batch_size_per_gpu", "critic.use_dynamic_bsz",
    "critic.ppo_max_token_len_per_gpu", "critic.forward_max_token_len_per_gpu", "critic.ulysses_sequence_parallel_size",
)


def estimate_verl(values: Mapping[str, Any], *, use_critic: bool, use_ref: bool,
                  model_config: dict[str, Any] | None = None, critic_config: dict[str, Any] | None = None,
                  gpu_total_bytes: int | None = None, lengths: SequenceLengths | None = None) -> MemoryEstimate:
    """Per-GPU peak of a verl 0.9.1 run with the composed config ``values`` (keys of :data:`VERL_MEMORY_KEYS`), at the
    expected ``lengths`` (None: the worst case, every sequence at its maximum). The mapping is the module docstring.

    ``use_critic`` / ``use_ref``: verl's ``need_critic`` / ``need_reference_policy``. ``model_config`` /
    ``critic_config``: ``config.json`` dicts (default:
    :func:`~hpo.backends.verl._model_config.read_hub_or_local_config` of the model paths). ``gpu_total_bytes``: the
    GPU's total memory, for vLLM's fraction (default nvidia-smi, else 80 GiB)."""
    v = dict(values)
    shape = ModelShape.from_config(model_config or read_hub_or_local_config(v.get(f"{AR}.model.path"),
                                                                           f"{AR}.model.path"), f"{AR}.model.path")
    run = Run(v, shape, lengths, gpu_total_bytes)
    actor_state(run)
    actor_update(run)
    log_prob_passes(run, use_ref)
    rollout_engine(run)
    if use_critic:
        critic(run, critic_config)
    return MemoryEstimate(tuple(run.comps), "cuda", VERL_PHASES)


# ----------------------------------------------------------------------------- the verdict
@dataclass(frozen=True)
class VerlMemoryVerdict:
    """A verl config's estimate at the expected sequence lengths and in the worst case (every sequence at
    ``max_prompt_length + max_response_length``); both the same when no expected lengths are known."""

    expected: MemoryEstimate
    worst: MemoryEstimate
    lengths: SequenceLengths | None

    def verdict(self, available: int, margin: float = 0.0) -> str:
        """``fits`` (both fit), ``worst_case_does_not_fit`` (a warning: the expected peak fits) or ``does_not_fit``
        (the expected peak does not: the only case to refuse)."""
        if not self.expected.fits(available, margin):
            return "does_not_fit"
        return "fits" if self.worst.fits(available, margin) else "worst_case_does_not_fit"

    def warning(self, available: int, margin: float = 0.0) -> str | None:
        """One line when only the worst case does not fit, else None."""
        if self.verdict(available, margin) != "worst_case_does_not_fit":
            return None
        return (f"fits at the expected lengths ({self.lengths.describe() if self.lengths else 'unknown'}: "
                f"{fmt_gib(self.expected.total)} GiB) but not when every sequence reaches max_prompt_length + "
                f"max_response_length: {self.worst.not_fitting(available, margin)}")


def judge_verl(values: Mapping[str, Any], *, use_critic: bool, use_ref: bool, lengths: SequenceLengths | None = None,
               model_config: dict[str, Any] | None = None, critic_config: dict[str, Any] | None = None,
               gpu_total_bytes: int | None = None) -> VerlMemoryVerdict:
    """:func:`estimate_verl` at the expected ``lengths`` and in the worst case."""
    kw: dict[str, Any] = {"use_critic": use_critic, "use_ref": use_ref, "model_config": model_config,
                          "critic_config": critic_config, "gpu_total_bytes": gpu_total_bytes}
    worst = estimate_verl(values, **kw)
    known = lengths is not None and (lengths.prompt is not None or lengths.response is not None)
    return VerlMemoryVerdict(estimate_verl(values, lengths=lengths, **kw) if known else worst, worst,
                             lengths if known else None)
