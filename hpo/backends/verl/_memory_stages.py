"""The stages of verl's memory estimate (:func:`hpo.backends.verl._memory_model.estimate_verl`, whose module docstring
has the mapping from verl 0.9.1's code): one :class:`Run` under way, and what each part of a verl step adds to it in
table order: the actor's state (:func:`actor_state`), its update (:func:`actor_update`), the log-prob passes
(:func:`log_prob_passes`), the rollout engine on the same GPUs (:func:`rollout_engine`), the critic (:func:`critic`).
Pure arithmetic on :mod:`hpo.backends._shapes`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hpo.backends._shapes import (
    CUDA_BASELINE_BYTES,
    Component,
    EstimateError,
    GiB,
    MiB,
    ModelShape,
    SequenceLengths,
    compact_count,
    dtype_bytes,
    fmt_gib,
    gpu_total,
)
from hpo.backends.verl._model_config import read_hub_or_local_config

AR = "actor_rollout_ref"
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
        raise EstimateError(f"{micro_key}=null without dynamic batching: no micro-batch to estimate")
    n = min(int(micro), share)
    tokens = math.ceil(n * length / sp)
    return _Pass(tokens, f"micro {n} x {length:.0f} tokens" + (f" / sp {sp}" if sp > 1 else ""), micro_key)


@dataclass
class Run:
    """One estimate under way: the composed ``values``, the policy's shape, the sizes every stage reads (set from
    them when made) and the lines so far (:meth:`add`, in table order)."""

    v: dict[str, Any]
    shape: ModelShape
    lengths: SequenceLengths | None
    gpu_total_bytes: int | None
    comps: list[Component] = field(default_factory=list)
    world: int = field(init=False)  # GPUs of the run
    P: int = field(init=False)  # max prompt / response length
    R: int = field(init=False)
    exp_p: float = field(init=False)  # expected prompt / response length
    exp_r: float = field(init=False)
    n: int = field(init=False)  # rollouts per prompt
    batch: int = field(init=False)  # sequences per step
    W: int = field(init=False)  # the actor's FSDP ranks
    mb: int = field(init=False)  # bytes per parameter of the actor's model dtype
    cb: int = field(init=False)  # bytes per parameter of its compute (mixed-precision) dtype
    fsdp2: bool = field(init=False)
    pa: int = field(init=False)  # the policy's parameters
    lora: int = field(init=False)
    trainable: int = field(init=False)  # parameters with gradients (the LoRA adapters' with a rank)
    sp: int = field(init=False)  # the actor's Ulysses sequence-parallel size
    seq: float = field(init=False)  # tokens per sequence of the actor's passes
    fused: bool = field(init=False)  # use_fused_kernels: no logits materialized
    t_b: int = field(init=False)  # logits bytes of the temperature copy
    mode: str = field(init=False)  # how the entropy is computed: compiled or eager

    def __post_init__(self) -> None:
        v = self.v
        self.world = _int(v, "trainer.n_gpus_per_node", 1) * _int(v, "trainer.nnodes", 1)
        self.P, self.R = int(v["data.max_prompt_length"]), int(v["data.max_response_length"])
        lengths = self.lengths
        self.exp_p = min(self.P, lengths.prompt) if lengths and lengths.prompt else self.P
        self.exp_r = min(self.R, lengths.response) if lengths and lengths.response else self.R
        self.n = _int(v, f"{AR}.rollout.n", 1)
        self.batch = _int(v, "data.train_batch_size", 1) * self.n
        fc = f"{AR}.actor.fsdp_config"
        self.W = self.shards(v.get(f"{fc}.fsdp_size"))
        self.mb = dtype_bytes(v.get(f"{fc}.model_dtype") or "fp32")
        self.cb = dtype_bytes(v.get(f"{fc}.mixed_precision.param_dtype") or "bf16", 2)
        self.fsdp2 = v.get(f"{AR}.actor.strategy") == "fsdp2"
        self.pa = self.shape.causal_lm_params()
        self.lora = _int(v, f"{AR}.model.lora_rank", 0)
        self.trainable = self.shape.lora_params(self.lora) if self.lora > 0 else self.pa
        self.sp = _int(v, f"{AR}.actor.ulysses_sequence_parallel_size", 1)
        self.seq = self.length(v.get(f"{AR}.model.use_remove_padding", True) is not False)
        self.fused = bool(v.get(f"{AR}.model.use_fused_kernels"))
        self.t_b = LOGITS_BYTES_TEMPERATURE if float(v.get(f"{AR}.rollout.temperature") or 1.0) != 1.0 else 0
        self.mode = "eager" if v.get(f"{fc}.use_torch_compile") is False else "compiled"

    def add(self, name: str, n_bytes: float, phase: str | tuple[str, ...], formula: str, key: str | None = None,
            process: str = "actor", allocated: bool = True) -> None:
        for p in (phase,) if isinstance(phase, str) else phase:
            self.comps.append(Component(name, int(n_bytes), p, formula, key, process, allocated))

    def shards(self, fsdp_size: Any) -> int:
        size = int(fsdp_size) if fsdp_size not in (None, -1) else self.world
        return max(1, min(size, self.world))

    def length(self, remove_padding: bool) -> float:
        return self.exp_p + self.exp_r if remove_padding else self.P + self.R


def actor_state(run: Run) -> None:
    """The training workers' CUDA context (and NCCL's), the actor's sharded state (kept on the GPU unless
    offloaded) and its unsharded FSDP units."""
    v, W, mb, cb, pa = run.v, run.W, run.mb, run.cb, run.pa
    add, world, shape = run.add, run.world, run.shape
    add("CUDA context (training workers)", CUDA_BASELINE_BYTES, "persistent",
        "one Ray process for actor, reference and critic: CUDA context + allocator slack", process="actor",
        allocated=False)
    if world > 1:
        add("NCCL communicators (training workers)", NCCL_BYTES, "persistent", f"FSDP over {world} GPUs (rough)",
            process="actor", allocated=False)
    fc = f"{AR}.actor.fsdp_config"
    cpu_policy = bool(v.get(f"{fc}.offload_policy")) and run.fsdp2
    off_p, off_o = bool(v.get(f"{fc}.param_offload")) and not cpu_policy, \
        bool(v.get(f"{fc}.optimizer_offload")) and not cpu_policy
    what_t = f"{compact_count(run.trainable)} {'LoRA ' if run.lora > 0 else ''}params"
    params = pa * mb / W
    shard = f"{compact_count(pa)} params x {mb} B / {W} GPU(s)"
    if cpu_policy:
        add("actor state on the CPU", 0, "persistent", "fsdp2 offload_policy: params, grads, AdamW on the CPU",
            f"{fc}.offload_policy")
    elif off_p:
        add("actor params (loaded from the CPU)", params, ("old_log_prob", "update_actor", "actor_step",
                                                           "weight_sync"), shard, f"{fc}.param_offload")
    else:
        add("actor params", params, "persistent", shard, f"{fc}.param_offload")
    optim = run.trainable * 2 * mb / W
    if not cpu_policy:
        add("actor gradients", run.trainable * mb / W, ("update_actor", "actor_step"),
            f"{what_t} x {mb} B / {W} GPU(s) (set to None after the update)")
        oform = f"{what_t} x 2 moments x {mb} B / {W} GPU(s)"
        if off_o:
            add("actor AdamW states (loaded from the CPU)", optim, ("update_actor", "actor_step"), oform,
                f"{fc}.optimizer_offload")
        else:
            add("actor AdamW states", optim, "persistent", oform, f"{fc}.optimizer_offload")
        add("AdamW step temporaries", run.trainable * mb / W, "actor_step",
            f"foreach sqrt of the second moments: {what_t} x {mb} B / {W} GPU(s)")
    root = shape.vocab_size * shape.hidden_size * (1 if shape.tie_word_embeddings else 2)
    unit = (root + 2 * shape.layer_params()) * cb
    tied = "" if shape.tie_word_embeddings else " + LM head"
    add("unsharded FSDP units", unit, ("old_log_prob", "ref"),
        f"root (embedding{tied}) + 2 layers x {cb} B (forward prefetch)")
    if run.lora > 0:  # the base is frozen: its units get no gradient
        add("unsharded FSDP units", unit, "update_actor", f"root (embedding{tied}) + 2 layers x {cb} B (frozen)")
    else:
        add("unsharded FSDP units + their gradients", 2 * unit, "update_actor",
            f"2 x (root (embedding{tied}) + 2 layers) x {cb} B")
    if bool(v.get(f"{fc}.use_no_sync_for_gradient_accumulation")) and W > 1:
        add("unsharded gradients (no_sync accumulation)", pa * cb, "update_actor",
            f"{compact_count(pa)} params x {cb} B, all of them, until the last micro-batch",
            f"{fc}.use_no_sync_for_gradient_accumulation")


def actor_update(run: Run) -> None:
    """One micro-batch of the actor's update: its activations (bf16; checkpointed layer inputs with gradient
    checkpointing) and its logits."""
    v, shape, seq = run.v, run.shape, run.seq
    dp = max(1, run.world // run.sp)
    ckpt = bool(v.get(f"{AR}.model.enable_gradient_checkpointing"))
    act_off = bool(v.get(f"{AR}.model.enable_activation_offload"))
    mini = max(1, math.ceil(_int(v, f"{AR}.actor.ppo_mini_batch_size", run.batch // run.n) * run.n / dp))
    upd = _micro_tokens(v, dyn_key=f"{AR}.actor.use_dynamic_bsz", budget_key=f"{AR}.actor.ppo_max_token_len_per_gpu",
                        micro_key=f"{AR}.actor.ppo_micro_batch_size_per_gpu", share=mini, length=seq,
                        padded_length=run.P + run.R, sp=run.sp)
    per_tok = 2 * shape.activation_elems_per_token(ckpt)
    if ckpt and act_off:
        per_tok -= 2 * shape.num_layers * shape.hidden_size  # checkpointed layer inputs go to the CPU
    run.add("actor activations", upd.tokens * per_tok, "update_actor",
            f"{upd.what} x {per_tok / 1e6:.3g} MB/token ({'checkpointed' if ckpt else 'all layers'}, bf16)", upd.key)
    entropy = bool(v.get(f"{AR}.actor.calculate_entropy")) or float(v.get(f"{AR}.actor.entropy_coeff") or 0) != 0
    per_logit = LOGITS_BYTES + run.t_b + (LOGITS_BYTES_ENTROPY_TRAIN[run.mode] if entropy else 0)
    run.add("actor logits", 0 if run.fused else upd.tokens * shape.vocab_size * per_logit, "update_actor",
            "use_fused_kernels: not materialized" if run.fused else
            f"{upd.what} x {shape.vocab_size} vocab x {per_logit} B (bf16{', temperature copy' if run.t_b else ''}"
            f"{f', {run.mode} entropy with grad' if entropy else ''})", upd.key)


def log_prob_passes(run: Run, use_ref: bool) -> None:
    """The old-log-prob pass and the reference's: one layer's activations and the logits of one micro-batch."""
    v, shape, seq, sp, V, fused, t_b = run.v, run.shape, run.seq, run.sp, run.shape.vocab_size, run.fused, run.t_b
    layer_tok = (4 * shape.hidden_size + 4 * shape.intermediate_size) * 2
    share = max(1, math.ceil(run.batch / max(1, run.world // sp)))
    old = _micro_tokens(v, dyn_key=f"{AR}.rollout.log_prob_use_dynamic_bsz",
                        budget_key=f"{AR}.rollout.log_prob_max_token_len_per_gpu",
                        micro_key=f"{AR}.rollout.log_prob_micro_batch_size_per_gpu", share=share, length=seq,
                        padded_length=run.P + run.R, sp=sp)
    ent_b = 0 if v.get(f"{AR}.actor.fsdp_config.entropy_from_logits_with_chunking") or v.get(
        f"{AR}.actor.entropy_from_logits_with_chunking") else LOGITS_BYTES_ENTROPY_INFER[run.mode]
    run.add("old-log-prob layer activations", old.tokens * layer_tok, "old_log_prob",
            f"{old.what} x (4H + 4I) x 2 B (one layer at a time)", old.key)
    per_logit = LOGITS_BYTES + t_b + ent_b
    run.add("old-log-prob logits", 0 if fused else old.tokens * V * per_logit, "old_log_prob",
            "use_fused_kernels: not materialized" if fused else
            f"{old.what} x {V} vocab x {per_logit} B (bf16{', temperature copy' if t_b else ''}"
            f"{', eager entropy' if ent_b else ''})", old.key)
    if not use_ref:
        return
    if run.lora > 0:
        run.add("reference = actor without its adapters", 0, "ref", "LoRA: no separate reference model")
    ref = _micro_tokens(v, dyn_key=f"{AR}.ref.log_prob_use_dynamic_bsz",
                        budget_key=f"{AR}.ref.log_prob_max_token_len_per_gpu",
                        micro_key=f"{AR}.ref.log_prob_micro_batch_size_per_gpu", share=share, length=seq,
                        padded_length=run.P + run.R, sp=sp)
    run.add("reference params", 0, "ref", "forward-only engine: FSDP keeps them on the CPU (CPUOffload)")
    run.add("reference layer activations", ref.tokens * layer_tok, "ref",
            f"{ref.what} x (4H + 4I) x 2 B (one layer at a time)", ref.key)
    per_logit = LOGITS_BYTES + t_b
    run.add("reference logits", 0 if fused else ref.tokens * V * per_logit, "ref",
            "use_fused_kernels: not materialized" if fused else
            f"{ref.what} x {V} vocab x {per_logit} B (bf16{', temperature copy' if t_b else ''})", ref.key)


def rollout_engine(run: Run) -> None:
    """vLLM (or sglang) on the same GPUs: its context and CUDA graphs, its reservation while awake, the weights
    woken for the sync, and the weight sync's state dict, gathered parameter and CUDA-IPC bucket."""
    v, r, add, pa, mb, W = run.v, f"{AR}.rollout", run.add, run.pa, run.mb, run.W
    if v.get(f"{r}.name") not in ("vllm", "sglang"):
        return
    total_gpu = run.gpu_total_bytes or gpu_total() or 80 * GiB
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
            f"{compact_count(pa)} params x 2 B / tp {tp} (KV cache still asleep)", f"{r}.tensor_model_parallel_size",
            "vllm", False)
    else:
        add(f"{name} weights + KV cache", reserve, "persistent", what + " (free_cache_engine=false: always held)",
            f"{r}.gpu_memory_utilization", "vllm", False)
    # the weight sync: the state dict the actor hands over, one gathered parameter, the CUDA-IPC bucket
    state: float
    if run.lora > 0:
        state, sform = run.trainable * mb, "LoRA adapters only"
    elif run.fsdp2:
        state, sform = 0, "fsdp2: views of the sharded parameters"
    elif W == 1:
        state, sform = pa * mb, f"FSDP1 FULL_STATE_DICT on one GPU: a clone of {compact_count(pa)} params x {mb} B"
    else:
        state = pa * mb / W
        sform = f"FSDP1 sharded state dict: clones of the shards, {compact_count(pa)} x {mb} B / {W}"
    add("actor state dict (weight sync)", state, "weight_sync", sform)
    if W > 1 and run.lora == 0:
        V, H = run.shape.vocab_size, run.shape.hidden_size
        add("one gathered parameter", V * H * mb, "weight_sync", f"the embedding, {V} x {H} x {mb} B (full_tensor)")
    bucket = _int(v, f"{r}.checkpoint_engine.update_weights_bucket_megabytes", 2048) * MiB
    add("weight-sync bucket", bucket, "weight_sync", f"CUDA-IPC buffer of {bucket // MiB} MiB, allocated whole",
        f"{r}.checkpoint_engine.update_weights_bucket_megabytes")


