"""Peak memory of one training run, per device, from the config and the model's ``config.json`` alone.

Pure arithmetic: this module imports neither torch nor transformers, reads no weights, and is what
``python -m verl_core validate`` and the HPO driver's pre-flight check call::

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

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_core.config import Config, ConfigError, derive_sizes

GiB = 1024**3
MiB = 1024**2

DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
               "float64": 8, "int8": 1, "auto": 4}

# Framework baseline on CPU: the resident memory of a trainer process apart from the tensors counted below: the
# Python interpreter with torch, transformers and the trainer imported (0.40 GiB measured with torch 2.13 CPU and
# transformers 5.19), the tokenizer, datasets, thread pools and allocator arenas. Calibrated on the tiny-model
# cases of benchmarks/memory_estimate.py, whose own tensors are ~10 MB: peak RSS 0.51-0.53 GiB.
CPU_BASELINE_BYTES = int(0.48 * GiB)
# The default toxicity evaluator (alt-profanity-check: scikit-learn and its vectorizer) once loaded.
TOXICITY_BASELINE_BYTES = 10 * MiB
# CUDA context, cuBLAS workspaces and the caching allocator's slack: held by the process on the GPU but not
# counted by torch.cuda.max_memory_allocated (compare that with MemoryEstimate.allocated_total).
CUDA_BASELINE_BYTES = int(0.75 * GiB)
# fp32 logits tensors alive at once per (row, position, vocabulary entry) in a training forward/backward of the
# policy (workers.Policy.forward): forward: LM head output and its copy divided by the temperature, then
# log_softmax's output (saved for backward) and the entropy's softmax and product (no grad, freed); backward: the
# dense gradient of log_softmax's output (from gather), of its input, and of the LM head output (from the slice).
LOGITS_COPIES_TRAIN = 4
# The same in a no-grad log-prob pass: the scaled logits, log_softmax's output, then softmax and its product
# with the logits for the entropy.
LOGITS_COPIES_INFER = 3


def _dtype_bytes(name: Any, default: int = 4) -> int:
    if name is None:
        return default
    return DTYPE_BYTES.get(str(name).replace("torch.", "").lower(), default)


# ----------------------------------------------------------------------------- model shape
@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only ``config.json`` that memory depends on.

    ``H`` hidden size, ``I`` MLP width (per expert for MoE), ``n_layers``, ``n_heads`` query heads and
    ``n_kv`` key/value heads of dimension ``head_dim``, ``V`` vocabulary; ``weight_bits`` is 4 or 8 for a
    bitsandbytes-quantized checkpoint (``quantization_config.load_in_4bit/8bit``), else None.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool
    qkv_bias: bool
    num_experts: int = 1
    dtype: str = "float32"
    weight_bits: int | None = None

    @classmethod
    def from_config(cls, cfg: dict[str, Any], where: str = "config.json") -> ModelShape:
        """Read a Hugging Face ``config.json`` dict (nested ``text_config`` for multimodal wrappers)."""
        if "text_config" in cfg and "hidden_size" not in cfg:
            cfg = {**cfg["text_config"], "quantization_config": cfg.get("quantization_config")}
        missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
                   if not isinstance(cfg.get(k), int)]
        if missing:
            raise ConfigError(f"{where}: no integer {', '.join(missing)}: not a decoder-only transformer config")
        h, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        q = cfg.get("quantization_config") or {}
        bits = 4 if q.get("load_in_4bit") else 8 if q.get("load_in_8bit") else None
        mtype = str(cfg.get("model_type", "unknown"))
        return cls(
            model_type=mtype,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=h,
            intermediate_size=int(cfg.get("intermediate_size") or 4 * h),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or h // heads),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            # Qwen2 has q/k/v biases without saying so; Llama-likes say attention_bias
            qkv_bias=bool(cfg.get("attention_bias", mtype == "qwen2")),
            num_experts=int(cfg.get("num_local_experts") or cfg.get("num_experts") or 1),
            dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"),
            weight_bits=bits,
        )

    # -- parameters
    def layer_params(self) -> int:
        """One decoder layer: ``H*(Hq + 2 Hkv) [+ Hq + 2 Hkv biases] + Hq*H`` (attention) ``+ 3 H I`` per
        expert (gated MLP: gate, up, down) ``[+ H * experts]`` (router) ``+ 2 H`` (two RMSNorms);
        ``Hq = n_heads * head_dim``, ``Hkv = n_kv * head_dim``."""
        h, hq, hkv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attn = h * (hq + 2 * hkv) + hq * h + ((hq + 2 * hkv) if self.qkv_bias else 0)
        mlp = 3 * h * self.intermediate_size * self.num_experts + (h * self.num_experts if self.num_experts > 1 else 0)
        return attn + mlp + 2 * h

    def backbone_params(self) -> int:
        """Embedding ``V * H`` + layers + final norm ``H``."""
        return self.vocab_size * self.hidden_size + self.num_layers * self.layer_params() + self.hidden_size

    def causal_lm_params(self) -> int:
        """``*ForCausalLM``: backbone + LM head ``V * H`` unless tied to the embedding."""
        return self.backbone_params() + (0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size)

    def value_model_params(self, num_labels: int = 1) -> int:
        """``*ForTokenClassification`` / ``*ForSequenceClassification`` (critic, reward model): backbone + a
        ``H -> num_labels`` head with bias (the critic); no LM head."""
        return self.backbone_params() + self.hidden_size * num_labels + num_labels

    # -- activations
    def activation_elems_per_token(self, checkpointing: bool) -> int:
        """Elements saved for backward per token for the whole stack (one micro-batch of a training forward).

        Per decoder layer (HF Llama/Qwen2 with SDPA): RMSNorm inputs and outputs ``2 x 2H``, q, k, v after
        RoPE ``Hq + 2 Hkv``, attention output ``Hq`` (o_proj input), gated MLP ``4 I`` (gate, silu(gate),
        up, their product = down_proj input) -> ``4H + 2Hq + 2Hkv + 4I``. SDPA's kernels keep no
        ``L x L`` matrix. Plus embedding output and final norm ``3H``. With gradient checkpointing only each
        layer's input ``H`` is kept, and one layer is recomputed at a time: ``n_layers * H + per_layer + 3H``.
        """
        h = self.hidden_size
        per_layer = 4 * h + self._matmul_side_elems()
        if checkpointing:
            return self.num_layers * h + per_layer + 3 * h
        return self.num_layers * per_layer + 3 * h

    def _matmul_side_elems(self) -> int:
        """Per layer and token, the saved tensors that are matmul inputs/outputs: ``2Hq + 2Hkv + 4I``."""
        hq, hkv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return 2 * hq + 2 * hkv + 4 * self.intermediate_size

    def activation_bytes_per_token(self, checkpointing: bool, autocast: bool) -> int:
        """Bytes of :meth:`activation_elems_per_token`. fp32 (CPU): 4 B each. Under bf16 autocast (CUDA) the
        weights and the residual stream stay fp32, so the RMSNorm inputs/outputs ``4H`` (and checkpointed layer
        inputs) are 4 B, while the matmul side is 2 B plus the bf16 copies autocast makes of the two norm
        outputs for q/k/v and gate/up ``2H``: ``16H + 2 (2H + 2Hq + 2Hkv + 4I)`` per layer."""
        if not autocast:
            return 4 * self.activation_elems_per_token(checkpointing)
        h = self.hidden_size
        per_layer = 16 * h + 2 * (2 * h + self._matmul_side_elems())
        if checkpointing:
            return 4 * self.num_layers * h + per_layer + 12 * h
        return self.num_layers * per_layer + 12 * h

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV cache per token: ``2 (K and V) * n_layers * n_kv * head_dim * bytes``."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def linear_params(self) -> int:
        """Weights of the decoder layers' linear projections (what bitsandbytes quantizes; embeddings, norms
        and heads stay in the load dtype)."""
        h, hq, hkv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return self.num_layers * (h * (hq + 2 * hkv) + hq * h + 3 * h * self.intermediate_size * self.num_experts)

    def weight_bytes(self, n_params: int, load_dtype: str | None = None) -> int:
        """Weights in memory: ``params * bytes(dtype)``. Quantized (bitsandbytes): the layers' linear weights
        take ``bits / 8`` bytes plus one fp32 absmax per 64-weight block, the rest (embedding, norms, heads)
        stays in the dtype. ``load_dtype`` overrides the checkpoint's dtype (the trainer loads its own models
        in fp32)."""
        dtype_b = _dtype_bytes(load_dtype or self.dtype)
        if self.weight_bits is None:
            return n_params * dtype_b
        q = min(self.linear_params(), n_params)
        return q * self.weight_bits // 8 + q // 64 * 4 + (n_params - q) * dtype_b


# ----------------------------------------------------------------------------- reading config.json
def read_model_config(path: str | None, key: str = "model path") -> dict[str, Any]:
    """The ``config.json`` of a model path as a dict, without loading weights or importing torch.

    Builtin names (``builtin:tiny_arith``, ``builtin:smollm2``) are answered from their recipes even
    before they are built; a directory must hold ``config.json``.
    """
    if path is None:
        raise ConfigError(f"{key}=None: no model path")
    if path == "builtin:tiny_arith":
        from verl_core.tiny_model import tiny_config

        return tiny_config()
    if path == "builtin:smollm2":
        from verl_core.pretrained import smollm2_config

        return smollm2_config()
    p = Path(path).expanduser() / "config.json"
    if not p.is_file():
        raise ConfigError(f"{key}={path!r}: not a local Hugging Face model directory (no config.json)")
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{key}={path!r}: unreadable config.json ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{key}={path!r}: config.json is not a JSON object")
    return data


# ----------------------------------------------------------------------------- the estimate
@dataclass(frozen=True)
class Component:
    """One line of the estimate: ``phase`` is ``persistent`` or the transient phase it belongs to.

    ``key``: the config key that sets (or removes) this line, named when the estimate does not fit.
    ``process``: which process holds it (verl: ``actor``, ``critic``, ``vllm``; empty for verl_core's single
    trainer process); ``allocated``: whether torch's caching allocator of that process counts it (False for CUDA
    contexts and for the vLLM server's reservation, which ``max_memory_allocated`` of a training worker never
    sees)."""

    name: str
    bytes: int
    phase: str
    formula: str
    key: str | None = None
    process: str = ""
    allocated: bool = True


PHASES = ("rollout", "log_prob", "update_critic", "update_actor")


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-device peak estimate: persistent components plus the largest transient phase."""

    components: tuple[Component, ...]
    device: str  # "cpu" or "cuda"

    def phase_bytes(self) -> dict[str, int]:
        out = {p: 0 for p in PHASES}
        for c in self.components:
            if c.phase != "persistent":
                out[c.phase] += c.bytes
        return out

    @property
    def persistent(self) -> int:
        return sum(c.bytes for c in self.components if c.phase == "persistent")

    @property
    def peak_phase(self) -> str:
        phases = self.phase_bytes()
        return max(phases, key=lambda p: phases[p])

    @property
    def total(self) -> int:
        """Estimated peak: persistent + the largest phase (bytes)."""
        return self.persistent + max(self.phase_bytes().values())

    @property
    def allocated_total(self) -> int:
        """The peak as ``torch.cuda.max_memory_allocated`` sees it: without the framework baseline."""
        return self.total - sum(c.bytes for c in self.components if c.name == "framework baseline")

    def peak_components(self) -> list[Component]:
        """The components that make up :attr:`total`, in table order."""
        peak = self.peak_phase
        return [c for c in self.components if c.phase in ("persistent", peak)]

    def allocated_peak(self, process: str) -> int:
        """The peak of one process's torch allocator (``max_memory_allocated`` of, e.g., verl's actor worker): its
        allocated components, persistent plus the largest of its phases."""
        mine = [c for c in self.components if c.process == process and c.allocated]
        base = sum(c.bytes for c in mine if c.phase == "persistent")
        return base + max((sum(c.bytes for c in mine if c.phase == p) for p in PHASES), default=0)

    def fits(self, available: int, margin: float = 0.0) -> bool:
        """Whether ``total * (1 + margin) <= available``."""
        return self.total * (1.0 + margin) <= available

    def not_fitting(self, available: int, margin: float = 0.0) -> str | None:
        """None when it fits, else one line: the component whose addition crosses ``available`` (counting the
        peak's components in table order), the total, and the largest component."""
        if self.fits(available, margin):
            return None
        running = 0
        crossing = None
        for c in self.peak_components():
            running += c.bytes
            if crossing is None and running * (1.0 + margin) > available:
                crossing = c
        largest = max(self.peak_components(), key=lambda c: c.bytes)
        assert crossing is not None
        m = f" with a {margin:.0%} margin" if margin else ""
        via = f" [{largest.key}]" if largest.key else ""
        return (f"does not fit: '{crossing.name}' ({fmt_gib(crossing.bytes)}) takes the estimated peak past the "
                f"{fmt_gib(available)} available{m}: total {fmt_gib(self.total)} in phase {self.peak_phase}; "
                f"largest component '{largest.name}'{via} {fmt_gib(largest.bytes)} ({largest.formula})")

    def dominant_key(self) -> str | None:
        """The config key of the largest component of the peak that has one (what to change first)."""
        keyed = [c for c in self.peak_components() if c.key]
        return max(keyed, key=lambda c: c.bytes).key if keyed else None

    def render(self, available: int | None = None, available_what: str = "") -> str:
        """A table: component, phase, GiB, formula; then the total (and what is available)."""
        rows = [(c.name, c.phase, fmt_gib(c.bytes), c.formula + (f"  [{c.key}]" if c.key else ""))
                for c in self.components if c.bytes > 0]
        phases = self.phase_bytes()
        rows.append(("persistent", "", fmt_gib(self.persistent), "sum of the persistent rows"))
        for p in PHASES:
            mark = "  <- peak" if p == self.peak_phase else ""
            rows.append((f"phase {p}", "", fmt_gib(phases[p]), f"transient{mark}"))
        rows.append(("TOTAL (peak)", self.device, fmt_gib(self.total), f"persistent + phase {self.peak_phase}"))
        if available is not None:
            rows.append(("available", "", fmt_gib(available), available_what))
        widths = [max(len(r[i]) for r in rows + [("component", "phase", "GiB", "formula")]) for i in range(3)]
        head = ("component", "phase", "GiB", "formula")
        lines = [f"{head[0]:<{widths[0]}}  {head[1]:<{widths[1]}}  {head[2]:>{widths[2]}}  {head[3]}"]
        lines.append("-" * (sum(widths) + 6 + 40))
        for r in rows:
            if r[0] == "persistent":
                lines.append("-" * (sum(widths) + 6 + 40))
            lines.append(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}".rstrip())
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form (bytes), e.g. for a trial's ``fail_reason`` details."""
        return {"device": self.device, "total": self.total, "persistent": self.persistent,
                "peak_phase": self.peak_phase, "phases": self.phase_bytes(),
                "components": [{"name": c.name, "bytes": c.bytes, "phase": c.phase, "formula": c.formula,
                                "key": c.key, "process": c.process} for c in self.components]}


