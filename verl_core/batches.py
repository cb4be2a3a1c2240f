"""One step's batch outside the models: building it from prompts and responses, scoring it, the ``adv`` stage
(KL-in-reward, dynamic gamma, GAE / GRPO advantages, the KL-threshold mask) and the step's data metrics (verl's
``compute_data_metrics``). The math itself is :mod:`verl_core.algos`; the stages' order is
:class:`verl_core.trainer.PPOTrainer`'s."""

from __future__ import annotations

from collections import deque
from typing import Any

import psutil
import torch

from verl_core import algos
from verl_core.config import Config
from verl_core.data import Example, PromptBatch, collate
from verl_core.gpu_metrics import gpu_utilization
from verl_core.rollout import response_mask
from verl_core.workers import Batch


class Sequences:
    """Turns dataset rows into a prompt batch, prompts + responses into a sequence batch, and scores responses."""

    def __init__(self, tokenizer: Any, pad_id: int, eos_id: int, device: torch.device, reward_fn: Any) -> None:
        self.tokenizer = tokenizer
        self.pad_id = pad_id
        self.eos_id = eos_id
        self.device = device
        self.reward_fn = reward_fn

    def prompts(self, indices: list[int], data: list[Example]) -> PromptBatch:
        pb = collate([data[i] for i in indices], indices, self.pad_id)
        pb.input_ids, pb.attention_mask = pb.input_ids.to(self.device), pb.attention_mask.to(self.device)
        return pb

    def sequences(self, pb: PromptBatch, responses: torch.Tensor, n: int) -> Batch:
        """Each prompt's ``n`` responses after it: ids, masks, positions (B*n, P+R); ``response_mask`` (B*n, R)."""
        p_ids = pb.input_ids.repeat_interleave(n, 0)
        p_mask = pb.attention_mask.repeat_interleave(n, 0)
        r_mask = response_mask(responses, self.eos_id)
        attn = torch.cat([p_mask, r_mask], dim=1)
        return {
            "input_ids": torch.cat([p_ids, responses], dim=1),
            "attention_mask": attn,
            "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
            "responses": responses,
            "response_mask": r_mask.float(),
        }

    def decode(self, responses: torch.Tensor, mask: torch.Tensor) -> list[str]:
        return [self.tokenizer.decode(r[m.bool()].tolist(), skip_special_tokens=True)
                for r, m in zip(responses.cpu(), mask.cpu())]

    def score(self, pb: PromptBatch, texts: list[str] | None, n: int, batch: Batch) -> torch.Tensor:
        """Sequence scores (B,); ``texts=None`` decodes them here unless the reward reads token ids."""
        examples = [e for e in pb.examples for _ in range(n)]
        prompts = [e.prompt_text for e in examples]
        if texts is None:
            texts = [] if self.reward_fn.on_token_ids else self.decode(batch["responses"], batch["response_mask"])
        scores = self.reward_fn(texts, examples, prompts, batch=batch)
        return torch.tensor(scores, dtype=torch.float32, device=self.device)