def critic(run: Run, critic_config: dict[str, Any] | None) -> None:
    """The critic (GAE), in the same process as the actor: its sharded state, unsharded units, one micro-batch of
    its update and of its value pass."""
    v, add, cb = run.v, run.add, run.cb
    cpath = v.get("critic.model.path")
    if critic_config is None and cpath and cpath != v.get(f"{AR}.model.path"):
        critic_config = read_hub_or_local_config(cpath, "critic.model.path")
    cs = ModelShape.from_config(critic_config, "critic.model.path") if critic_config else run.shape
    Wc = run.shards(v.get("critic.fsdp.fsdp_size"))
    cmb = dtype_bytes(v.get("critic.fsdp.model_dtype") or "fp32")
    pc = cs.value_model_params()
    cshard = f"{compact_count(pc)} params x {{}} B / {Wc} GPU(s)"
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
    cdp = max(1, run.world // csp)
    cseq = run.length(v.get("critic.model.use_remove_padding", True) is not False)
    cmini = max(1, math.ceil(_int(v, "critic.ppo_mini_batch_size", run.batch // run.n) * run.n / cdp))
    cu = _micro_tokens(v, dyn_key="critic.use_dynamic_bsz", budget_key="critic.ppo_max_token_len_per_gpu",
                       micro_key="critic.ppo_micro_batch_size_per_gpu", share=cmini, length=cseq,
                       padded_length=run.P + run.R, sp=csp)
    cckpt = bool(v.get("critic.model.enable_gradient_checkpointing"))
    cper = 2 * cs.activation_elems_per_token(cckpt)
    add("critic activations", cu.tokens * cper, "update_critic",
        f"{cu.what} x {cper / 1e6:.3g} MB/token ({'checkpointed' if cckpt else 'all layers'}, bf16)", cu.key)
    cf = _micro_tokens(v, dyn_key="critic.use_dynamic_bsz", budget_key="critic.forward_max_token_len_per_gpu",
                       micro_key="critic.forward_micro_batch_size_per_gpu", share=max(1, math.ceil(run.batch / cdp)),
                       length=cseq, padded_length=run.P + run.R, sp=csp)
    add("critic value-pass activations", cf.tokens * (4 * cs.hidden_size + 4 * cs.intermediate_size) * 2,
        "values", f"{cf.what} x (4H + 4I) x 2 B (one layer at a time)", cf.key)