def fmt_gib(n: int | float) -> str:
    return f"{n / GiB:.2f}"


def _m(n: int) -> str:
    """Compact count: 134.5M, 0.41M, 49152."""
    return f"{n / 1e6:.1f}M" if n >= 10**6 else f"{n / 1e6:.2f}M" if n >= 10**4 else str(n)


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


# ----------------------------------------------------------------------------- what is available
@dataclass(frozen=True)
class Available:
    """Bytes a trial may use on its device and where the figure comes from."""

    bytes: int
    source: str


def gpu_memory() -> list[tuple[int, int]]:
    """``(free, total)`` bytes per visible GPU from ``nvidia-smi`` (honours CUDA_VISIBLE_DEVICES when it lists
    indices); [] when there is no nvidia-smi or no GPU."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=index,memory.free,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows: dict[str, tuple[int, int]] = {}
    for line in out.strip().splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 3 and all(x.isdigit() for x in parts):
            rows[parts[0]] = (int(parts[1]) * MiB, int(parts[2]) * MiB)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [x.strip() for x in visible.split(",") if x.strip()]
        if all(x.isdigit() for x in ids):
            return [rows[i] for i in ids if i in rows]
    return list(rows.values())


def _gpu_total() -> int | None:
    gpus = gpu_memory()
    return gpus[0][1] if gpus else None


def _cgroup_limit() -> int | None:
    """The memory limit of this process's cgroup (v2 ``memory.max`` or v1 ``memory.limit_in_bytes``), if any."""
    for f in (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            text = f.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    return None


def available_bytes(device: str = "cpu", memory_limit_gb: float | None = None) -> Available:
    """What a run may use on ``device``: the free memory of the first visible GPU (nvidia-smi) on ``cuda``;
    on ``cpu`` the available RAM (``MemAvailable``), lowered to the cgroup limit and to ``memory_limit_gb``
    (a trial's cap) when those are smaller. ``memory_limit_gb`` also caps the GPU figure when given."""
    cap = int(memory_limit_gb * GiB) if memory_limit_gb is not None else None
    if device == "cuda":
        gpus = gpu_memory()
        if gpus:
            free = gpus[0][0]
            if cap is not None and cap < free:
                return Available(cap, f"--memory-limit-gb {memory_limit_gb}")
            return Available(free, "free memory of GPU 0 (nvidia-smi)")
        if cap is not None:
            return Available(cap, f"--memory-limit-gb {memory_limit_gb} (no GPU visible)")
    candidates = [(_mem_available(), "available RAM (MemAvailable)")]
    limit = _cgroup_limit()
    if limit is not None:
        candidates.append((limit, "cgroup memory limit"))
    if cap is not None:
        candidates.append((cap, f"--memory-limit-gb {memory_limit_gb}"))
    n, src = min(candidates, key=lambda c: c[0])
    return Available(n, src)


def _mem_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


# ----------------------------------------------------------------------------- real verl (trial.backend: verl)
# What verl 0.9.1 (engine workers, ``verl/workers/engine/fsdp/transformer_impl.py``) keeps on each GPU, from the
# keys of a composed ``ppo_trainer`` config. ``hpo/_verl_compose.py`` selects these keys in verl's interpreter
# (hydra interpolations resolved) and :func:`estimate_verl` does the arithmetic here, without verl or torch.
AR = "actor_rollout_ref"
VERL_MEMORY_KEYS = (
    "trainer.n_gpus_per_node", "trainer.nnodes", "data.max_prompt_length", "data.max_response_length",
    f"{AR}.model.path", f"{AR}.model.enable_gradient_checkpointing", f"{AR}.model.use_fused_kernels",
    f"{AR}.actor.strategy", f"{AR}.actor.fsdp_config.param_offload", f"{AR}.actor.fsdp_config.optimizer_offload",
    f"{AR}.actor.fsdp_config.offload_policy", f"{AR}.actor.fsdp_config.fsdp_size",
    f"{AR}.actor.fsdp_config.model_dtype", f"{AR}.actor.fsdp_config.mixed_precision.param_dtype",
    f"{AR}.actor.ppo_micro_batch_size_per_gpu", f"{AR}.actor.use_dynamic_bsz", f"{AR}.actor.ppo_max_token_len_per_gpu",
    f"{AR}.actor.ulysses_sequence_parallel_size", f"{AR}.actor.calculate_entropy", f"{AR}.actor.entropy_coeff",
    f"{AR}.rollout.name", f"{AR}.rollout.gpu_memory_utilization", f"{AR}.rollout.free_cache_engine",
    f"{AR}.rollout.enforce_eager", f"{AR}.rollout.checkpoint_engine.update_weights_bucket_megabytes",
    f"{AR}.rollout.log_prob_micro_batch_size_per_gpu", f"{AR}.rollout.log_prob_use_dynamic_bsz",
    f"{AR}.rollout.log_prob_max_token_len_per_gpu",
    f"{AR}.ref.log_prob_micro_batch_size_per_gpu", f"{AR}.ref.log_prob_use_dynamic_bsz",
    f"{AR}.ref.log_prob_max_token_len_per_gpu",
    "critic.model.path", "critic.model.enable_gradient_checkpointing", "critic.fsdp.param_offload",
    "critic.fsdp.optimizer_offload", "critic.fsdp.offload_policy", "critic.fsdp.fsdp_size", "critic.fsdp.model_dtype",
    "critic.ppo_micro_batch_size_per_gpu", "critic.forward_micro_batch_size_per_gpu", "critic.use_dynamic_bsz",
    "critic.ppo_max_token_len_per_gpu", "critic.forward_max_token_len_per_gpu", "critic.ulysses_sequence_parallel_size",
)
# Bytes per (token, vocabulary entry) of the logits of one micro-batch (verl computes them for every token of the
# packed micro-batch, ``FSDPEngineWithLMHead``). Training: the bf16 LM-head output (transformers 5 does not upcast
# it) and its copy divided by the temperature, 2 B each, then in backward the bf16 gradients of both (2 + 2 B); the
# log-prob gather itself is flash-attn's Triton cross-entropy or verl's row-by-row log-softmax, both without a full
# fp32 copy. +4 B when the entropy is computed with grad (``calculate_entropy`` / ``entropy_coeff``): its softmax and
# product. A no-grad log-prob pass: the logits, the scaled copy and the entropy verl logs (+2 B). Counted from the
# code path, not fitted: ``make gpu-check`` compares the estimate with the measured peak.
VERL_LOGITS_BYTES_TRAIN = 8
VERL_LOGITS_BYTES_ENTROPY = 4
VERL_LOGITS_BYTES_INFER = 6
# What a sleeping vLLM server keeps on its GPU (free_cache_engine: sleep level 2 frees weights and KV cache): its
# CUDA context, NCCL and, without enforce_eager, the CUDA-graph pool. Not measured yet: a rough figure.
VLLM_SLEEPING_BYTES = int(1.0 * GiB)
VLLM_SLEEPING_EAGER_BYTES = int(0.6 * GiB)
# config.json numbers of hub models verl's examples use, so that a space naming one is estimated without a download
# (from the hub's config.json; a local directory or the Hugging Face cache is read first).
KNOWN_HUB_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-0.5B-Instruct": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
        "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16"},
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