def compute_advantages(cfg: Config, batch: Batch, pb: PromptBatch, raw_scores: torch.Tensor, kl_ctrl: Any,
                       reward_vars: deque[float]) -> dict[str, float]:
    """The ``adv`` stage: fills ``token_level_rewards``, ``advantages``, ``returns`` and ``pg_mask`` of ``batch``
    (B, R); ``reward_vars`` is dynamic gamma's window of reward variances (appended to)."""
    alg, mask = cfg.algorithm, batch["response_mask"]
    metrics: dict[str, float] = {}
    if alg.use_kl_in_reward:
        batch["token_level_rewards"], kl_metrics = algos.apply_kl_penalty(
            batch["token_level_scores"], batch["old_log_probs"], batch["ref_log_probs"], mask, kl_ctrl,
            alg.kl_penalty)
        metrics.update(kl_metrics)
    else:
        batch["token_level_rewards"] = batch["token_level_scores"]
    gamma = alg.gamma
    if alg.dynamic_gamma.enable:
        reward_vars.append(float(raw_scores.var(unbiased=False)))
        dg = alg.dynamic_gamma
        gamma = algos.dynamic_gamma(alg.gamma, dg.min_gamma, sum(reward_vars) / len(reward_vars), dg.var_threshold)
    metrics["algorithm/gamma"] = gamma
    if alg.adv_estimator == "gae":
        adv, ret = algos.compute_gae_advantage_return(batch["token_level_rewards"], batch["values"], mask, gamma,
                                                      alg.lam)
    else:
        uids = [u for u in pb.uids for _ in range(cfg.actor_rollout_ref.rollout.n)]
        adv, ret = algos.compute_grpo_outcome_advantage(batch["token_level_rewards"], mask, uids,
                                                        norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo)
    batch["advantages"], batch["returns"] = adv, ret
    threshold = cfg.actor_rollout_ref.actor.kl_threshold
    if threshold is not None:
        kl = algos.kl_penalty(batch["old_log_probs"], batch["ref_log_probs"], cfg.actor_rollout_ref.actor.kl_loss_type)
        batch["pg_mask"] = algos.kl_threshold_mask(kl, mask, threshold)
        metrics["actor/kl_filtered_frac"] = 1.0 - float(batch["pg_mask"].sum() / mask.sum().clamp(min=1))
    else:
        batch["pg_mask"] = mask
    return metrics


def _stats(prefix: str, x: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, float]:
    v = x[mask.bool()] if mask is not None else x.flatten()
    if v.numel() == 0:
        return {f"{prefix}/mean": 0.0, f"{prefix}/max": 0.0, f"{prefix}/min": 0.0}
    return {f"{prefix}/mean": float(v.float().mean()), f"{prefix}/max": float(v.max()), f"{prefix}/min": float(v.min())}


def data_metrics(cfg: Config, batch: Batch, pb: PromptBatch, raw: torch.Tensor, step_time: float,
                 cuda: bool) -> dict[str, Any]:
    """Scores, rewards, advantages, returns, values, lengths and throughput of one step (names as verl's)."""
    mask = batch["response_mask"]
    resp_len = mask.sum(-1)
    prompt_len = pb.attention_mask.sum(-1).float()
    seq_rewards = batch["token_level_rewards"].sum(-1)
    m: dict[str, Any] = {}
    m.update(_stats("critic/score", batch["token_level_scores"].sum(-1)))
    m.update(_stats("critic/rewards", seq_rewards))
    m.update(_stats("critic/advantages", batch["advantages"], mask))
    m.update(_stats("critic/returns", batch["returns"], mask))
    m["critic/raw_score/mean"] = float(raw.mean())
    if "values" in batch:
        m.update(_stats("critic/values", batch["values"], mask))
        ret, val = batch["returns"][mask.bool()], batch["values"][mask.bool()]
        var_ret = float(ret.var(unbiased=False)) if ret.numel() > 1 else 0.0
        m["critic/vf_explained_var"] = 1.0 - float((ret - val).var(unbiased=False)) / (var_ret + 1e-5)
    m.update(_stats("response_length", resp_len))
    m["response_length/clip_ratio"] = float((resp_len >= batch["responses"].shape[1]).float().mean()) \
        if batch["responses"].shape[1] >= cfg.data.max_response_length else 0.0
    m.update(_stats("prompt_length", prompt_len))
    n_tokens = int(resp_len.sum() + prompt_len.sum() * cfg.actor_rollout_ref.rollout.n)
    m["perf/total_num_tokens"] = n_tokens
    m["perf/time_per_step"] = step_time
    m["perf/throughput"] = n_tokens / max(step_time, 1e-9)
    m["perf/cpu_memory_used_gb"] = psutil.Process().memory_info().rss / 1024**3
    if cuda:
        m["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / 1024**3
        m.update(gpu_utilization(0))  # perf/gpu_util, perf/gpu_mem_util, perf/gpu_memory_used_gb ({} w/o NVML)
    return m
