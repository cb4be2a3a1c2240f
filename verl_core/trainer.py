"""The PPO/GRPO controller: one step is a short sequence of named, timed stages.

    gen -> reward -> old_log_prob -> ref -> values -> adv -> update_critic -> update_actor -> update_weights

(verl's ``RayPPOTrainer.fit`` in one process). ``old_log_prob`` is skipped when the update is on-policy
(one epoch, one mini-batch) and neither KL-in-reward nor the KL-threshold filter reads the old
log-probs first: the update's forward then supplies them. With ``rollout.reuse_log_probs`` the HF
engine's decode steps supply them instead (no stage). Each stage's wall time is logged as
``timing_s/<stage>``; all metric names follow verl (see README "Metrics").
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

from verl_core import algos
from verl_core.checkpoint import find_latest, load_checkpoint, save_checkpoint, truncate_metrics
from verl_core.config import Config, ConfigError, derive_sizes
from verl_core.data import Example, PromptBatch, PromptSampler, collate, load_examples
from verl_core.evaluators import build_text_evaluators, measure_latency
from verl_core.gpu_metrics import UtilizationSampler, gpu_utilization
from verl_core.rewards import build_reward, token_level_scores
from verl_core.rollout import SamplingParams, build_rollout, response_mask
from verl_core.tracking import Tracking, default_metrics_path
from verl_core.workers import Actor, Batch, Critic, Policy

STAGES = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor",
          "update_weights")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device='cuda' but no CUDA device is visible (CUDA_VISIBLE_DEVICES?)")
    return torch.device(name)


def resolve_model_path(path: str, key: str) -> str:
    """A local HF directory for ``path``; ``builtin:tiny_arith`` and ``builtin:smollm2`` are built (once, cached)."""
    if path == "builtin:tiny_arith":
        from verl_core.tiny_model import ensure_tiny_arith

        return str(ensure_tiny_arith())
    if path == "builtin:smollm2":
        from verl_core.pretrained import ensure_smollm2

        return str(ensure_smollm2())
    if path.startswith("builtin:"):
        raise ConfigError(f"{key}={path!r}: unknown built-in model (known: builtin:tiny_arith, builtin:smollm2)")
    if not (Path(path).expanduser() / "config.json").is_file():
        raise ConfigError(f"{key}={path!r}: not a local Hugging Face model directory (no config.json)")
    return str(Path(path).expanduser())


def resolve_data_path(path: str, key: str, split: str) -> str:
    """A parquet path for ``path``; ``builtin:<task>`` (see ``verl_core.tasks.BUILTIN``) is written once."""
    if path.startswith("builtin:"):
        from verl_core.tasks import ensure_builtin_data
        from verl_core.tiny_model import cache_root

        return str(ensure_builtin_data(path.removeprefix("builtin:"), cache_root(), key)[0 if split == "train" else 1])
    return path


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


class Timer:
    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self.times[f"timing_s/{name}"] = self.times.get(f"timing_s/{name}", 0.0) + time.perf_counter() - t0


def _stats(prefix: str, x: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, float]:
    v = x[mask.bool()] if mask is not None else x.flatten()
    if v.numel() == 0:
        return {f"{prefix}/mean": 0.0, f"{prefix}/max": 0.0, f"{prefix}/min": 0.0}
    return {f"{prefix}/mean": float(v.float().mean()), f"{prefix}/max": float(v.max()), f"{prefix}/min": float(v.min())}


def validation_metrics(scores: np.ndarray, sources: list[str]) -> dict[str, float]:
    """verl's per-source validation metrics (``process_validation_metrics`` in ``verl/trainer/ppo/metric_utils.py``)
    for ``scores`` (prompts, n), the n samples of each prompt, and each prompt's data source:

        val-core/<source>/reward/mean@n   mean over the source's prompts of the prompt's mean score
        val-aux/<source>/reward/std@n     mean over its prompts of the std (ddof 0) across the prompt's n samples
                                          (only when n > 1)

    Unlike ``eval/reward_std`` (the spread over all samples of all prompts), ``std@n`` is 0 when each prompt's
    samples agree, however much the prompts differ.
    """
    n = scores.shape[1]
    m: dict[str, float] = {}
    for src in sorted(set(sources)):
        rows = scores[[i for i, s in enumerate(sources) if s == src]]  # (prompts of src, n)
        m[f"val-core/{src}/reward/mean@{n}"] = float(rows.mean(axis=1).mean())
        if n > 1:
            m[f"val-aux/{src}/reward/std@{n}"] = float(rows.std(axis=1).mean())
    return m


class PPOTrainer:
    def __init__(self, cfg: Config, metrics_file: Path | None = None) -> None:
        self.cfg = cfg
        self.sizes = derive_sizes(cfg)
        if cfg.actor_rollout_ref.rollout.name == "vllm":  # fail before loading anything
            from verl_core.vllm_rollout import require_vllm

            require_vllm()
        if cfg.trainer.cpu_threads > 0:
            torch.set_num_threads(cfg.trainer.cpu_threads)
        self.device = resolve_device(cfg.trainer.device)
        self.cuda = self.device.type == "cuda"
        seed_everything(cfg.trainer.seed)
        arr = cfg.actor_rollout_ref
        model_path = resolve_model_path(arr.model.path, "actor_rollout_ref.model.path")
        self.tokenizer = self._load_tokenizer(model_path)
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.eos_id = int(self.tokenizer.eos_token_id)
        d = cfg.data
        self.train_data = load_examples(resolve_data_path(d.train_files, "data.train_files", "train"),
                                        "data.train_files", self.tokenizer, d.prompt_key, d.max_prompt_length)
        self.val_data = load_examples(resolve_data_path(d.val_files, "data.val_files", "val"), "data.val_files",
                                      self.tokenizer, d.prompt_key, d.max_prompt_length)[: d.val_max_samples]
        self.sampler = PromptSampler(len(self.train_data), d.train_batch_size, cfg.trainer.seed, d.shuffle)

        temp = arr.rollout.temperature
        self.actor = Actor(self._load_lm(model_path, train=True), arr.actor, temp, self.autocast)
        self.use_ref = cfg.algorithm.use_kl_in_reward or arr.actor.use_kl_loss or arr.actor.kl_threshold is not None
        self.ref = Policy(self._load_lm(model_path, train=False), temp, self.autocast) if self.use_ref else None
        # On-policy (one epoch, one mini-batch) the update's own forward gives the old log-probs and the
        # entropy, as in verl's actor; the separate pass is needed only when something reads them first.
        on_policy = arr.actor.ppo_epochs == 1 and self.sizes.actor_num_mini == 1
        self.recompute_old_log_prob = not (on_policy and not cfg.algorithm.use_kl_in_reward
                                           and arr.actor.kl_threshold is None)
        self.use_critic = cfg.algorithm.adv_estimator == "gae"
        self.critic = None
        if self.use_critic:
            critic_path = cfg.critic.model.path or model_path
            if critic_path != model_path:
                critic_path = resolve_model_path(critic_path, "critic.model.path")
            self.critic = Critic(self._load_critic(critic_path), cfg.critic, self.autocast)
        self.rollout = build_rollout(arr.rollout.name, self.actor.model, self.pad_id, self.eos_id, self.autocast,
                                     model_path=model_path, rollout_cfg=arr.rollout,
                                     max_prompt_length=d.max_prompt_length, max_response_length=d.max_response_length,
                                     seed=cfg.trainer.seed)
        self.reward_fn = build_reward(cfg, self.device, self.tokenizer)
        self.text_evaluators = build_text_evaluators(cfg.evaluation, self.device)
        kc = cfg.algorithm.kl_ctrl
        self.kl_ctrl = algos.get_kl_controller(kc.type, kc.kl_coef, kc.target_kl, kc.horizon)
        self.reward_vars: deque[float] = deque(maxlen=cfg.algorithm.dynamic_gamma.window)
        self.metrics_file = metrics_file or default_metrics_path(cfg.trainer.project_name, cfg.trainer.experiment_name)
        self.global_step = 0

    # ------------------------------------------------------------------ setup helpers
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.cuda:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _load_tokenizer(self, path: str) -> Any:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        tok.padding_side = "left"
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        if tok.eos_token_id is None:
            raise ConfigError(f"actor_rollout_ref.model.path={path!r}: the tokenizer has no EOS token")
        return tok

    def _load_lm(self, path: str, train: bool) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(self.device)
        if train and self.cfg.actor_rollout_ref.model.enable_gradient_checkpointing:
            model.gradient_checkpointing_enable()
        model.eval()  # dropout off throughout, as in verl (the actor's updates too: workers.disable_dropout)
        if not train:
            model.requires_grad_(False)
        return model  # type: ignore[no-any-return]

    def _load_critic(self, path: str) -> torch.nn.Module:
        from transformers import AutoConfig, AutoModelForTokenClassification

        config = AutoConfig.from_pretrained(path, num_labels=1)
        config.classifier_dropout = 0.0  # no dropout before the value head (HF's default is 0.1), as verl's critic
        model = AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=torch.float32)
        if self.cfg.actor_rollout_ref.model.enable_gradient_checkpointing:
            model.gradient_checkpointing_enable()
        return model.to(self.device).eval()  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ batch building
    def _prompt_batch(self, indices: list[int], data: list[Example]) -> PromptBatch:
        pb = collate([data[i] for i in indices], indices, self.pad_id)
        pb.input_ids, pb.attention_mask = pb.input_ids.to(self.device), pb.attention_mask.to(self.device)
        return pb

    def _sequence_batch(self, pb: PromptBatch, responses: torch.Tensor, n: int) -> Batch:
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

    def _decode(self, responses: torch.Tensor, mask: torch.Tensor) -> list[str]:
        return [self.tokenizer.decode(r[m.bool()].tolist(), skip_special_tokens=True)
                for r, m in zip(responses.cpu(), mask.cpu())]

    def _score(self, pb: PromptBatch, texts: list[str] | None, n: int, batch: Batch) -> torch.Tensor:
        """Sequence scores (B,); ``texts=None`` decodes them here unless the reward reads token ids."""
        examples = [e for e in pb.examples for _ in range(n)]
        prompts = [e.prompt_text for e in examples]
        if texts is None:
            texts = [] if self.reward_fn.on_token_ids else self._decode(batch["responses"], batch["response_mask"])
        scores = self.reward_fn(texts, examples, prompts, batch=batch)
        return torch.tensor(scores, dtype=torch.float32, device=self.device)

    # ------------------------------------------------------------------ one PPO step
    def train_step(self, step: int) -> dict[str, Any]:
        cfg, sizes, arr = self.cfg, self.sizes, self.cfg.actor_rollout_ref
        r = arr.rollout
        timer = Timer()
        t_step = time.perf_counter()
        torch.manual_seed(cfg.trainer.seed * 1_000_003 + step)  # rollout sampling: a pure function of (seed, step)
        gen = torch.Generator().manual_seed(cfg.trainer.seed * 7919 + step)  # mini-batch shuffling
        pb = self._prompt_batch(self.sampler.next_indices(), self.train_data)
        reuse = r.reuse_log_probs and self.recompute_old_log_prob
        params = SamplingParams(r.n, r.temperature, r.top_p, r.top_k, True, cfg.data.max_response_length, reuse)
        with timer("gen"):
            responses = self.rollout.generate(pb.input_ids, pb.attention_mask, params)
        rollout_log_probs = getattr(self.rollout, "last_log_probs", None) if reuse else None
        batch = self._sequence_batch(pb, responses, r.n)
        mask = batch["response_mask"]
        with timer("reward"):
            raw_scores = self._score(pb, None, r.n, batch)
            batch["token_level_scores"] = token_level_scores(raw_scores / cfg.reward_model.temperature, mask)
        metrics: dict[str, Any] = {}
        agg = arr.actor.loss_agg_mode  # actor/entropy is aggregated like the loss, as verl
        if rollout_log_probs is not None:  # reuse_log_probs: the decode steps' own log-probs, no forward
            batch["old_log_probs"] = rollout_log_probs * mask
            metrics["actor/entropy"] = float(algos.agg_loss(self.rollout.last_entropy, mask, agg))  # type: ignore
        elif self.recompute_old_log_prob:
            with timer("old_log_prob"):
                batch["old_log_probs"], entropy = self.actor.compute_log_prob(batch, sizes.log_prob_micro_samples)
            assert entropy is not None
            metrics["actor/entropy"] = float(algos.agg_loss(entropy, mask, agg))
        if self.ref is not None:
            with timer("ref"):
                batch["ref_log_probs"], _ = self.ref.compute_log_prob(batch, sizes.ref_micro_samples,
                                                                      with_entropy=False)
        if self.critic is not None:
            with timer("values"):
                batch["values"] = self.critic.compute_values(batch, sizes.critic_forward_micro_samples)
        with timer("adv"):
            metrics.update(self._advantages(batch, pb, raw_scores))
        if self.critic is not None:
            with timer("update_critic"):
                metrics.update(self.critic.update(batch, sizes.critic_mini_samples, sizes.critic_micro_samples,
                                                  sizes.critic_epochs, gen))
        with timer("update_actor"), UtilizationSampler(enabled=self.cuda) as util:
            metrics.update(self.actor.update(batch, sizes.actor_mini_samples, sizes.actor_micro_samples,
                                             arr.actor.ppo_epochs, gen))
        if util.mean() is not None:  # NVML: mean GPU utilization over the actor update (the guide's actor_gpu_util)
            metrics["perf/actor_gpu_util"] = util.mean()
        with timer("update_weights"):
            self.rollout.sync_weights(self.actor.model)
        sync_diff = getattr(self.rollout, "last_sync_logprob_diff", None)
        if sync_diff is not None:  # vLLM: |engine - trainer| log-prob gap on a probe after the sync
            metrics["rollout/sync_logprob_diff"] = float(sync_diff)
        timer.times["timing_s/step"] = time.perf_counter() - t_step
        metrics.update(timer.times)
        metrics.update(self._data_metrics(batch, pb, raw_scores, timer.times["timing_s/step"]))
        return metrics

    def _advantages(self, batch: Batch, pb: PromptBatch, raw_scores: torch.Tensor) -> dict[str, float]:
        alg, mask = self.cfg.algorithm, batch["response_mask"]
        metrics: dict[str, float] = {}
        if alg.use_kl_in_reward:
            batch["token_level_rewards"], kl_metrics = algos.apply_kl_penalty(
                batch["token_level_scores"], batch["old_log_probs"], batch["ref_log_probs"], mask, self.kl_ctrl,
                alg.kl_penalty)
            metrics.update(kl_metrics)
        else:
            batch["token_level_rewards"] = batch["token_level_scores"]
        gamma = alg.gamma
        if alg.dynamic_gamma.enable:
            self.reward_vars.append(float(raw_scores.var(unbiased=False)))
            dg = alg.dynamic_gamma
            gamma = algos.dynamic_gamma(alg.gamma, dg.min_gamma, sum(self.reward_vars) / len(self.reward_vars),
                                        dg.var_threshold)
        metrics["algorithm/gamma"] = gamma
        if alg.adv_estimator == "gae":
            adv, ret = algos.compute_gae_advantage_return(batch["token_level_rewards"], batch["values"], mask, gamma,
                                                          alg.lam)
        else:
            uids = [u for u in pb.uids for _ in range(self.cfg.actor_rollout_ref.rollout.n)]
            adv, ret = algos.compute_grpo_outcome_advantage(batch["token_level_rewards"], mask, uids,
                                                            norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo)
        batch["advantages"], batch["returns"] = adv, ret
        threshold = self.cfg.actor_rollout_ref.actor.kl_threshold
        if threshold is not None:
            kl = algos.kl_penalty(batch["old_log_probs"], batch["ref_log_probs"],
                                  self.cfg.actor_rollout_ref.actor.kl_loss_type)
            batch["pg_mask"] = algos.kl_threshold_mask(kl, mask, threshold)
            metrics["actor/kl_filtered_frac"] = 1.0 - float(batch["pg_mask"].sum() / mask.sum().clamp(min=1))
        else:
            batch["pg_mask"] = mask
        return metrics

    def _data_metrics(self, batch: Batch, pb: PromptBatch, raw: torch.Tensor, step_time: float) -> dict[str, Any]:
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
            if batch["responses"].shape[1] >= self.cfg.data.max_response_length else 0.0
        m.update(_stats("prompt_length", prompt_len))
        n_tokens = int(resp_len.sum() + prompt_len.sum() * self.cfg.actor_rollout_ref.rollout.n)
        m["perf/total_num_tokens"] = n_tokens
        m["perf/time_per_step"] = step_time
        m["perf/throughput"] = n_tokens / max(step_time, 1e-9)
        m["perf/cpu_memory_used_gb"] = psutil.Process().memory_info().rss / 1024**3
        if self.cuda:
            m["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / 1024**3
            m.update(gpu_utilization(0))  # perf/gpu_util, perf/gpu_mem_util, perf/gpu_memory_used_gb ({} w/o NVML)
        return m

    # ------------------------------------------------------------------ validation
    @torch.no_grad()
    def validate(self, step: int) -> dict[str, Any]:
        vk = self.cfg.actor_rollout_ref.rollout.val_kwargs
        params = SamplingParams(vk.n, vk.temperature, vk.top_p, vk.top_k, vk.do_sample,
                                self.cfg.data.max_response_length)
        bs = self.cfg.data.val_batch_size or len(self.val_data)
        scores: list[float] = []  # prompt i's vk.n samples at i*n .. i*n+n-1
        lengths: list[float] = []
        sources: list[str] = []  # one per prompt
        prompts: list[str] = []
        texts: list[str] = []
        examples: list[Example] = []
        t0 = time.perf_counter()
        with torch.random.fork_rng(devices=[self.device] if self.cuda else []):
            torch.manual_seed(self.cfg.trainer.seed * 31 + 17)  # the same validation draw at every evaluation
            for start in range(0, len(self.val_data), bs):
                pb = self._prompt_batch(list(range(start, min(start + bs, len(self.val_data)))), self.val_data)
                responses = self.rollout.generate(pb.input_ids, pb.attention_mask, params)
                batch = self._sequence_batch(pb, responses, vk.n)
                batch_texts = self._decode(batch["responses"], batch["response_mask"])
                scores += self._score(pb, batch_texts, vk.n, batch).tolist()
                lengths += batch["response_mask"].sum(-1).tolist()
                sources += [e.data_source for e in pb.examples]
                examples += [e for e in pb.examples for _ in range(vk.n)]
                texts += batch_texts
            prompts = [e.prompt_text for e in examples]
            extra: dict[str, float] = {}
            for evaluator in self.text_evaluators:
                extra.update(evaluator(prompts, texts, examples))
            if self.cfg.evaluation.latency.enable:
                extra.update(self._latency(params))
        arr = np.asarray(scores, dtype=np.float64)
        m: dict[str, Any] = {"eval/reward_mean": float(arr.mean()), "eval/reward_std": float(arr.std()),
                             "eval/response_length_mean": float(np.mean(lengths))}
        m.update(validation_metrics(arr.reshape(len(sources), vk.n), sources))
        m.update({f"eval/{k}": v for k, v in extra.items()})
        m["timing_s/testing"] = time.perf_counter() - t0
        return m

    def _latency(self, params: SamplingParams) -> dict[str, float]:
        """Seconds per request answering validation prompts in batches (see evaluators.measure_latency)."""
        one = SamplingParams(1, params.temperature, params.top_p, params.top_k, params.do_sample,
                             params.max_new_tokens)

        def generate(indices: list[int]) -> None:
            pb = self._prompt_batch(indices, self.val_data)
            self.rollout.generate(pb.input_ids, pb.attention_mask, one)

        sync = torch.cuda.synchronize if self.cuda else (lambda: None)
        return measure_latency(generate, len(self.val_data), self.cfg.evaluation.latency, sync)

    # ------------------------------------------------------------------ loop
    def fit(self) -> dict[str, Any]:
        t = self.cfg.trainer
        resumed = False
        if t.resume_mode == "auto":
            latest = find_latest(Path(t.default_local_dir))
            if latest is not None:
                self.global_step = load_checkpoint(self, latest)
                truncate_metrics(self.metrics_file, self.global_step)
                resumed = True
                print(f"resumed from {latest} at step {self.global_step}", flush=True)
        tracking = Tracking(t.logger, self.metrics_file, append=resumed)
        last: dict[str, Any] = {}
        try:
            if t.val_before_train and self.global_step == 0:
                last = self.validate(0)
                tracking.log(last, step=0)
            for step in range(self.global_step + 1, t.total_training_steps + 1):
                metrics = self.train_step(step)
                self.global_step = step
                is_last = step == t.total_training_steps
                if t.test_freq > 0 and (step % t.test_freq == 0 or is_last):
                    metrics.update(self.validate(step))
                if t.save_freq > 0 and (step % t.save_freq == 0 or is_last):
                    save_checkpoint(self, Path(t.default_local_dir), step)
                metrics["training/global_step"] = step
                tracking.log(metrics, step=step)
                last = metrics
                if not all(math.isfinite(v) for v in metrics.values() if isinstance(v, float)):
                    bad = [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]
                    raise FloatingPointError(f"non-finite metrics at step {step}: {', '.join(bad[:5])}")
        finally:
            tracking.close()
        return last

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "global_step": self.global_step,
            "actor": self.actor.model.state_dict(),
            "actor_optim": self.actor.optimizer.state_dict(),
            "actor_sched": self.actor.scheduler.state_dict(),
            "kl_coef": self.kl_ctrl.value,
            "reward_vars": list(self.reward_vars),
            "sampler": self.sampler.state_dict(),
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if self.cuda else None},
            "pid": os.getpid(),
        }
        if self.critic is not None:
            state.update(critic=self.critic.model.state_dict(), critic_optim=self.critic.optimizer.state_dict(),
                         critic_sched=self.critic.scheduler.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> int:
        self.actor.model.load_state_dict(state["actor"])
        self.actor.optimizer.load_state_dict(state["actor_optim"])
        self.actor.scheduler.load_state_dict(state["actor_sched"])
        if self.critic is not None:
            self.critic.model.load_state_dict(state["critic"])
            self.critic.optimizer.load_state_dict(state["critic_optim"])
            self.critic.scheduler.load_state_dict(state["critic_sched"])
        self.kl_ctrl.value = float(state["kl_coef"])
        self.reward_vars.clear()
        self.reward_vars.extend(state["reward_vars"])
        self.sampler.load_state_dict(state["sampler"])
        rng = state["rng"]
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        if self.cuda and rng.get("cuda") is not None:
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.rollout.sync_weights(self.actor.model)
        return int(state["global_step"])
