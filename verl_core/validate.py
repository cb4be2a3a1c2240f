"""``python -m verl_core validate``: will this config run, and will it fit? Answered without torch.

Checks, in order (the first hard failure is one ``error: ...`` line and exit code 2):

1. everything :func:`verl_core.config.load_config` checks (keys, types, choices, batch arithmetic);
2. device bounds: GPUs needed (1, or ``rollout.tensor_model_parallel_size`` for vLLM) vs visible
   (``nvidia-smi``), and the tensor-parallel size divides the model's attention and KV heads;
3. best-practice warnings (printed, not fatal), from verl's performance-tuning guide and PPO practice:
   rollout batch below twice the PPO mini-batch, ``ppo_epochs > 1`` with a large learning rate, more than
   4 gradient-accumulation micro-batches, and responses often clipped at ``max_response_length`` in a
   past run's metrics file (``response_length/clip_ratio``);
4. the memory estimate of :mod:`verl_core.memory` by component against what is available (free GPU
   memory, else RAM, the cgroup limit or ``--memory-limit-gb``): ``All checks passed`` or one line naming
   the component that takes the total past the budget.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from verl_core import memory
from verl_core.config import Config, ConfigError, derive_sizes

# ppo_epochs > 1 re-uses each rollout; above this actor lr the later epochs drift far from the sampling policy
LARGE_LR_WITH_EPOCHS = 1e-5
MAX_GRAD_ACCUM = 4
# warn when the mean response_length/clip_ratio of a past run exceeds this
CLIP_RATIO_WARN = 0.1


@dataclass
class Report:
    """What :func:`check` found: warnings, the estimate and the budget, and the one fatal problem if any."""

    device: str
    warnings: list[str] = field(default_factory=list)
    estimate: memory.MemoryEstimate | None = None
    available: memory.Available | None = None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


def device_checks(cfg: Config, model_config: dict[str, object], device: str, gpus_visible: int,
                  planning: bool = False) -> None:
    """GPUs needed vs visible, and tensor-parallel size vs heads; raises :class:`ConfigError`. ``planning``
    (an explicit ``--device cuda`` on a machine without GPUs) skips the visibility check."""
    r = cfg.actor_rollout_ref.rollout
    tp = r.tensor_model_parallel_size
    key = "actor_rollout_ref.rollout.tensor_model_parallel_size"
    if tp < 1:
        raise ConfigError(f"{key}={tp} must be positive")
    shape = memory.ModelShape.from_config(dict(model_config), "actor_rollout_ref.model.path")
    if shape.num_heads % tp:
        raise ConfigError(f"{key}={tp} does not divide the model's num_attention_heads={shape.num_heads}")
    kv = shape.num_kv_heads
    if (kv % tp) if tp <= kv else (tp % kv):
        raise ConfigError(f"{key}={tp} and the model's num_key_value_heads={kv}: one must divide the other")
    if cfg.trainer.device == "cuda" and gpus_visible == 0:
        raise ConfigError("trainer.device='cuda' but no GPU is visible (nvidia-smi lists none; "
                          "CUDA_VISIBLE_DEVICES?)")
    needed = tp if r.name == "vllm" else 1
    if device == "cuda" and needed > gpus_visible and (gpus_visible or not planning):
        raise ConfigError(f"the run needs {needed} GPU(s) ({key}={tp}, rollout.name={r.name}) but "
                          f"{gpus_visible} are visible")
    if device == "cpu" and r.name == "vllm" and tp > 1:
        raise ConfigError(f"{key}={tp}: tensor parallelism needs GPUs (the run is on CPU)")


def best_practice_warnings(cfg: Config, metrics_file: Path | None = None) -> list[str]:
    """Advice that does not stop a run (each a one-line string)."""
    out: list[str] = []
    a = cfg.actor_rollout_ref.actor
    sizes = derive_sizes(cfg)
    if cfg.data.train_batch_size < 2 * a.ppo_mini_batch_size:
        out.append(f"data.train_batch_size={cfg.data.train_batch_size} is below twice "
                   f"actor.ppo_mini_batch_size={a.ppo_mini_batch_size}: {sizes.actor_num_mini} optimizer step(s) per "
                   "rollout; verl's tuning guide keeps the rollout batch >= 2 x the mini-batch")
    if a.ppo_epochs > 1 and a.optim.lr > LARGE_LR_WITH_EPOCHS:
        out.append(f"actor.ppo_epochs={a.ppo_epochs} with actor.optim.lr={a.optim.lr:g} (> {LARGE_LR_WITH_EPOCHS:g}): "
                   "later epochs drift from the rollout policy; watch actor/ppo_kl and actor/pg_clipfrac")
    if sizes.actor_grad_accum > MAX_GRAD_ACCUM:
        out.append(f"{sizes.actor_grad_accum} gradient-accumulation micro-batches per optimizer step "
                   f"(mini-batch {sizes.actor_mini_samples} samples / micro {sizes.actor_micro_samples}): raise "
                   "actor.ppo_micro_batch_size_per_gpu if memory allows (fewer, larger passes are faster)")
    if metrics_file is not None:
        mean, steps = clip_ratio(metrics_file)
        if steps and mean > CLIP_RATIO_WARN:
            out.append(f"response_length/clip_ratio averaged {mean:.0%} over {steps} steps of {metrics_file}: "
                       f"responses are cut at data.max_response_length={cfg.data.max_response_length}; raise it")
    return out


def clip_ratio(metrics_file: Path) -> tuple[float, int]:
    """Mean ``response_length/clip_ratio`` over the steps of a JSONL metrics file and the number of steps."""
    try:
        lines = metrics_file.read_text().splitlines()
    except OSError as err:
        raise ConfigError(f"--metrics {metrics_file}: cannot read ({err.strerror})") from None
    values = []
    for line in lines:
        try:
            data = json.loads(line).get("data", {})
        except (ValueError, AttributeError):
            continue
        v = data.get("response_length/clip_ratio") if isinstance(data, dict) else None
        if isinstance(v, (int, float)) and math.isfinite(v):
            values.append(float(v))
    return (sum(values) / len(values) if values else 0.0), len(values)


def check(cfg: Config, *, metrics_file: Path | None = None, memory_limit_gb: float | None = None,
          device: str | None = None) -> Report:
    """Run checks 2-4 on a loaded config; raises :class:`ConfigError` for a hard failure of 2."""
    gpus = memory.gpu_memory()
    dev = device or ("cuda" if cfg.trainer.device == "auto" and gpus else
                     "cpu" if cfg.trainer.device == "auto" else cfg.trainer.device)
    planning = device == "cuda" and not gpus  # estimating for a GPU this machine does not have
    if planning and memory_limit_gb is None:
        raise ConfigError("--device cuda: no GPU is visible here, so give the GPU's memory with --memory-limit-gb")
    model_config = memory.read_model_config(cfg.actor_rollout_ref.model.path, "actor_rollout_ref.model.path")
    device_checks(cfg, model_config, dev, len(gpus), planning)
    report = Report(dev, best_practice_warnings(cfg, metrics_file))
    report.estimate = memory.estimate(cfg, model_config, device=dev,
                                      gpu_total_bytes=gpus[0][1] if gpus else None)
    report.available = memory.available_bytes(dev, memory_limit_gb)
    report.problem = report.estimate.not_fitting(report.available.bytes)
    return report
