"""The PPO/GRPO controller: one step is a short sequence of named, timed stages.

    gen -> reward -> old_log_prob -> ref -> values -> adv -> update_critic -> update_actor -> update_weights

(verl's ``RayPPOTrainer.fit`` in one process). ``old_log_prob`` is skipped when the update is on-policy
(one epoch, one mini-batch) and neither KL-in-reward nor the KL-threshold filter reads the old
log-probs first: the update's forward then supplies them. With ``rollout.reuse_log_probs`` the HF
engine's decode steps supply them instead (no stage). Each stage's wall time is logged as
``timing_s/<stage>``; all metric names follow verl (see docs/trainer.md, "Metrics").
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import sys
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl_core import algos
from verl_core.batches import Sequences, compute_advantages, data_metrics
from verl_core.checkpoint import (
    apply_config_hyperparameters,
    find_latest,
    load_checkpoint,
    save_checkpoint,
    truncate_metrics,
)
from verl_core.config import Config, ConfigError, derive_sizes
from verl_core.data import PromptSampler, load_examples
from verl_core.evaluators import build_text_evaluators
from verl_core.gpu_metrics import UtilizationSampler
from verl_core.import_cache import cached_transformers_import
from verl_core.resolve import resolve_data_path, resolve_model_path
from verl_core.rewards import build_reward, token_level_scores
from verl_core.rollout import SamplingParams, build_rollout
from verl_core.tracking import Tracking, default_metrics_path
from verl_core.validation import Validator, heldout_metrics
from verl_core.workers import Actor, Critic, Policy

STAGES = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor",
          "update_weights")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device='cuda' but no CUDA device is visible (CUDA_VISIBLE_DEVICES?)")
    return torch.device(name)


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


# Optional packages that importing transformers' models pulls in when they are installed, for features a trial never
# uses: scikit-learn (``sklearn.metrics`` in ``transformers.generation``, for assisted decoding) and SciPy
# (``scipy.optimize`` in ``transformers.loss``, for object-detection matching). About 2.5 s of start-up on 2 CPU
# cores with what they import in turn (SciPy's statistics, pandas).
UNUSED_OPTIONAL = ("sklearn", "scipy")


def import_transformers() -> None:
    """Import transformers' auto classes and model code without :data:`UNUSED_OPTIONAL`: those marked absent in
    ``sys.modules`` while transformers loads (``import`` and ``find_spec`` then report them missing, and transformers
    leaves out what needs them), the marks removed at once, so a later ``import scipy`` (a user's reward) works as
    usual. A trial decodes with :mod:`verl_core.decode` or vLLM and trains causal LMs and value heads, none of which
    read them. Call it before anything else imports transformers: transformers caches whether a package is installed
    at its first question, and a process where it already said yes imports transformers as usual (the import is
    retried without the marks). Two of its start-up computations come from disk (:mod:`verl_core.import_cache`). A
    no-op once transformers' model code is imported."""
    if "transformers.modeling_utils" in sys.modules:
        return
    blocked = [name for name in UNUSED_OPTIONAL if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        with cached_transformers_import():
            _import_model_code()
    except ImportError as err:  # transformers knew them installed before the marks: import as usual
        if (err.name or "").split(".")[0] not in blocked:
            raise
    finally:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
    _import_model_code()


def _import_model_code() -> None:
    import transformers.generation.utils  # noqa: F401  (imports sklearn.metrics when available)
    import transformers.modeling_utils  # noqa: F401  (imports transformers.loss: scipy.optimize)
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401


def load_tokenizer(path: str) -> Any:
    import_transformers()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if tok.eos_token_id is None:
        raise ConfigError(f"actor_rollout_ref.model.path={path!r}: the tokenizer has no EOS token")
    return tok


def load_lm(path: str, device: torch.device, train: bool, gradient_checkpointing: bool) -> torch.nn.Module:
    import_transformers()
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
    if train and gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.eval()  # dropout off throughout, as in verl (the actor's updates too: workers.disable_dropout)
    if not train:
        model.requires_grad_(False)
    return model  # type: ignore[no-any-return]


def load_critic(path: str, device: torch.device, gradient_checkpointing: bool) -> torch.nn.Module:
    import_transformers()
    from transformers import AutoConfig, AutoModelForTokenClassification

    config = AutoConfig.from_pretrained(path, num_labels=1)
    config.classifier_dropout = 0.0  # no dropout before the value head (HF's default is 0.1), as verl's critic
    model = AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=torch.float32)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model.to(device).eval()  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------- checkpoint state
def worker_state(name: str, worker: Actor | Critic) -> dict[str, Any]:
    """``<name>``, ``<name>_optim``, ``<name>_sched``: a worker's model, optimizer and LR schedule."""
    return {name: worker.model.state_dict(), f"{name}_optim": worker.optimizer.state_dict(),
            f"{name}_sched": worker.scheduler.state_dict()}


def load_worker_state(name: str, worker: Actor | Critic, state: dict[str, Any]) -> None:
    worker.model.load_state_dict(state[name])
    worker.optimizer.load_state_dict(state[f"{name}_optim"])
    worker.scheduler.load_state_dict(state[f"{name}_sched"])


def rng_state(cuda: bool) -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if cuda else None}


