"""Peak GPU memory of ``python -m verl.trainer.main_ppo`` (verl 0.9.1: FSDP engine workers, the actor, reference and
critic colocated with vLLM on the same GPUs), phase by phase, from the keys of a composed config.

Pure arithmetic, like :mod:`verl_core.memory`: ``verl/_compose.py`` selects :data:`VERL_MEMORY_KEYS` in verl's
interpreter (hydra interpolations resolved) and :func:`estimate_verl` / :func:`judge_verl` do the rest here,
without verl or torch::

    from verl_core.memory_verl import SequenceLengths, judge_verl, read_sequence_lengths

    lengths = read_sequence_lengths("run.jsonl")       # or SequenceLengths(prompt=105, response=240)
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
fp32 copy, gradient written in place), so a micro-batch's logits cost :data:`LOGITS_BYTES` per real token and
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

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_core.config import ConfigError
from verl_core.memory_common import (
    CUDA_BASELINE_BYTES,
    Component,
    GiB,
    MemoryEstimate,
    MiB,
    ModelShape,
    _dtype_bytes,
    _gpu_total,
    _m,
    fmt_gib,
    read_model_config,
)

AR = "actor_rollout_ref"
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
# Bytes per (packed token, vocabulary entry) of one micro-batch's logits (``transformer_impl.py``
# ``prepare_model_outputs``). The LM head's output is bf16 (FSDP mixed precision; transformers 5 does not upcast)
# and flash-attn's cross-entropy reads it without a copy and writes its gradient in place: 2 B.
LOGITS_BYTES = 2
# ``rollout.temperature`` other than 1: the scaled copy beside the original (``_scale_logits_by_temperature``).
LOGITS_BYTES_TEMPERATURE = 2
# The entropy (``entropy_from_logits``). verl compiles it (``torch.compile``, ``fsdp_config.use_torch_compile``, on
# by default): one fused reduction over the vocabulary, nothing of (tokens, vocab) size in a no-grad pass; with grad
# the cross-entropy's gradient is no longer written in place (``inplace_backward = not calculate_entropy``) and the
# entropy's own gradient joins it: 2 + 2 B. Eager: the softmax and its product with the logits (2 + 2 B), and in
# backward their gradients as well; none in a no-grad pass with ``entropy_from_logits_with_chunking``.
LOGITS_BYTES_ENTROPY_INFER = {"compiled": 0, "eager": 4}
LOGITS_BYTES_ENTROPY_TRAIN = {"compiled": 4, "eager": 6}
# What a sleeping vLLM server keeps on each of its GPUs: its CUDA context with cuBLAS workspaces (about 0.5 GiB on
# CUDA 12, as for any torch process) and, without ``enforce_eager``, the CUDA-graph pool that sleep does not free
# (verl's ``docs/perf/perf_tuning.rst``: "cudagraph memory can not be offloaded to cpu"; vLLM logs "Graph capturing
# finished in N secs, took 0.11-0.96 GiB" for 0.5B-30B models: 0.5 GiB taken here).
VLLM_CONTEXT_BYTES = int(0.5 * GiB)
VLLM_CUDA_GRAPH_BYTES = int(0.5 * GiB)
# NCCL's communicators in a process that talks to other GPUs (FSDP over W > 1 ranks, vLLM over TP > 1): buffers of
# NCCL_BUFFSIZE (4 MiB) per channel and peer plus its work FIFOs; a rough figure, outside torch's allocator.
NCCL_BYTES = int(1.0 * GiB)
# config.json numbers of hub models verl's examples and docs use, so that a space naming one is estimated without a
# download (from each model's config.json on the Hugging Face hub; a local directory or the HF cache is read first).
_QWEN2_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 152064,
             "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
             "num_key_value_heads": 4, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
_QWEN25_14B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 152064,
               "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 48, "num_attention_heads": 40,
               "num_key_value_heads": 8, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
_QWEN2_72B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 152064,
              "hidden_size": 8192, "intermediate_size": 29568, "num_hidden_layers": 80, "num_attention_heads": 64,
              "num_key_value_heads": 8, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
KNOWN_HUB_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-0.5B-Instruct": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
        "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16"},
    "Qwen/Qwen2.5-1.5B-Instruct": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 1536,
        "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16"},
    "Qwen/Qwen2.5-3B-Instruct": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 2048,
        "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16"},
    "Qwen/Qwen2-7B-Instruct": _QWEN2_7B,
    "Qwen/Qwen2.5-7B-Instruct": _QWEN2_7B,
    "Qwen/Qwen2.5-14B-Instruct": _QWEN25_14B,
    "Qwen/Qwen2.5-Coder-14B-Instruct": _QWEN25_14B,
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B": _QWEN25_14B,
    "Qwen/Qwen2.5-32B-Instruct": {**_QWEN25_14B, "intermediate_size": 27648, "num_hidden_layers": 64},
    "Qwen/Qwen2-72B-Instruct": _QWEN2_72B,
    "Qwen/Qwen2.5-72B-Instruct": _QWEN2_72B,
}


class ModelConfigUnavailable(ConfigError):
    """No ``config.json`` for a model path (a hub id neither cached nor known): no estimate, not a bad config."""


def read_hub_or_local_config(path: str | None, key: str) -> dict[str, Any]:
    """``config.json`` of a verl model path: a local directory, else the Hugging Face cache
    (``$HF_HUB_CACHE``, ``$HF_HOME/hub``, ``~/.cache/huggingface/hub``) for a hub id, else
    :data:`KNOWN_HUB_CONFIGS`; :class:`ModelConfigUnavailable` when none has it."""
    if path is None:
        raise ConfigError(f"{key}=None: no model path")
    local = Path(path).expanduser()
    if local.is_dir() or path.startswith("builtin:"):
        return read_model_config(str(local) if local.is_dir() else path, key)
    hub = os.environ.get("HF_HUB_CACHE") or str(Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
    snapshots = Path(hub).expanduser() / f"models--{path.replace('/', '--')}" / "snapshots"
    for found in sorted(snapshots.glob("*/config.json")) if snapshots.is_dir() else []:
        return read_model_config(str(found.parent), key)
    if path in KNOWN_HUB_CONFIGS:
        return dict(KNOWN_HUB_CONFIGS[path])
    raise ModelConfigUnavailable(f"{key}={path!r}: no local directory, not in the Hugging Face cache and not one of "
                                 f"the known hub models ({', '.join(KNOWN_HUB_CONFIGS)}): no memory estimate")


# ----------------------------------------------------------------------------- sequence lengths
@dataclass(frozen=True)
class SequenceLengths:
    """Expected mean lengths (tokens) of prompts and responses; None: unknown (the maximum is assumed)."""

    prompt: float | None = None
    response: float | None = None
    source: str = "given"

    def __post_init__(self) -> None:
        for name in ("prompt", "response"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(f"expected {name} length must be a positive number, but got {name}={value!r}")

    def describe(self) -> str:
        shown = [f"{n} {v:.0f}" for n, v in (("prompt", self.prompt), ("response", self.response)) if v is not None]
        return f"mean {', '.join(shown)} tokens ({self.source})" if shown else "unknown"


def read_sequence_lengths(path: str | Path) -> SequenceLengths:
    """The largest ``prompt_length/mean`` and ``response_length/mean`` over the steps of a verl metrics file (JSONL,
    one ``{"step": N, "data": {...}}`` per line, as verl's file logger writes it). ConfigError when it has neither."""
    found: dict[str, float] = {}
    try:
        lines = Path(path).expanduser().read_text().splitlines()
    except OSError as err:
        raise ConfigError(f"--metrics {path}: unreadable ({err.strerror or err})") from None
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        data = rec.get("data", rec) if isinstance(rec, dict) else None
        if not isinstance(data, dict):
            continue
        for key, name in (("prompt_length/mean", "prompt"), ("response_length/mean", "response")):
            value = data.get(key)
            if isinstance(value, int | float) and math.isfinite(value) and value > 0:
                found[name] = max(found.get(name, 0.0), float(value))
    if not found:
        raise ConfigError(f"--metrics {path}: no prompt_length/mean or response_length/mean in any line")
    return SequenceLengths(found.get("prompt"), found.get("response"), f"largest means in {Path(path).name}")


# ----------------------------------------------------------------------------- the estimate
def _int(values: Mapping[str, Any], key: str, default: int) -> int:
    v = values.get(key)
    return default if v is None else int(v)


@dataclass(frozen=True)
class _Pass:
    """Tokens of one micro-batch of one pass on one GPU, how they were counted, and the key that sets them."""

    tokens: int
    what: str
    key: str


def _micro_tokens(v: Mapping[str, Any], *, dyn_key: str, budget_key: str, micro_key: str, share: int, length: float,
                  padded_length: int, sp: int) -> _Pass:
    """One micro-batch's tokens per GPU. ``share``: sequences one GPU gets in the pass (a mini-batch's share for an
    update, the batch's share for a log-prob pass); ``length``: tokens per sequence (expected or maximal);
    ``padded_length``: the length when padding is not removed. With dynamic batching verl packs sequences up to the
    token budget (``rearrange_micro_batches``), never more than the share holds; else ``micro`` sequences, divided
    over the Ulysses sequence-parallel group."""
    if v.get(dyn_key):
        budget = int(v.get(budget_key) or padded_length)
        held = math.ceil(share * length)
        tokens = min(budget, held)
        capped = f", capped at the share {share} x {length:.0f}" if held < budget else ""
        return _Pass(tokens, f"{tokens} tokens ({budget_key.rsplit('.', 1)[1]} {budget}{capped})", budget_key)
    micro = v.get(micro_key)
    if micro is None:
        raise ConfigError(f"{micro_key}=null without dynamic batching: no micro-batch to estimate")
    n = min(int(micro), share)
    tokens = math.ceil(n * length / sp)
    return _Pass(tokens, f"micro {n} x {length:.0f} tokens" + (f" / sp {sp}" if sp > 1 else ""), micro_key)


def estimate_verl(values: Mapping[str, Any], *, use_critic: bool, use_ref: bool,
                  model_config: dict[str, Any] | None = None, critic_config: dict[str, Any] | None = None,
                  gpu_total_bytes: int | None = None, lengths: SequenceLengths | None = None) -> MemoryEstimate:
    """Per-GPU peak of a verl 0.9.1 run with the composed config ``values`` (keys of :data:`VERL_MEMORY_KEYS`), at the
    expected ``lengths`` (None: the worst case, every sequence at its maximum). The mapping is the module docstring.

    ``use_critic`` / ``use_ref``: verl's ``need_critic`` / ``need_reference_policy``. ``model_config`` /
    ``critic_config``: ``config.json`` dicts (default: :func:`read_hub_or_local_config` of the model paths).
    ``gpu_total_bytes``: the GPU's total memory, for vLLM's fraction (default nvidia-smi, else 80 GiB)."""
    v = dict(values)
    shape = ModelShape.from_config(model_config or read_hub_or_local_config(v.get(f"{AR}.model.path"),
                                                                           f"{AR}.model.path"), f"{AR}.model.path")
    world = _int(v, "trainer.n_gpus_per_node", 1) * _int(v, "trainer.nnodes", 1)
    P, R = int(v["data.max_prompt_length"]), int(v["data.max_response_length"])
    exp_p = min(P, lengths.prompt) if lengths and lengths.prompt else P
    exp_r = min(R, lengths.response) if lengths and lengths.response else R
    n = _int(v, f"{AR}.rollout.n", 1)
    batch = _int(v, "data.train_batch_size", 1) * n  # sequences per step
    V, H = shape.vocab_size, shape.hidden_size
    comps: list[Component] = []

    def add(name: str, n_bytes: float, phase: str | tuple[str, ...], formula: str, key: str | None = None,
            process: str = "actor", allocated: bool = True) -> None:
        for p in (phase,) if isinstance(phase, str) else phase:
            comps.append(Component(name, int(n_bytes), p, formula, key, process, allocated))

    def shards(fsdp_size: Any) -> int:
        size = int(fsdp_size) if fsdp_size not in (None, -1) else world
        return max(1, min(size, world))

    def length(remove_padding: bool) -> float:
        return exp_p + exp_r if remove_padding else P + R

    add("CUDA context (training workers)", CUDA_BASELINE_BYTES, "persistent",
        "one Ray process for actor, reference and critic: CUDA context + allocator slack", process="actor",
        allocated=False)
    if world > 1:
        add("NCCL communicators (training workers)", NCCL_BYTES, "persistent", f"FSDP over {world} GPUs (rough)",
            process="actor", allocated=False)

    # -- actor: sharded state, kept on the GPU unless offloaded
    fc = f"{AR}.actor.fsdp_config"
    W = shards(v.get(f"{fc}.fsdp_size"))
    mb = _dtype_bytes(v.get(f"{fc}.model_dtype") or "fp32")
    cb = _dtype_bytes(v.get(f"{fc}.mixed_precision.param_dtype") or "bf16", 2)
    fsdp2 = v.get(f"{AR}.actor.strategy") == "fsdp2"
    cpu_policy = bool(v.get(f"{fc}.offload_policy")) and fsdp2
    off_p, off_o = bool(v.get(f"{fc}.param_offload")) and not cpu_policy, \
        bool(v.get(f"{fc}.optimizer_offload")) and not cpu_policy
    pa = shape.causal_lm_params()
    lora = _int(v, f"{AR}.model.lora_rank", 0)
    trainable = shape.lora_params(lora) if lora > 0 else pa
    what_t = f"{_m(trainable)} {'LoRA ' if lora > 0 else ''}params"
    params = pa * mb / W
    shard = f"{_m(pa)} params x {mb} B / {W} GPU(s)"
    if cpu_policy:
        add("actor state on the CPU", 0, "persistent", "fsdp2 offload_policy: params, grads, AdamW on the CPU",
            f"{fc}.offload_policy")
    elif off_p:
        add("actor params (loaded from the CPU)", params, ("old_log_prob", "update_actor", "actor_step",
                                                           "weight_sync"), shard, f"{fc}.param_offload")
    else:
        add("actor params", params, "persistent", shard, f"{fc}.param_offload")
    optim = trainable * 2 * mb / W
    if not cpu_policy:
        add("actor gradients", trainable * mb / W, ("update_actor", "actor_step"),
            f"{what_t} x {mb} B / {W} GPU(s) (set to None after the update)")
        oform = f"{what_t} x 2 moments x {mb} B / {W} GPU(s)"
        if off_o:
            add("actor AdamW states (loaded from the CPU)", optim, ("update_actor", "actor_step"), oform,
                f"{fc}.optimizer_offload")
        else:
            add("actor AdamW states", optim, "persistent", oform, f"{fc}.optimizer_offload")
        add("AdamW step temporaries", trainable * mb / W, "actor_step",
            f"foreach sqrt of the second moments: {what_t} x {mb} B / {W} GPU(s)")
    root = V * H * (1 if shape.tie_word_embeddings else 2)
    unit = (root + 2 * shape.layer_params()) * cb
    tied = "" if shape.tie_word_embeddings else " + LM head"
    add("unsharded FSDP units", unit, ("old_log_prob", "ref"),
        f"root (embedding{tied}) + 2 layers x {cb} B (forward prefetch)")
    if lora > 0:  # the base is frozen: its units get no gradient
        add("unsharded FSDP units", unit, "update_actor", f"root (embedding{tied}) + 2 layers x {cb} B (frozen)")
    else:
        add("unsharded FSDP units + their gradients", 2 * unit, "update_actor",
            f"2 x (root (embedding{tied}) + 2 layers) x {cb} B")
    if bool(v.get(f"{fc}.use_no_sync_for_gradient_accumulation")) and W > 1:
        add("unsharded gradients (no_sync accumulation)", pa * cb, "update_actor",
            f"{_m(pa)} params x {cb} B, all of them, until the last micro-batch",
            f"{fc}.use_no_sync_for_gradient_accumulation")

    # -- actor micro-batches
    sp = _int(v, f"{AR}.actor.ulysses_sequence_parallel_size", 1)
    dp = max(1, world // sp)
    rmpad = v.get(f"{AR}.model.use_remove_padding", True) is not False
    seq = length(rmpad)
    fused = bool(v.get(f"{AR}.model.use_fused_kernels"))
    ckpt = bool(v.get(f"{AR}.model.enable_gradient_checkpointing"))
    act_off = bool(v.get(f"{AR}.model.enable_activation_offload"))
    temp = float(v.get(f"{AR}.rollout.temperature") or 1.0)
    t_b = LOGITS_BYTES_TEMPERATURE if temp != 1.0 else 0
    mini = max(1, math.ceil(_int(v, f"{AR}.actor.ppo_mini_batch_size", batch // n) * n / dp))
    upd = _micro_tokens(v, dyn_key=f"{AR}.actor.use_dynamic_bsz", budget_key=f"{AR}.actor.ppo_max_token_len_per_gpu",
                        micro_key=f"{AR}.actor.ppo_micro_batch_size_per_gpu", share=mini, length=seq,
                        padded_length=P + R, sp=sp)
    per_tok = 2 * shape.activation_elems_per_token(ckpt)
    if ckpt and act_off:
        per_tok -= 2 * shape.num_layers * H  # checkpointed layer inputs go to the CPU
    add("actor activations", upd.tokens * per_tok, "update_actor",
        f"{upd.what} x {per_tok / 1e6:.3g} MB/token ({'checkpointed' if ckpt else 'all layers'}, bf16)", upd.key)
    entropy = bool(v.get(f"{AR}.actor.calculate_entropy")) or float(v.get(f"{AR}.actor.entropy_coeff") or 0) != 0
    mode = "eager" if v.get(f"{fc}.use_torch_compile") is False else "compiled"
    per_logit = LOGITS_BYTES + t_b + (LOGITS_BYTES_ENTROPY_TRAIN[mode] if entropy else 0)
    add("actor logits", 0 if fused else upd.tokens * V * per_logit, "update_actor",
        "use_fused_kernels: not materialized" if fused else
        f"{upd.what} x {V} vocab x {per_logit} B (bf16{', temperature copy' if t_b else ''}"
        f"{f', {mode} entropy with grad' if entropy else ''})", upd.key)

    layer_tok = (4 * H + 4 * shape.intermediate_size) * 2
    share = max(1, math.ceil(batch / dp))
    old = _micro_tokens(v, dyn_key=f"{AR}.rollout.log_prob_use_dynamic_bsz",
                        budget_key=f"{AR}.rollout.log_prob_max_token_len_per_gpu",
                        micro_key=f"{AR}.rollout.log_prob_micro_batch_size_per_gpu", share=share, length=seq,
                        padded_length=P + R, sp=sp)
    ent_b = 0 if v.get(f"{fc}.entropy_from_logits_with_chunking") or v.get(
        f"{AR}.actor.entropy_from_logits_with_chunking") else LOGITS_BYTES_ENTROPY_INFER[mode]
    add("old-log-prob layer activations", old.tokens * layer_tok, "old_log_prob",
        f"{old.what} x (4H + 4I) x 2 B (one layer at a time)", old.key)
    per_logit = LOGITS_BYTES + t_b + ent_b
    add("old-log-prob logits", 0 if fused else old.tokens * V * per_logit, "old_log_prob",
        "use_fused_kernels: not materialized" if fused else
        f"{old.what} x {V} vocab x {per_logit} B (bf16{', temperature copy' if t_b else ''}"
        f"{', eager entropy' if ent_b else ''})", old.key)
    if use_ref:
        if lora > 0:
            add("reference = actor without its adapters", 0, "ref", "LoRA: no separate reference model")
        ref = _micro_tokens(v, dyn_key=f"{AR}.ref.log_prob_use_dynamic_bsz",
                            budget_key=f"{AR}.ref.log_prob_max_token_len_per_gpu",
                            micro_key=f"{AR}.ref.log_prob_micro_batch_size_per_gpu", share=share, length=seq,
                            padded_length=P + R, sp=sp)
        add("reference params", 0, "ref", "forward-only engine: FSDP keeps them on the CPU (CPUOffload)")
        add("reference layer activations", ref.tokens * layer_tok, "ref",
            f"{ref.what} x (4H + 4I) x 2 B (one layer at a time)", ref.key)
        per_logit = LOGITS_BYTES + t_b
        add("reference logits", 0 if fused else ref.tokens * V * per_logit, "ref",
            "use_fused_kernels: not materialized" if fused else
            f"{ref.what} x {V} vocab x {per_logit} B (bf16{', temperature copy' if t_b else ''})", ref.key)

    # -- vLLM on the same GPUs
    r = f"{AR}.rollout"
    if v.get(f"{r}.name") in ("vllm", "sglang"):
        total_gpu = gpu_total_bytes or _gpu_total() or 80 * GiB
        util = float(v.get(f"{r}.gpu_memory_utilization") or 0.5)
        reserve = int(util * total_gpu)
        eager = bool(v.get(f"{r}.enforce_eager"))
        name = str(v[f"{r}.name"])
        add(f"{name} CUDA context", VLLM_CONTEXT_BYTES, "persistent", "the server's own process (not freed by sleep)",
            None, "vllm", False)
        add(f"{name} CUDA graphs", 0 if eager else VLLM_CUDA_GRAPH_BYTES, "persistent",
            "enforce_eager: none" if eager else "CUDA-graph pool, not freed by sleep", f"{r}.enforce_eager", "vllm",
            False)
        what = f"gpu_memory_utilization {util} x {fmt_gib(total_gpu)} GiB"
        tp = max(1, _int(v, f"{r}.tensor_model_parallel_size", 1))
        if tp > 1:
            add(f"{name} NCCL communicators", NCCL_BYTES, "persistent", f"tensor parallel over {tp} GPUs (rough)",
                f"{r}.tensor_model_parallel_size", "vllm", False)
        if v.get(f"{r}.free_cache_engine", True):
            add(f"{name} weights + KV cache (awake)", reserve, "rollout", what + " while generating (asleep otherwise)",
                f"{r}.gpu_memory_utilization", "vllm", False)
            add(f"{name} weights (woken for the sync)", pa * 2 / tp, "weight_sync",
                f"{_m(pa)} params x 2 B / tp {tp} (KV cache still asleep)", f"{r}.tensor_model_parallel_size", "vllm",
                False)
        else:
            add(f"{name} weights + KV cache", reserve, "persistent", what + " (free_cache_engine=false: always held)",
                f"{r}.gpu_memory_utilization", "vllm", False)
        # the weight sync: the state dict the actor hands over, one gathered parameter, the CUDA-IPC bucket
        state: float
        if lora > 0:
            state, sform = trainable * mb, "LoRA adapters only"
        elif fsdp2:
            state, sform = 0, "fsdp2: views of the sharded parameters"
        elif W == 1:
            state, sform = pa * mb, f"FSDP1 FULL_STATE_DICT on one GPU: a clone of {_m(pa)} params x {mb} B"
        else:
            state, sform = pa * mb / W, f"FSDP1 sharded state dict: clones of the shards, {_m(pa)} x {mb} B / {W}"
        add("actor state dict (weight sync)", state, "weight_sync", sform)
        if W > 1 and lora == 0:
            add("one gathered parameter", V * H * mb, "weight_sync", f"the embedding, {V} x {H} x {mb} B (full_tensor)")
        bucket = _int(v, f"{r}.checkpoint_engine.update_weights_bucket_megabytes", 2048) * MiB
        add("weight-sync bucket", bucket, "weight_sync", f"CUDA-IPC buffer of {bucket // MiB} MiB, allocated whole",
            f"{r}.checkpoint_engine.update_weights_bucket_megabytes")

    # -- critic (GAE), in the same process as the actor
    if use_critic:
        cpath = v.get("critic.model.path")
        if critic_config is None and cpath and cpath != v.get(f"{AR}.model.path"):
            critic_config = read_hub_or_local_config(cpath, "critic.model.path")
        cs = ModelShape.from_config(critic_config, "critic.model.path") if critic_config else shape
        Wc = shards(v.get("critic.fsdp.fsdp_size"))
        cmb = _dtype_bytes(v.get("critic.fsdp.model_dtype") or "fp32")
        pc = cs.value_model_params()
        cshard = f"{_m(pc)} params x {{}} B / {Wc} GPU(s)"
        c_policy = v.get("critic.strategy") == "fsdp2" and bool(v.get("critic.fsdp.offload_policy"))
        if not c_policy:
            if v.get("critic.fsdp.param_offload"):
                add("critic params (loaded from the CPU)", pc * cmb / Wc, ("values", "update_critic", "critic_step"),
                    cshard.format(cmb), "critic.fsdp.param_offload", "actor")
            else:
                add("critic params", pc * cmb / Wc, "persistent", cshard.format(cmb), "critic.fsdp.param_offload")
            add("critic gradients", pc * cmb / Wc, ("update_critic", "critic_step"), cshard.format(cmb))
            add("critic AdamW states" + (" (loaded from the CPU)" if v.get("critic.fsdp.optimizer_offload") else ""),
                pc * 2 * cmb / Wc, ("update_critic", "critic_step") if v.get("critic.fsdp.optimizer_offload")
                else "persistent", cshard.format(f"2 x {cmb}"), "critic.fsdp.optimizer_offload")
            add("critic AdamW step temporaries", pc * cmb / Wc, "critic_step", cshard.format(cmb))
        croot = cs.vocab_size * cs.hidden_size
        cunit = (croot + 2 * cs.layer_params()) * cb
        add("critic unsharded FSDP units", cunit, "values", f"embedding + 2 layers x {cb} B")
        add("critic unsharded FSDP units + gradients", 2 * cunit, "update_critic",
            f"2 x (embedding + 2 layers) x {cb} B")
        csp = _int(v, "critic.ulysses_sequence_parallel_size", 1)
        cdp = max(1, world // csp)
        cseq = length(v.get("critic.model.use_remove_padding", True) is not False)
        cmini = max(1, math.ceil(_int(v, "critic.ppo_mini_batch_size", batch // n) * n / cdp))
        cu = _micro_tokens(v, dyn_key="critic.use_dynamic_bsz", budget_key="critic.ppo_max_token_len_per_gpu",
                           micro_key="critic.ppo_micro_batch_size_per_gpu", share=cmini, length=cseq,
                           padded_length=P + R, sp=csp)
        cckpt = bool(v.get("critic.model.enable_gradient_checkpointing"))
        cper = 2 * cs.activation_elems_per_token(cckpt)
        add("critic activations", cu.tokens * cper, "update_critic",
            f"{cu.what} x {cper / 1e6:.3g} MB/token ({'checkpointed' if cckpt else 'all layers'}, bf16)", cu.key)
        cf = _micro_tokens(v, dyn_key="critic.use_dynamic_bsz", budget_key="critic.forward_max_token_len_per_gpu",
                           micro_key="critic.forward_micro_batch_size_per_gpu", share=max(1, math.ceil(batch / cdp)),
                           length=cseq, padded_length=P + R, sp=csp)
        add("critic value-pass activations", cf.tokens * (4 * cs.hidden_size + 4 * cs.intermediate_size) * 2,
            "values", f"{cf.what} x (4H + 4I) x 2 B (one layer at a time)", cf.key)
    return MemoryEstimate(tuple(comps), "cuda", VERL_PHASES)


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
