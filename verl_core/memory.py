"""Peak memory of one training run, per device, from the config and the model's ``config.json`` alone.

Pure arithmetic: this module imports neither torch nor transformers, reads no weights, and is what
``python -m verl_core validate`` and the HPO driver's pre-flight check call (its helpers are in
:mod:`verl_core.memory_common`, whose public names are importable from here too; real verl's estimate is the
driver's, ``hpo/backends/verl/_memory_model.py``)::

    from verl_core.config import load_config
    from verl_core import memory

    cfg = load_config("smollm2_addition", ["data.train_batch_size=16"])
    est = memory.estimate(cfg)                      # model configs read from cfg's model paths
    avail = memory.available_bytes(est.device)      # free GPU memory, or RAM / cgroup limit / a cap
    print(est.render(avail.bytes, avail.source))
    if not est.fits(avail.bytes, margin=0.1): ...   # est.not_fitting(avail.bytes) names the culprit

What is counted follows what this trainer allocates (``verl_core/trainer.py``, ``workers.py``):

* models are loaded in **fp32** on every device (``from_pretrained(dtype=float32)``); on CUDA the
  forward passes run under bf16 autocast, so activations and logits are mostly 2-byte;
* **persistent** for the whole run: weights of actor, reference, critic and reward model; gradients
  (``zero_grad(set_to_none=True)`` frees them only at the *next* optimizer step, so both the actor's and
  the critic's stay allocated between steps) and the two AdamW moments of actor and critic; the vLLM
  engine's share; the framework baseline;
* **transient**, by phase; only the largest phase adds to the peak, since each phase frees its tensors
  before the next starts: ``rollout`` (KV cache of the generation batch and the decode step's logits),
  ``log_prob`` (inference logits of the old-log-prob / reference passes), ``update_actor`` (activations
  saved for backward, the logits of one actor micro-batch, and the dense embedding/LM-head gradients each
  backward computes before adding them to ``.grad``), ``update_critic`` (the same for the critic).

The total is ``sum(persistent) + max(phase totals)``: the worst case at the longest sequence
(``max_prompt_length + max_response_length``), so runs whose prompts or responses are shorter use less.
Formulas are in each helper's docstring; the only constants fitted on measurements are the framework
baselines, named and explained where they are defined. Calibration (estimate vs measured peak RSS on 7
configs, tiny and SmolLM2-135M, ratios 0.92-1.04): ``benchmarks/memory_estimate.py``. On CPU the glibc
allocator keeps some freed memory, so the measured peak is up to ~8% above the estimate for configs with many
micro-batches or several models; the driver's safety margin covers it. The CUDA figures follow the same
formulas with bf16 activations and are checked by ``benchmarks/gpu_check.py`` against
``torch.cuda.max_memory_allocated`` on a GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl_core.config import Config, ConfigError, derive_sizes
from verl_core.memory_common import (
    CUDA_BASELINE_BYTES,
    DTYPE_BYTES,
    PHASES,
    Available,
    Component,
    GiB,
    MemoryEstimate,
    MiB,
    ModelShape,
    _dtype_bytes,
    _gpu_total,
    _m,
    available_bytes,
    fmt_gib,
    gpu_memory,
    read_model_config,
)

__all__ = [
    "CPU_BASELINE_BYTES", "CUDA_BASELINE_BYTES", "DTYPE_BYTES", "LOGITS_COPIES_INFER", "LOGITS_COPIES_TRAIN", "PHASES",
    "TOXICITY_BASELINE_BYTES", "Available", "Component", "GiB", "MemoryEstimate", "MiB", "ModelShape",
    "available_bytes", "count_rows", "estimate", "fmt_gib", "gpu_memory", "read_model_config", "resolve_device",
]

# Framework baseline on CPU: the resident memory of a trainer process apart from the tensors counted below: the
# Python interpreter with torch, transformers and the trainer imported (0.40 GiB measured with torch 2.13 CPU and
# transformers 5.19), the tokenizer, datasets, thread pools and allocator arenas. Calibrated on the tiny-model
# cases of benchmarks/memory_estimate.py, whose own tensors are ~10 MB: peak RSS 0.51-0.53 GiB.
CPU_BASELINE_BYTES = int(0.48 * GiB)
# The default toxicity evaluator (alt-profanity-check: scikit-learn and its vectorizer) once loaded.
TOXICITY_BASELINE_BYTES = 10 * MiB
# fp32 logits tensors alive at once per (row, position, vocabulary entry) in a training forward/backward of the
# policy (workers.Policy.forward): forward: LM head output and its copy divided by the temperature, then
# log_softmax's output (saved for backward) and the entropy's softmax and product (no grad, freed); backward: the
# dense gradient of log_softmax's output (from gather), of its input, and of the LM head output (from the slice).
LOGITS_COPIES_TRAIN = 4
# The same in a no-grad log-prob pass: the scaled logits, log_softmax's output, then softmax and its product
# with the logits for the entropy.
LOGITS_COPIES_INFER = 3


def _builtin_val_prompts(path: str) -> int | None:
    """Validation prompts of the builtin datasets (None for files: unknown without reading them)."""
    if path.startswith("builtin:"):
        from verl_core import tasks

        return tasks.builtin_val_size(path.removeprefix("builtin:"))
    return None


def count_rows(path: str) -> int | None:
    """Rows of a parquet file from its footer (no data read), or of a builtin dataset; None if unknown."""
    known = _builtin_val_prompts(path)
    if known is not None or path.startswith("builtin:"):
        return known
    try:
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(Path(path).expanduser()).metadata.num_rows)
    except Exception:  # missing/corrupt files are reported by the trainer's own check
        return None


def resolve_device(name: str) -> str:
    """``trainer.device`` -> ``cpu`` or ``cuda`` without torch (auto: cuda when ``nvidia-smi`` lists a GPU)."""
    if name != "auto":
        return name
    return "cuda" if gpu_memory() else "cpu"


def estimate(cfg: Config, model_config: dict[str, Any] | None = None, *, device: str | None = None,
             critic_config: dict[str, Any] | None = None, reward_config: dict[str, Any] | None = None,
             val_prompts: int | None = None, gpu_total_bytes: int | None = None) -> MemoryEstimate:
    """Estimate the per-device peak memory of ``python -m verl_core train`` with ``cfg``.

    ``model_config``: the policy's ``config.json`` dict (default: read from ``actor_rollout_ref.model.path``);
    ``critic_config`` / ``reward_config`` likewise for ``critic.model.path`` / ``reward_model.model.path``.
    ``device``: ``cpu`` or ``cuda`` (default: ``trainer.device``, ``auto`` = cuda when nvidia-smi sees a GPU).
    ``val_prompts``: validation prompts (default: builtin sizes or the parquet footer; else the train batch).
    ``gpu_total_bytes``: the GPU's total memory for the vLLM share (default: nvidia-smi, else 80 GiB).
    """
    arr = cfg.actor_rollout_ref
    sizes = derive_sizes(cfg)
    device = device or resolve_device(cfg.trainer.device)
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device={device!r} is not one of cpu, cuda")
    cuda = device == "cuda"
    act_b = 2 if cuda else 4  # bf16 autocast on CUDA, fp32 on CPU
    shape = ModelShape.from_config(model_config or read_model_config(arr.model.path, "actor_rollout_ref.model.path"),
                                   "actor_rollout_ref.model.path")
    ckpt = arr.model.enable_gradient_checkpointing
    P, R = cfg.data.max_prompt_length, cfg.data.max_response_length
    L = P + R
    V, H = shape.vocab_size, shape.hidden_size
    comps: list[Component] = []

    def add(name: str, n_bytes: float, phase: str, formula: str) -> None:
        comps.append(Component(name, int(n_bytes), phase, formula))

    # -- framework
    base = CUDA_BASELINE_BYTES if cuda else CPU_BASELINE_BYTES
    add("framework baseline", base, "persistent",
        "CUDA context + allocator slack (not in max_memory_allocated)" if cuda
        else "python + torch + transformers + trainer RSS (measured)")
    if not cuda and cfg.evaluation.toxicity.enable and cfg.evaluation.toxicity.model is None:
        add("toxicity evaluator", TOXICITY_BASELINE_BYTES, "persistent", "alt-profanity-check (measured)")

    # -- actor: fp32 weights, fp32 grads, AdamW exp_avg + exp_avg_sq
    pa = shape.causal_lm_params()
    add("actor weights", pa * 4, "persistent", f"{_m(pa)} params x 4 B (fp32)")
    add("actor gradients", pa * 4, "persistent", f"{_m(pa)} x 4 B (fp32)")
    add("actor AdamW states", pa * 8, "persistent", f"{_m(pa)} x 2 moments x 4 B")

    use_ref = cfg.algorithm.use_kl_in_reward or arr.actor.use_kl_loss or arr.actor.kl_threshold is not None
    if use_ref:
        add("reference weights", pa * 4, "persistent", f"{_m(pa)} x 4 B (fp32, frozen)")

    cshape = None
    if cfg.algorithm.adv_estimator == "gae":
        if critic_config is None and cfg.critic.model.path and cfg.critic.model.path != arr.model.path:
            critic_config = read_model_config(cfg.critic.model.path, "critic.model.path")
        cshape = ModelShape.from_config(critic_config, "critic.model.path") if critic_config else shape
        pc = cshape.value_model_params()
        add("critic weights", pc * 4, "persistent", f"{_m(pc)} params x 4 B (fp32, value head, no LM head)")
        add("critic gradients", pc * 4, "persistent", f"{_m(pc)} x 4 B (fp32)")
        add("critic AdamW states", pc * 8, "persistent", f"{_m(pc)} x 2 moments x 4 B")

    rm = cfg.reward_model
    if rm.enable:
        rshape = ModelShape.from_config(reward_config or read_model_config(rm.model.path, "reward_model.model.path"),
                                        "reward_model.model.path")
        pr = rshape.value_model_params()
        bits = f"{rshape.weight_bits}-bit" if rshape.weight_bits else rshape.dtype
        add("reward model weights", rshape.weight_bytes(pr), "persistent",
            f"{_m(pr)} params, {bits} (its config's dtype)")
        rm_micro = rm.micro_batch_size_per_gpu or sizes.batch_samples
        rm_len = min(L, rm.max_length) if rm.max_length else L
        rm_act = rm_micro * rm_len * (4 * rshape.hidden_size + 4 * rshape.intermediate_size) * act_b
        add("reward model forward", rm_act, "log_prob",
            f"micro {rm_micro} x {rm_len} tokens x (4H + 4I) x {act_b} B (one layer at a time)")

    # -- rollout engine
    r = arr.rollout
    val_n = r.val_kwargs.n
    if val_prompts is None:
        val_prompts = count_rows(cfg.data.val_files)
    if val_prompts is not None and cfg.data.val_max_samples is not None:
        val_prompts = min(val_prompts, cfg.data.val_max_samples)
    validates = cfg.trainer.val_before_train or cfg.trainer.test_freq > 0
    val_rows = (cfg.data.val_batch_size or val_prompts or cfg.data.train_batch_size) * val_n if validates else 0
    gen_rows = max(sizes.batch_samples, val_rows)
    if r.name == "vllm":
        if cuda:
            total_gpu = gpu_total_bytes or _gpu_total() or 80 * GiB
            add("vLLM engine (weights + KV cache)", int(r.gpu_memory_utilization * total_gpu), "persistent",
                f"gpu_memory_utilization {r.gpu_memory_utilization} x {fmt_gib(total_gpu)} GiB")
        else:
            w = shape.weight_bytes(pa, "float32" if r.dtype == "auto" else r.dtype)
            add("vLLM engine weights", w, "persistent", f"{_m(pa)} x {_dtype_bytes(r.dtype)} B ({r.dtype})")
            add("vLLM KV cache", int(r.cpu_kvcache_space_gb * GiB), "persistent",
                f"cpu_kvcache_space_gb {r.cpu_kvcache_space_gb}")
    else:
        kv = gen_rows * L * shape.kv_bytes_per_token(act_b)
        add("rollout KV cache", kv, "rollout",
            f"{gen_rows} rows x {L} tokens x 2 x {shape.num_layers} layers x {shape.num_kv_heads} kv heads x "
            f"{shape.head_dim} x {act_b} B")
        # prefill over the prompts, one layer at a time: q/k/v/o + gate/up/product; the decode step's logits
        # (B, V) in fp32, the softmax and its fp64 CDF (decode.sample_from_probs)
        prefill = gen_rows * P * (2 * H + 3 * shape.intermediate_size) * act_b
        logits = gen_rows * V * (4 + 4 + 8)
        add("rollout prefill + step logits", prefill + logits, "rollout",
            f"{gen_rows} x {P} x (2H + 3I) x {act_b} B + {gen_rows} x {V} vocab x 16 B")

    # -- inference passes (old log-probs, reference): logits of one micro-batch over R + 1 positions. The
    # old-log-prob pass is skipped on-policy (one epoch, one mini-batch, no KL in the reward or threshold), as
    # the trainer does, or replaced by the decode steps' log-probs (rollout.reuse_log_probs)
    on_policy = arr.actor.ppo_epochs == 1 and sizes.actor_num_mini == 1
    old_pass = not (on_policy and not cfg.algorithm.use_kl_in_reward and arr.actor.kl_threshold is None)
    old_pass = old_pass and not r.reuse_log_probs
    raw = " + 2 B (bf16 LM-head output)" if cuda else ""
    if old_pass or use_ref:
        lp_micro = max(sizes.log_prob_micro_samples if old_pass else 0, sizes.ref_micro_samples if use_ref else 0)
        per_logit = 4 * LOGITS_COPIES_INFER + (2 if cuda else 0)
        add("log-prob logits", lp_micro * (R + 1) * V * per_logit, "log_prob",
            f"micro {lp_micro} x {R + 1} positions x {V} vocab x ({LOGITS_COPIES_INFER} fp32 copies x 4 B{raw})")
        add("log-prob layer activations", lp_micro * L * (4 * H + 4 * shape.intermediate_size) * act_b,
            "log_prob", f"micro {lp_micro} x {L} tokens x (4H + 4I) x {act_b} B (one layer at a time)")

    # -- critic update
    if cshape is not None:
        c_micro = max(sizes.critic_micro_samples, sizes.critic_forward_micro_samples)
        cv, ch = cshape.vocab_size, cshape.hidden_size
        add("critic embedding grad (backward)", cv * ch * 4, "update_critic",
            f"{cv} vocab x {ch} x 4 B (dense, per backward, before .grad +=)")
        c_tok = cshape.activation_bytes_per_token(ckpt, cuda)
        add("critic activations", c_micro * L * c_tok, "update_critic",
            f"micro {c_micro} x {L} tokens x {c_tok / 1e6:.3g} MB saved/token "
            f"({'checkpointed' if ckpt else 'all layers'}{', bf16 autocast' if cuda else ', fp32'})")

    # -- actor update: saved activations + logits of one micro-batch
    add("actor embedding + LM-head grads (backward)", 2 * V * H * 4, "update_actor",
        f"2 x {V} vocab x {H} x 4 B (dense, per backward, before .grad +=)")
    a_micro = sizes.actor_micro_samples
    a_tok = shape.activation_bytes_per_token(ckpt, cuda)
    add("actor activations", a_micro * L * a_tok, "update_actor",
        f"micro {a_micro} x {L} tokens x {a_tok / 1e6:.3g} MB saved/token "
        f"({'checkpointed' if ckpt else 'all layers'}{', bf16 autocast' if cuda else ', fp32'})")
    per_logit = 4 * LOGITS_COPIES_TRAIN + (2 if cuda else 0)
    add("actor logits", a_micro * (R + 1) * V * per_logit, "update_actor",
        f"micro {a_micro} x {R + 1} positions x {V} vocab x ({LOGITS_COPIES_TRAIN} fp32 copies x 4 B{raw})")
    return MemoryEstimate(tuple(comps), device)