def set_rng_state(rng: dict[str, Any], cuda: bool) -> None:
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if cuda and rng.get("cuda") is not None:
        torch.cuda.set_rng_state_all(rng["cuda"])


class PPOTrainer:
    """One process's PPO/GRPO run: the models, data and rollout of ``cfg``, stepped by :meth:`train_step` (the
    stages of the module docstring), validated by a :class:`~verl_core.validation.Validator`, driven by
    :meth:`fit` (resume, validate, save, log)."""

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
        arr, d = cfg.actor_rollout_ref, cfg.data
        # Every path first: resolving a builtin one builds the cached model or data in this process on a machine's
        # first run (an SFT run that draws from the global RNG), so seeding before it made that first run train
        # differently from every later one with the same seed.
        model_path = resolve_model_path(arr.model.path, "actor_rollout_ref.model.path")
        critic_path = cfg.critic.model.path or model_path
        if critic_path != model_path:
            critic_path = resolve_model_path(critic_path, "critic.model.path")
        train_path = resolve_data_path(d.train_files, "data.train_files", "train")
        val_path = resolve_data_path(d.val_files, "data.val_files", "val")
        test_path = resolve_data_path(d.test_files, "data.test_files", "test") if d.test_files else None
        seed_everything(cfg.trainer.seed)
        self.tokenizer = load_tokenizer(model_path)
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.eos_id = int(self.tokenizer.eos_token_id)
        self.train_data = load_examples(train_path, "data.train_files", self.tokenizer, d.prompt_key,
                                        d.max_prompt_length)
        self.val_data = load_examples(val_path, "data.val_files", self.tokenizer, d.prompt_key,
                                      d.max_prompt_length)[: d.val_max_samples]
        self.sampler = PromptSampler(len(self.train_data), d.train_batch_size, cfg.trainer.seed, d.shuffle)

        temp, ckpt = arr.rollout.temperature, arr.model.enable_gradient_checkpointing
        self.actor = Actor(load_lm(model_path, self.device, True, ckpt), arr.actor, temp, self.autocast)
        self.use_ref = cfg.algorithm.use_kl_in_reward or arr.actor.use_kl_loss or arr.actor.kl_threshold is not None
        self.ref = Policy(load_lm(model_path, self.device, False, ckpt), temp, self.autocast) if self.use_ref else None
        # On-policy (one epoch, one mini-batch) the update's own forward gives the old log-probs and the
        # entropy, as in verl's actor; the separate pass is needed only when something reads them first.
        on_policy = arr.actor.ppo_epochs == 1 and self.sizes.actor_num_mini == 1
        self.recompute_old_log_prob = not (on_policy and not cfg.algorithm.use_kl_in_reward
                                           and arr.actor.kl_threshold is None)
        self.use_critic = cfg.algorithm.adv_estimator == "gae"
        self.critic = None
        if self.use_critic:
            self.critic = Critic(load_critic(critic_path, self.device, ckpt), cfg.critic, self.autocast)
        self.rollout = build_rollout(arr.rollout.name, self.actor.model, self.pad_id, self.eos_id, self.autocast,
                                     model_path=model_path, rollout_cfg=arr.rollout,
                                     max_prompt_length=d.max_prompt_length, max_response_length=d.max_response_length,
                                     seed=cfg.trainer.seed)
        self.reward_fn = build_reward(cfg, self.device, self.tokenizer)
        self.seqs = Sequences(self.tokenizer, self.pad_id, self.eos_id, self.device, self.reward_fn)
        self.text_evaluators = build_text_evaluators(cfg.evaluation, self.device)
        self.validator = Validator(cfg, self.val_data, self.rollout, self.seqs, self.text_evaluators, self.device)
        self.tester = None  # data.test_files: the held-out split, evaluated once at the last step (test/*)
        if test_path is not None:
            test_data = load_examples(test_path, "data.test_files", self.tokenizer, d.prompt_key, d.max_prompt_length)
            self.tester = Validator(cfg, test_data, self.rollout, self.seqs, self.text_evaluators, self.device,
                                    latency=False)
        kc = cfg.algorithm.kl_ctrl
        self.kl_ctrl = algos.get_kl_controller(kc.type, kc.kl_coef, kc.target_kl, kc.horizon)
        # the coefficient the controller started from (saved in checkpoints: a resume_path run with the same one
        # continues an adaptive controller where it was; see checkpoint.apply_config_hyperparameters)
        self.kl_coef_init: float | None = float(kc.kl_coef)
        self.reward_vars: deque[float] = deque(maxlen=cfg.algorithm.dynamic_gamma.window)
        self.metrics_file = metrics_file or default_metrics_path(cfg.trainer.project_name, cfg.trainer.experiment_name)
        self.global_step = 0

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.cuda:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ one PPO step
    def train_step(self, step: int) -> dict[str, Any]:
        cfg, sizes, arr = self.cfg, self.sizes, self.cfg.actor_rollout_ref
        r = arr.rollout
        timer = Timer()
        t_step = time.perf_counter()
        torch.manual_seed(cfg.trainer.seed * 1_000_003 + step)  # rollout sampling: a pure function of (seed, step)
        gen = torch.Generator().manual_seed(cfg.trainer.seed * 7919 + step)  # mini-batch shuffling
        pb = self.seqs.prompts(self.sampler.next_indices(), self.train_data)
        reuse = r.reuse_log_probs and self.recompute_old_log_prob
        params = SamplingParams(r.n, r.temperature, r.top_p, r.top_k, True, cfg.data.max_response_length, reuse)
        with timer("gen"):
            responses = self.rollout.generate(pb.input_ids, pb.attention_mask, params)
        rollout_log_probs = getattr(self.rollout, "last_log_probs", None) if reuse else None
        batch = self.seqs.sequences(pb, responses, r.n)
        mask = batch["response_mask"]
        with timer("reward"):
            raw_scores = self.seqs.score(pb, None, r.n, batch)
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
            metrics.update(compute_advantages(cfg, batch, pb, raw_scores, self.kl_ctrl, self.reward_vars))
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
        metrics.update(data_metrics(cfg, batch, pb, raw_scores, timer.times["timing_s/step"], self.cuda))
        return metrics

    def validate(self, step: int) -> dict[str, Any]:
        return self.validator(step)

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
        elif t.resume_mode == "resume_path":  # another run's checkpoint, this config's hyperparameters
            path = Path(str(t.resume_from_path))
            if not (path / "state.pt").is_file():
                raise FileNotFoundError(f"trainer.resume_from_path={path}: no checkpoint there (state.pt)")
            self.global_step = load_checkpoint(self, path)
            apply_config_hyperparameters(self)
            print(f"resumed from {path} at step {self.global_step} with this config's hyperparameters", flush=True)
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
                if is_last and self.tester is not None:
                    metrics.update(heldout_metrics(self.tester(step)))
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
            **worker_state("actor", self.actor),
            "kl_coef": self.kl_ctrl.value,
            "kl_coef_init": self.kl_coef_init,
            "reward_vars": list(self.reward_vars),
            "sampler": self.sampler.state_dict(),
            "rng": rng_state(self.cuda),
            "pid": os.getpid(),
        }
        if self.critic is not None:
            state.update(worker_state("critic", self.critic))
        return state

    def load_state_dict(self, state: dict[str, Any]) -> int:
        load_worker_state("actor", self.actor, state)
        if self.critic is not None:
            load_worker_state("critic", self.critic, state)
        self.kl_ctrl.value = float(state["kl_coef"])
        init = state.get("kl_coef_init")  # absent from checkpoints saved before it was kept
        self.kl_coef_init = None if init is None else float(init)
        self.reward_vars.clear()
        self.reward_vars.extend(state["reward_vars"])
        self.sampler.load_state_dict(state["sampler"])
        set_rng_state(state["rng"], self.cuda)
        self.rollout.sync_weights(self.actor.model)
        return int(state["global_step"])
