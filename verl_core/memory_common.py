"""What the trainer's memory estimate (:mod:`verl_core.memory`) is built from: a model's shape from its
``config.json``, the estimate's table, and what is available on the device. Pure arithmetic: no torch, no
transformers, no weights.

* :class:`ModelShape`: parameter, activation and KV-cache counts of a decoder-only transformer;
* :func:`read_model_config`: a model directory's (or a builtin model's) ``config.json``;
* :class:`Component` / :class:`MemoryEstimate`: the lines of an estimate, persistent or belonging to a phase, and
  their peak (persistent + the largest phase);
* :func:`gpu_memory` / :func:`available_bytes`: free GPU memory (nvidia-smi), available RAM, cgroup limit.

The driver's estimates of other trainers (real verl's: ``hpo/backends/verl/_memory_model.py``) use the driver's
copy of the shape and the table, ``hpo/backends/_shapes.py``: ``verl_core`` runs without the driver and imports
nothing of it. ``tests/hpo/backends/test_shapes.py`` holds the two copies to the same numbers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_core.config import ConfigError

GiB = 1024**3
MiB = 1024**2

DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
               "float64": 8, "int8": 1, "auto": 4}


# CUDA context, cuBLAS workspaces and the caching allocator's slack: held by the process on the GPU but not
# counted by torch.cuda.max_memory_allocated (compare that with MemoryEstimate.allocated_total).
CUDA_BASELINE_BYTES = int(0.75 * GiB)


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

    def lora_params(self, rank: int) -> int:
        """LoRA adapters of rank ``r`` on every linear layer of the decoder (``target_modules: all-linear``):
        ``r (in + out)`` for q, k, v, o and, per expert, gate, up, down."""
        h, hq, hkv, i = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, \
            self.intermediate_size
        per_layer = (h + hq) + 2 * (h + hkv) + (hq + h) + 3 * (h + i) * self.num_experts
        return self.num_layers * rank * per_layer

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

    Builtin names (``builtin:tiny_arith`` and its sizes, ``builtin:smollm2``) are answered from their recipes even
    before they are built; a directory must hold ``config.json``.
    """
    if path is None:
        raise ConfigError(f"{key}=None: no model path")
    from verl_core.tiny_model import FAMILY, tiny_config

    if path.startswith("builtin:") and path.removeprefix("builtin:") in FAMILY:
        return tiny_config(path.removeprefix("builtin:"))
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


# verl_core's trainer phases (real verl's are hpo.backends.verl._memory_model.VERL_PHASES)
PHASES = ("rollout", "log_prob", "update_critic", "update_actor")


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-device peak estimate: persistent components plus the largest transient phase (``phases``, in the order
    the run goes through them)."""

    components: tuple[Component, ...]
    device: str  # "cpu" or "cuda"
    phases: tuple[str, ...] = field(default=PHASES)

    def phase_bytes(self) -> dict[str, int]:
        out = {p: 0 for p in self.phases}
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
        return base + max((sum(c.bytes for c in mine if c.phase == p) for p in self.phases),
                          default=0)

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
        for p in self.phases:
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