def _tokens(values: Mapping[str, Any], dyn_key: str, budget_key: str, micro_key: str, length: int,
            sp: int) -> tuple[int, str, str]:
    """Tokens of one micro-batch on one GPU and the key that sets it: with dynamic batching verl packs sequences up
    to the token budget per GPU; else ``micro x (prompt + response)`` (the worst case: every sequence at full
    length), divided over the Ulysses sequence-parallel group."""
    if values.get(dyn_key):
        budget = int(values.get(budget_key) or length)
        return budget, f"{budget} tokens ({budget_key.rsplit('.', 1)[1]}, use_dynamic_bsz)", budget_key
    micro = values.get(micro_key)
    if micro is None:
        raise ConfigError(f"{micro_key}=null without dynamic batching: no micro-batch to estimate")
    return (-(-int(micro) * length // sp), f"micro {micro} x {length} tokens" + (f" / sp {sp}" if sp > 1 else ""),
            micro_key)


def estimate_verl(values: Mapping[str, Any], *, use_critic: bool, use_ref: bool,
                  model_config: dict[str, Any] | None = None, critic_config: dict[str, Any] | None = None,
                  gpu_total_bytes: int | None = None) -> MemoryEstimate:
    """Per-GPU peak of ``python -m verl.trainer.main_ppo`` (verl 0.9.1, FSDP engine, hybrid actor + vLLM rollout on
    the same GPUs) from the values of :data:`VERL_MEMORY_KEYS` in its composed config.

    ``use_critic`` / ``use_ref``: verl's ``need_critic`` / ``need_reference_policy`` of the config.
    ``model_config`` / ``critic_config``: ``config.json`` dicts (default: :func:`read_hub_or_local_config` of the
    model paths). ``gpu_total_bytes``: the GPU's total memory, for vLLM's fraction (default nvidia-smi, else 80 GiB).

    The mapping (what each phase holds on one GPU, ``W = trainer.n_gpus_per_node x trainer.nnodes`` FSDP ranks,
    or ``fsdp_size`` when smaller):

    * actor: fp32 master parameters (``fsdp_config.model_dtype``), fp32 gradients and AdamW's two fp32 moments,
      each divided by W (FSDP full sharding). ``param_offload`` keeps the parameters on the CPU outside the passes
      that load them (log-probs, update); ``optimizer_offload`` the AdamW moments outside the update; gradients
      exist only inside the update (verl zeroes them when it leaves train mode); ``offload_policy`` with
      ``strategy: fsdp2`` keeps all three on the CPU. Compute runs in bf16 (``mixed_precision.param_dtype``):
      an FSDP forward unsharding the root unit (embedding, LM head) and two decoder layers at a time;
    * reference (``use_ref``): a forward-only engine, which verl always builds with FSDP's CPU offload: only the
      unsharded units of its forward are on the GPU, as for the actor;
    * update_actor: activations of one micro-batch (``ppo_micro_batch_size_per_gpu x (prompt + response)`` tokens,
      or ``ppo_max_token_len_per_gpu`` with ``use_dynamic_bsz``; bf16, per token as :class:`ModelShape` counts them,
      with gradient checkpointing when enabled) and its logits (:data:`VERL_LOGITS_BYTES_TRAIN` per token and
      vocabulary entry; none with ``use_fused_kernels``). Every sequence is counted at full length
      (``max_prompt_length + max_response_length``): verl packs the real tokens (``use_remove_padding``), so
      short prompts and responses use less and the estimate is a worst case;
    * log_prob: old log-probs (``rollout.log_prob_*``) and reference log-probs (``ref.log_prob_*``), one at a time:
      one layer's activations and the logits of the larger micro-batch; the critic's value pass;
    * rollout: vLLM reserves ``gpu_memory_utilization`` of the GPU's *total* memory (weights, KV cache, CUDA
      graphs) while it generates; with ``free_cache_engine`` it sleeps otherwise (level 2: weights and KV cache
      freed, :data:`VLLM_SLEEPING_BYTES` left), without it the reservation is there in every phase. The training
      state that is not offloaded stays beside it, plus one weight-sync bucket
      (``checkpoint_engine.update_weights_bucket_megabytes``, at most the bf16 model);
    * critic (``use_critic``, GAE): its own worker with the same rules (``critic.fsdp.*``, a value head, no logits);
    * each worker process holds a CUDA context (:data:`CUDA_BASELINE_BYTES`).

    Not estimated: Ray's and NCCL's own buffers (NCCL adds a few hundred MiB per process with W > 1), allocator
    fragmentation beyond the baselines, tensor-parallel vLLM's split of weights (its share is a fraction anyway),
    the reward-model and distillation workers, LoRA, Megatron, multimodal inputs, sequences longer than
    ``max_prompt_length + max_response_length`` (multi-turn). The check is "training peak + rollout reservation
    fits": with vLLM's fraction a fixed slice of the device, its KV cache grows into whatever is reserved.
    """
    v = dict(values)
    shape = ModelShape.from_config(model_config or read_hub_or_local_config(v.get(f"{AR}.model.path"),
                                                                           f"{AR}.model.path"), f"{AR}.model.path")
    world = int(v.get("trainer.n_gpus_per_node") or 1) * int(v.get("trainer.nnodes") or 1)
    P, R = int(v["data.max_prompt_length"]), int(v["data.max_response_length"])
    L = P + R
    V, H, I_ = shape.vocab_size, shape.hidden_size, shape.intermediate_size
    comps: list[Component] = []

    def add(name: str, n_bytes: float, phase: str, formula: str, key: str | None = None, process: str = "actor",
            allocated: bool = True) -> None:
        comps.append(Component(name, int(n_bytes), phase, formula, key, process, allocated))

    def shards(fsdp_size: Any) -> int:
        size = int(fsdp_size) if fsdp_size not in (None, -1) else world
        return max(1, min(size, world))

    # -- actor (and reference) worker
    fc = f"{AR}.actor.fsdp_config"
    W = shards(v.get(f"{fc}.fsdp_size"))
    master_b = _dtype_bytes(v.get(f"{fc}.model_dtype") or "fp32")
    compute_b = _dtype_bytes(v.get(f"{fc}.mixed_precision.param_dtype") or "bf16", 2)
    fsdp2_offload = bool(v.get(f"{fc}.offload_policy")) and v.get(f"{AR}.actor.strategy") == "fsdp2"
    off_p, off_o = bool(v.get(f"{fc}.param_offload")), bool(v.get(f"{fc}.optimizer_offload"))
    pa = shape.causal_lm_params()
    add("CUDA context (actor/ref worker)", CUDA_BASELINE_BYTES, "persistent",
        "CUDA context + allocator slack of the worker process", process="actor", allocated=False)
    shard = f"{_m(pa)} params x {{}} B / {W} GPU(s)"
    if fsdp2_offload:
        add("actor state on CPU (fsdp2 offload_policy)", 0, "persistent", "params, grads, AdamW on the CPU",
            f"{fc}.offload_policy")
    else:
        params = pa * master_b / W
        if off_p:
            for phase in ("log_prob", "update_actor"):
                add("actor params (loaded from CPU)", params, phase, shard.format(master_b), f"{fc}.param_offload")
        else:
            add("actor params", params, "persistent", shard.format(master_b), f"{fc}.param_offload")
        add("actor gradients", params, "update_actor", shard.format(master_b) + " (only inside the update)")
        optim = pa * 2 * master_b / W
        if off_o:
            add("actor AdamW states (loaded from CPU)", optim, "update_actor", shard.format(f"2 x {master_b}"),
                f"{fc}.optimizer_offload")
        else:
            add("actor AdamW states", optim, "persistent", shard.format(f"2 x {master_b}"), f"{fc}.optimizer_offload")
    unit = (V * H * (1 if shape.tie_word_embeddings else 2) + 2 * shape.layer_params()) * compute_b
    for phase in ("log_prob", "update_actor"):
        add("unsharded compute copy", unit, phase,
            f"root unit (embedding{'' if shape.tie_word_embeddings else ' + LM head'}) + 2 layers x {compute_b} B")

    sp = int(v.get(f"{AR}.actor.ulysses_sequence_parallel_size") or 1)
    fused = bool(v.get(f"{AR}.model.use_fused_kernels"))
    ckpt = bool(v.get(f"{AR}.model.enable_gradient_checkpointing"))
    tok, tok_what, tok_key = _tokens(v, f"{AR}.actor.use_dynamic_bsz", f"{AR}.actor.ppo_max_token_len_per_gpu",
                                     f"{AR}.actor.ppo_micro_batch_size_per_gpu", L, sp)
    per_tok = 2 * shape.activation_elems_per_token(ckpt)
    add("actor activations", tok * per_tok, "update_actor",
        f"{tok_what} x {per_tok / 1e6:.3g} MB/token ({'checkpointed' if ckpt else 'all layers'}, bf16)", tok_key)
    entropy = bool(v.get(f"{AR}.actor.calculate_entropy")) or float(v.get(f"{AR}.actor.entropy_coeff") or 0) != 0
    per_logit = VERL_LOGITS_BYTES_TRAIN + (VERL_LOGITS_BYTES_ENTROPY if entropy else 0)
    add("actor logits", 0 if fused else tok * V * per_logit, "update_actor",
        "use_fused_kernels: not materialized" if fused else
        f"{tok_what} x {V} vocab x {per_logit} B{' (with entropy)' if entropy else ''}", tok_key)

    passes = [_tokens(v, f"{AR}.rollout.log_prob_use_dynamic_bsz", f"{AR}.rollout.log_prob_max_token_len_per_gpu",
                      f"{AR}.rollout.log_prob_micro_batch_size_per_gpu", L, sp)]
    if use_ref:
        passes.append(_tokens(v, f"{AR}.ref.log_prob_use_dynamic_bsz", f"{AR}.ref.log_prob_max_token_len_per_gpu",
                              f"{AR}.ref.log_prob_micro_batch_size_per_gpu", L, sp))
    lp_tok, lp_what, lp_key = max(passes, key=lambda t: t[0])
    add("log-prob layer activations", lp_tok * (4 * H + 4 * I_) * 2, "log_prob",
        f"{lp_what} x (4H + 4I) x 2 B (one layer at a time)", lp_key)
    add("log-prob logits", 0 if fused else lp_tok * V * VERL_LOGITS_BYTES_INFER, "log_prob",
        "use_fused_kernels: not materialized" if fused else f"{lp_what} x {V} vocab x {VERL_LOGITS_BYTES_INFER} B",
        lp_key)

    # -- rollout engine on the same GPU
    r = f"{AR}.rollout"
    if v.get(f"{r}.name") in ("vllm", "sglang"):
        total_gpu = gpu_total_bytes or _gpu_total() or 80 * GiB
        util = float(v.get(f"{r}.gpu_memory_utilization") or 0.5)
        reserve = int(util * total_gpu)
        what = f"gpu_memory_utilization {util} x {fmt_gib(total_gpu)} GiB"
        if v.get(f"{r}.free_cache_engine", True):
            asleep = min(reserve, VLLM_SLEEPING_EAGER_BYTES if v.get(f"{r}.enforce_eager") else VLLM_SLEEPING_BYTES)
            add(f"{v[f'{r}.name']} server asleep", asleep, "persistent",
                "CUDA context" + ("" if v.get(f"{r}.enforce_eager") else " + CUDA graphs") + " (rough)",
                f"{r}.enforce_eager", "vllm", False)
            add(f"{v[f'{r}.name']} reservation (weights + KV cache)", reserve - asleep, "rollout",
                what + " while generating (free_cache_engine: asleep otherwise)", f"{r}.gpu_memory_utilization",
                "vllm", False)
        else:
            add(f"{v[f'{r}.name']} reservation (weights + KV cache)", reserve, "persistent",
                what + " (free_cache_engine=false: held in every phase)", f"{r}.gpu_memory_utilization", "vllm", False)
        bucket = int(v.get(f"{r}.checkpoint_engine.update_weights_bucket_megabytes") or 512) * MiB
        add("weight-sync bucket", min(bucket, pa * 2), "rollout", f"min(bucket {fmt_gib(bucket)} GiB, bf16 model)",
            f"{r}.checkpoint_engine.update_weights_bucket_megabytes")

    # -- critic worker (GAE)
    if use_critic:
        cpath = v.get("critic.model.path")
        if critic_config is None and cpath and cpath != v.get(f"{AR}.model.path"):
            critic_config = read_hub_or_local_config(cpath, "critic.model.path")
        cshape = ModelShape.from_config(critic_config, "critic.model.path") if critic_config else shape
        Wc = shards(v.get("critic.fsdp.fsdp_size"))
        cb = _dtype_bytes(v.get("critic.fsdp.model_dtype") or "fp32")
        pc = cshape.value_model_params()
        cshard = f"{_m(pc)} params x {{}} B / {Wc} GPU(s)"
        add("CUDA context (critic worker)", CUDA_BASELINE_BYTES, "persistent", "CUDA context of the worker process",
            process="critic", allocated=False)
        c_off = v.get("critic.strategy") == "fsdp2" and bool(v.get("critic.fsdp.offload_policy"))
        if not c_off:
            if v.get("critic.fsdp.param_offload"):
                for phase in ("log_prob", "update_critic"):
                    add("critic params (loaded from CPU)", pc * cb / Wc, phase, cshard.format(cb),
                        "critic.fsdp.param_offload", "critic")
            else:
                add("critic params", pc * cb / Wc, "persistent", cshard.format(cb), "critic.fsdp.param_offload",
                    "critic")
            add("critic gradients", pc * cb / Wc, "update_critic", cshard.format(cb), None, "critic")
            add("critic AdamW states", pc * 2 * cb / Wc, "persistent" if not v.get("critic.fsdp.optimizer_offload")
                else "update_critic", cshard.format(f"2 x {cb}"), "critic.fsdp.optimizer_offload", "critic")
        csp = int(v.get("critic.ulysses_sequence_parallel_size") or 1)
        ctok, cwhat, ckey = _tokens(v, "critic.use_dynamic_bsz", "critic.ppo_max_token_len_per_gpu",
                                    "critic.ppo_micro_batch_size_per_gpu", L, csp)
        cckpt = bool(v.get("critic.model.enable_gradient_checkpointing"))
        cper = 2 * cshape.activation_elems_per_token(cckpt)
        add("critic activations", ctok * cper, "update_critic",
            f"{cwhat} x {cper / 1e6:.3g} MB/token ({'checkpointed' if cckpt else 'all layers'}, bf16)", ckey, "critic")
        ftok, fwhat, fkey = _tokens(v, "critic.use_dynamic_bsz", "critic.forward_max_token_len_per_gpu",
                                    "critic.forward_micro_batch_size_per_gpu", L, csp)
        add("critic value pass activations", ftok * (4 * cshape.hidden_size + 4 * cshape.intermediate_size) * 2,
            "log_prob", f"{fwhat} x (4H + 4I) x 2 B (one layer at a time)", fkey, "critic")
    return MemoryEstimate(tuple(comps), "cuda")
