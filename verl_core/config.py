"""The trainer's one typed config, with keys named as in verl's ``ppo_trainer.yaml``.

A run's config is built in three layers, later layers winning:

1. the defaults below (each field documents itself in ``metadata["help"]``),
2. a YAML file: a named config shipped in ``verl_core/configs/<name>.yaml`` or a path,
3. dotted overrides ``actor_rollout_ref.actor.optim.lr=1e-5`` from the command line.

Every bad input (unknown key, wrong type, value outside its choices, impossible
batch arithmetic) raises :class:`ConfigError` whose message is one line naming
where it came from, the key and the value. Derived sizes (samples per step,
mini-batches, gradient-accumulation steps) are computed in one place,
:func:`derive_sizes`.

This module imports neither torch nor transformers: the HPO driver validates
trial overrides with it.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import yaml

CONFIG_DIR = Path(__file__).parent / "configs"

KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")


class ConfigError(ValueError):
    """A bad config value; ``str(err)`` is one line for the user."""


def _f(default: Any, help: str, choices: tuple[Any, ...] | None = None) -> Any:
    """A dataclass field with its documentation (and allowed values) attached."""
    meta: dict[str, Any] = {"help": help}
    if choices is not None:
        meta["choices"] = choices
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        return field(default_factory=lambda: _copy(default), metadata=meta)
    return field(default=default, metadata=meta)


def _copy(value: Any) -> Any:
    import copy

    return copy.deepcopy(value)


def _sub(cls: type, help: str) -> Any:
    return field(default_factory=cls, metadata={"help": help})


# ----------------------------------------------------------------------------- data
@dataclass
class DataConfig:
    train_files: str = _f(
        "builtin:arith",
        "Training parquet in verl format (prompt as chat messages, data_source, reward_model.ground_truth, "
        "extra_info); 'builtin:arith' generates the synthetic arithmetic task locally.",
    )
    val_files: str = _f("builtin:arith", "Validation parquet, same format; 'builtin:arith' as above.")
    test_files: str | None = _f(
        None, "Held-out test parquet, same format, evaluated once at the last step as test/* (test/reward_mean, "
        "test-core/<source>/...); 'builtin:arith' is the built-in task's test split. A search never sets it "
        "(verl-hpo confirm does); null = no test evaluation.")
    prompt_key: str = _f("prompt", "Column holding the chat-message prompt.")
    train_batch_size: int = _f(1024, "Prompts per PPO step (each sampled rollout.n times).")
    val_batch_size: int | None = _f(None, "Prompts per validation generation batch; null = all at once.")
    val_max_samples: int | None = _f(None, "Use only the first N validation prompts; null = all.")
    max_prompt_length: int = _f(512, "Prompts longer than this (in tokens) are left-truncated.")
    max_response_length: int = _f(512, "Maximum generated tokens per response.")
    shuffle: bool = _f(True, "Shuffle training prompts every epoch (seeded by trainer.seed).")


# ----------------------------------------------------------------------------- actor / rollout / ref
@dataclass
class OptimConfig:
    lr: float = _f(1e-6, "AdamW learning rate (defaults as verl: actor 1e-6, critic 1e-5).")
    weight_decay: float = _f(0.01, "AdamW weight decay.")
    betas: list[float] = _f([0.9, 0.999], "AdamW betas.")
    lr_warmup_steps: int = _f(0, "Linear warm-up steps of the learning rate (0 = constant).")


@dataclass
class ModelConfig:
    path: str = _f(
        "builtin:tiny_arith",
        "Local HF model directory; 'builtin:tiny_arith' builds (once, cached) a small Qwen2 warm-started on "
        "the arithmetic task ('builtin:tiny_arith_s' / 'builtin:tiny_arith_l': the same recipe at hidden 64 / 256).",
    )
    enable_gradient_checkpointing: bool = _f(False, "Recompute activations in backward (saves memory on GPU).")


@dataclass
class ActorConfig:
    optim: OptimConfig = _sub(OptimConfig, "Actor optimizer.")
    ppo_mini_batch_size: int = _f(256, "Prompts per optimizer step (multiplied by rollout.n into samples).")
    ppo_micro_batch_size_per_gpu: int | None = _f(
        None, "Samples per forward/backward; gradients accumulate over a mini-batch. null = whole mini-batch."
    )
    ppo_epochs: int = _f(1, "Passes over each rollout batch.")
    clip_ratio: float = _f(0.2, "PPO clip epsilon (used for both sides unless clip_ratio_low/high set).")
    clip_ratio_low: float | None = _f(None, "Lower clip epsilon; null = clip_ratio.")
    clip_ratio_high: float | None = _f(None, "Upper clip epsilon; null = clip_ratio.")
    clip_ratio_c: float = _f(3.0, "Dual-clip constant c > 1 bounding the loss for negative advantages.")
    loss_agg_mode: str = _f("token-mean", "How token losses are aggregated.", LOSS_AGG_MODES)
    entropy_coeff: float = _f(0.0, "Entropy bonus coefficient (loss -= coeff * entropy).")
    use_kl_loss: bool = _f(False, "Add KL(actor || ref) to the actor loss (GRPO style) instead of the reward.")
    kl_loss_coef: float = _f(0.001, "Coefficient of the KL loss when use_kl_loss.")
    kl_loss_type: str = _f("low_var_kl", "KL estimator of the KL loss.", KL_TYPES)
    kl_threshold: float | None = _f(
        None, "Per-token KL filter (not in verl): tokens whose KL (kl_loss_type, old policy vs reference) "
        "exceeds this are left out of the policy loss and the entropy bonus (metric actor/kl_filtered_frac). "
        "They still count in its denominator, so the loss is normalized as without the filter and the kept "
        "tokens get no extra weight; the KL loss (use_kl_loss) still covers every response token, so the "
        "tokens that drifted most keep their pull towards the reference. null = off."
    )
    grad_clip: float = _f(1.0, "Max global gradient norm (<= 0 disables clipping). A step whose norm is not "
                               "finite is skipped, as verl (metric actor/grad_norm_nonfinite_steps).")
    shuffle: bool = _f(False, "Shuffle samples into mini-batches each epoch (verl's default: false).")


@dataclass
class ValKwargsConfig:
    do_sample: bool = _f(False, "Sample validation responses (false = greedy).")
    temperature: float = _f(0.0, "Validation sampling temperature, used only when do_sample (then > 0); "
                                 "greedy ignores it (0 = verl's default).")
    top_p: float = _f(1.0, "Validation nucleus sampling p.")
    top_k: int = _f(-1, "Validation top-k (-1 = off).")
    n: int = _f(1, "Validation samples per prompt.")


@dataclass
class RolloutConfig:
    name: str = _f("hf", "Rollout engine: hf (the actor's own HF module) or vllm.", ("hf", "vllm"))
    fast_decode: bool = _f(True, "hf engine: our KV-cached decode loop for Llama/Mistral/Qwen2/Qwen3 models "
                                 "(greedy tokens equal transformers generate, ~1.7x faster on small models); "
                                 "other architectures, or false, use transformers generate.")
    reuse_log_probs: bool = _f(False, "hf engine with fast_decode: take the old log-probs and the entropy metric "
                                      "from the decode steps' logits instead of a second actor forward, as TRL's "
                                      "PPO does. In fp32 they equal the recomputed ones up to rounding (~1e-6); "
                                      "under bf16 autocast decode and training kernels differ more: keep it off.")
    n: int = _f(1, "Responses sampled per prompt (GRPO groups).")
    temperature: float = _f(1.0, "Sampling temperature of training rollouts (> 0); the actor's log-probs are "
                                 "computed at the same temperature.")
    top_p: float = _f(1.0, "Nucleus sampling p.")
    top_k: int = _f(-1, "Top-k sampling (-1 = off).")
    val_kwargs: ValKwargsConfig = _sub(ValKwargsConfig, "Sampling used at validation.")
    log_prob_micro_batch_size_per_gpu: int | None = _f(
        None, "Samples per forward when computing old/ref log-probs; null = ppo_micro_batch_size_per_gpu."
    )
    # vLLM engine knobs (rollout.name=vllm), passed through to vllm.LLM
    gpu_memory_utilization: float = _f(0.5, "vLLM: fraction of GPU memory for weights + KV cache.")
    tensor_model_parallel_size: int = _f(1, "vLLM: tensor-parallel degree.")
    max_num_seqs: int = _f(256, "vLLM: max sequences per engine step.")
    max_num_batched_tokens: int = _f(8192, "vLLM: max tokens per engine step.")
    enforce_eager: bool = _f(True, "vLLM: no CUDA graphs (faster start; graphs speed long runs on GPU).")
    free_cache_engine: bool = _f(True, "vLLM: sleep (free KV cache) between rollouts so training gets the memory.")
    dtype: str = _f("auto", "vLLM weights dtype: auto (bfloat16 on GPU, float32 on CPU), bfloat16, float16, "
                            "float32.", ("auto", "bfloat16", "float16", "float32"))
    cpu_kvcache_space_gb: float = _f(1.0, "vLLM on CPU: KV-cache size in GiB (kv_cache_memory_bytes; fractions "
                                             "allowed).")


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int | None = _f(None, "Samples per reference forward; null = rollout's.")


@dataclass
class ActorRolloutRefConfig:
    model: ModelConfig = _sub(ModelConfig, "Policy model (actor, rollout and reference start from it).")
    actor: ActorConfig = _sub(ActorConfig, "Actor (policy) training.")
    rollout: RolloutConfig = _sub(RolloutConfig, "Response generation.")
    ref: RefConfig = _sub(RefConfig, "Frozen reference policy.")


# ----------------------------------------------------------------------------- critic
@dataclass
class CriticModelConfig:
    path: str | None = _f(None, "Critic backbone; null = the actor's model path (value head added).")


@dataclass
class CriticConfig:
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5),
                               metadata={"help": "Critic optimizer (lr 1e-5, as verl)."})
    model: CriticModelConfig = _sub(CriticModelConfig, "Critic model.")
    ppo_mini_batch_size: int | None = _f(None, "Prompts per critic optimizer step; null = actor's.")
    ppo_micro_batch_size_per_gpu: int | None = _f(None, "Samples per critic forward/backward; null = actor's.")
    forward_micro_batch_size_per_gpu: int | None = _f(
        None, "Samples per critic forward when computing values (no grad); null = ppo_micro_batch_size_per_gpu.")
    ppo_epochs: int | None = _f(None, "Critic passes per batch; null = actor's.")
    cliprange_value: float = _f(0.5, "Value clipping range around the old values.")
    loss_agg_mode: str = _f("token-mean", "How token value losses are aggregated.", LOSS_AGG_MODES)
    grad_clip: float = _f(1.0, "Max global gradient norm of the critic (<= 0 disables). A step whose norm is "
                               "not finite is skipped (metric critic/grad_norm_nonfinite_steps).")


# ----------------------------------------------------------------------------- reward
@dataclass
class RewardModelModelConfig:
    path: str | None = _f(None, "Local HF sequence-classification reward model directory.")


@dataclass
class RewardModelConfig:
    enable: bool = _f(False, "Score responses with an HF reward model instead of rule-based scorers.")
    model: RewardModelModelConfig = _sub(RewardModelModelConfig, "Reward model.")
    micro_batch_size_per_gpu: int | None = _f(None, "Samples per reward-model forward; null = all.")
    max_length: int | None = _f(None, "Truncate prompt+response to this many reward-model tokens; null = none.")
    temperature: float = _f(1.0, "Reward temperature: every score is divided by it before advantages.")


@dataclass
class CustomRewardFunctionConfig:
    path: str | None = _f(None, "Python file defining compute_score(data_source, solution_str, ground_truth, "
                                "extra_info) (verl's contract).")
    name: str = _f("compute_score", "Function name in that file.")


# ----------------------------------------------------------------------------- algorithm
@dataclass
class KLCtrlConfig:
    type: str = _f("fixed", "KL coefficient controller: fixed or adaptive (Ziegler et al. 2019).",
                   ("fixed", "adaptive"))
    kl_coef: float = _f(0.001, "(Initial) coefficient beta of the KL penalty in the reward.")
    horizon: int = _f(10000, "Adaptive controller horizon (samples).")
    target_kl: float = _f(0.1, "Adaptive controller target KL.")


@dataclass
class DynamicGammaConfig:
    enable: bool = _f(False, "Lower gamma while the rolling variance of the batch reward is high (not in verl; "
                             "adv_estimator=gae only: GRPO does not discount).")
    window: int = _f(10, "Steps in the rolling window of reward variance.")
    var_threshold: float = _f(0.1, "Variance above which gamma is lowered (reaches min_gamma at twice it).")
    min_gamma: float = _f(0.9, "Lowest gamma the schedule uses.")


@dataclass
class AlgorithmConfig:
    adv_estimator: str = _f("gae", "Advantage estimator: gae (PPO with critic) or grpo (group-normalized).",
                            ("gae", "grpo"))
    gamma: float = _f(1.0, "Discount factor.")
    lam: float = _f(1.0, "GAE lambda.")
    norm_adv_by_std_in_grpo: bool = _f(True, "GRPO: divide by the group's std (false = Dr.GRPO style).")
    use_kl_in_reward: bool = _f(False, "Subtract beta * KL(actor || ref) from the token rewards.")
    kl_penalty: str = _f("kl", "KL estimator used in the reward.", KL_TYPES)
    kl_ctrl: KLCtrlConfig = _sub(KLCtrlConfig, "KL coefficient controller.")
    dynamic_gamma: DynamicGammaConfig = _sub(DynamicGammaConfig, "Dynamic-gamma schedule.")


# ----------------------------------------------------------------------------- evaluation
@dataclass
class ToxicityConfig:
    enable: bool = _f(True, "Score validation responses for toxicity: eval/toxicity_mean, eval/toxicity_max.")
    model: str | None = _f(None, "Local HF sequence-classification model (e.g. a downloaded toxic-bert) scoring "
                                 "the toxic class probability; null = alt-profanity-check (offline, built in).")
    label: str | None = _f(None, "Toxic class label of that model; null = the label containing 'toxic', else 1.")
    batch_size: int = _f(32, "Responses per toxicity-model forward.")


@dataclass
class LatencyConfig:
    enable: bool = _f(True, "Time the policy answering validation prompts: eval/latency_p50, eval/latency_p95.")
    batch_size: int = _f(4, "Requests per generation batch; each request's latency is its batch's time.")
    num_batches: int = _f(8, "Timed batches (after warm-up).")
    warmup_batches: int = _f(1, "Untimed warm-up batches.")


@dataclass
class EvaluationConfig:
    toxicity: ToxicityConfig = _sub(ToxicityConfig, "Toxicity evaluator.")
    latency: LatencyConfig = _sub(LatencyConfig, "Latency evaluator.")
    custom: list[str] = _f([], "User evaluators 'name=path/to/file.py:function' or 'name=package.module:function'; "
                               "fn(prompts, responses, examples) -> float | dict[str, float], logged as eval/<name>.")


# ----------------------------------------------------------------------------- trainer
@dataclass
class TrainerConfig:
    project_name: str = _f("verl_hpo", "Project name (file logger path when no metrics file is given).")
    experiment_name: str = _f("run", "Experiment name (file logger path when no metrics file is given).")
    logger: list[str] = _f(["console", "file"], "Loggers: console and/or file (JSONL).")
    total_training_steps: int = _f(100, "PPO steps to run.")
    test_freq: int = _f(10, "Validate every N steps (and at the last step); <= 0 disables.")
    val_before_train: bool = _f(True, "Validate at step 0 before training.")
    save_freq: int = _f(-1, "Checkpoint every N steps (and at the last step); <= 0 disables.")
    default_local_dir: str = _f("checkpoints/verl_hpo/run", "Checkpoint directory.")
    resume_mode: str = _f("auto", "auto: continue from the newest checkpoint in default_local_dir; disable; "
                          "resume_path: start from the checkpoint resume_from_path (another run's, as verl) with this "
                          "config's hyperparameters winning over the restored ones (learning rates, KL and entropy "
                          "coefficients; see verl_core/checkpoint.py).", ("auto", "disable", "resume_path"))
    resume_from_path: str | None = _f(None, "resume_mode=resume_path: a global_step_<N> checkpoint directory.")
    device: str = _f("auto", "auto (cuda if available), cpu or cuda.", ("auto", "cpu", "cuda"))
    seed: int = _f(1, "Seed of data order, sampling and initialisation.")
    cpu_threads: int = _f(0, "torch intra-op threads on CPU (0 = torch's default).")


@dataclass
class Config:
    data: DataConfig = _sub(DataConfig, "Datasets and batch sizes.")
    actor_rollout_ref: ActorRolloutRefConfig = _sub(ActorRolloutRefConfig, "Actor, rollout, reference.")
    critic: CriticConfig = _sub(CriticConfig, "Critic (value model), used by adv_estimator=gae.")
    reward_model: RewardModelConfig = _sub(RewardModelConfig, "Reward model and reward scaling.")
    custom_reward_function: CustomRewardFunctionConfig = _sub(CustomRewardFunctionConfig, "User reward fn.")
    algorithm: AlgorithmConfig = _sub(AlgorithmConfig, "Advantages and KL.")
    evaluation: EvaluationConfig = _sub(EvaluationConfig, "Extra validation metrics (toxicity, latency, custom).")
    trainer: TrainerConfig = _sub(TrainerConfig, "Run control.")


# ----------------------------------------------------------------------------- derived sizes
@dataclass(frozen=True)
class DerivedSizes:
    """Batch sizes derived from the config, in samples (= prompts x rollout.n)."""

    batch_samples: int  # samples per PPO step
    actor_mini_samples: int
    actor_micro_samples: int
    actor_num_mini: int  # optimizer steps per epoch
    actor_grad_accum: int  # micro-batches per optimizer step
    critic_mini_samples: int
    critic_micro_samples: int
    critic_num_mini: int
    critic_grad_accum: int
    critic_epochs: int
    critic_forward_micro_samples: int  # values pass (no grad)
    log_prob_micro_samples: int
    ref_micro_samples: int


def _split(total: int, part: int, total_key: str, part_key: str) -> int:
    if part <= 0:
        raise ConfigError(f"{part_key}={part} must be positive")
    if part > total:
        raise ConfigError(f"{part_key}={part} is larger than {total_key}={total}")
    if total % part:
        raise ConfigError(f"{total_key}={total} is not divisible by {part_key}={part}")
    return total // part


def derive_sizes(cfg: Config) -> DerivedSizes:
    """Compute (and check) every derived batch size; the one place batch arithmetic lives."""
    n = cfg.actor_rollout_ref.rollout.n
    actor = cfg.actor_rollout_ref.actor
    critic = cfg.critic
    batch = cfg.data.train_batch_size * n
    a_mini_key = "actor_rollout_ref.actor.ppo_mini_batch_size"
    a_micro_key = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
    a_num_mini = _split(cfg.data.train_batch_size, actor.ppo_mini_batch_size, "data.train_batch_size", a_mini_key)
    a_mini = actor.ppo_mini_batch_size * n
    a_micro = actor.ppo_micro_batch_size_per_gpu or a_mini
    a_accum = _split(a_mini, a_micro, f"{a_mini_key} x rollout.n", a_micro_key)

    c_mini_prompts = critic.ppo_mini_batch_size or actor.ppo_mini_batch_size
    c_num_mini = _split(cfg.data.train_batch_size, c_mini_prompts, "data.train_batch_size",
                        "critic.ppo_mini_batch_size")
    c_mini = c_mini_prompts * n
    c_micro = critic.ppo_micro_batch_size_per_gpu or a_micro
    c_accum = _split(c_mini, c_micro, "critic.ppo_mini_batch_size x rollout.n",
                     "critic.ppo_micro_batch_size_per_gpu")
    c_fwd_micro = critic.forward_micro_batch_size_per_gpu or c_micro
    lp_micro = cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu or a_micro
    ref_micro = cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu or lp_micro
    return DerivedSizes(
        batch_samples=batch, actor_mini_samples=a_mini, actor_micro_samples=a_micro, actor_num_mini=a_num_mini,
        actor_grad_accum=a_accum, critic_mini_samples=c_mini, critic_micro_samples=c_micro,
        critic_num_mini=c_num_mini, critic_grad_accum=c_accum, critic_epochs=critic.ppo_epochs or actor.ppo_epochs,
        critic_forward_micro_samples=c_fwd_micro,
        log_prob_micro_samples=lp_micro, ref_micro_samples=ref_micro,
    )


# ----------------------------------------------------------------------------- schema walking
@functools.cache  # the schema's classes never change: resolved once (every load sets each key through them)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def iter_fields(cls: type = Config, prefix: str = "") -> typing.Iterator[tuple[str, Any, dataclasses.Field]]:
    """Yield ``(dotted_key, type, field)`` for every leaf key of the schema."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        key = f"{prefix}{f.name}"
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            yield from iter_fields(tp, key + ".")
        else:
            yield key, tp, f


def known_keys() -> list[str]:
    """All leaf keys, dotted (``actor_rollout_ref.actor.optim.lr``, ...)."""
    return [k for k, _, _ in iter_fields()]


@functools.cache
def _fields_by_key() -> dict[str, tuple[Any, dataclasses.Field]]:
    return {k: (tp, f) for k, tp, f in iter_fields()}


def _resolve_field(key: str) -> tuple[Any, dataclasses.Field] | None:
    return _fields_by_key().get(key)


def _type_name(tp: Any) -> str:
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin is list:
        return f"list of {_type_name(args[0])}"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any) -> Any:
    """Return ``value`` converted to ``tp`` or raise TypeError (message: expected type)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a)
            except TypeError:
                pass
        raise TypeError(_type_name(tp))
    if origin is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise TypeError(_type_name(tp))
        return [_coerce(v, args[0]) for v in value]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise TypeError("bool (true/false)")
    if tp is int:
        if isinstance(value, bool):
            raise TypeError("int")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise TypeError("int")
    if tp is float:
        if isinstance(value, bool):
            raise TypeError("float")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise TypeError("float")
    if tp is str:
        if isinstance(value, (dict, list)) or value is None:
            raise TypeError("string")
        return value if isinstance(value, str) else str(value)
    raise TypeError(_type_name(tp))


def parse_override_value(text: str) -> Any:
    """Parse the right-hand side of ``key=value`` as a YAML scalar/list (safely)."""
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


def _set(cfg: Config, key: str, value: Any, source: str) -> None:
    resolved = _resolve_field(key)
    if resolved is None:
        if any(k.startswith(key + ".") for k in known_keys()):
            raise ConfigError(f"{source}: key '{key}' is a section, not a value (got {value!r})")
        raise ConfigError(f"{source}: unknown config key '{key}' (value {value!r})")
    tp, f = resolved
    try:
        coerced = _coerce(value, tp)
    except TypeError as err:
        raise ConfigError(f"{source}: {key}={value!r} is not a valid {err}") from None
    choices = f.metadata.get("choices")
    if choices is not None and coerced not in choices:
        raise ConfigError(f"{source}: {key}={coerced!r} is not one of {', '.join(map(str, choices))}")
    obj: Any = cfg
    parts = key.split(".")
    for p in parts[:-1]:
        obj = getattr(obj, p)
    setattr(obj, parts[-1], coerced)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict -> dotted keys. Sections of the schema recurse; values (incl. lists) stop."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as a plain nested dict (YAML/JSON-serialisable)."""
    return dataclasses.asdict(cfg)


def resolve_config_path(name_or_path: str) -> Path:
    """A shipped config name (``tiny_arith``) or a YAML path."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if not p.is_file():
            raise ConfigError(f"config file {name_or_path} not found")
        return p
    shipped = CONFIG_DIR / f"{name_or_path}.yaml"
    if not shipped.is_file():
        names = ", ".join(sorted(x.stem for x in CONFIG_DIR.glob("*.yaml")))
        raise ConfigError(f"--config {name_or_path!r}: no such file or shipped config (shipped: {names})")
    return shipped


def shipped_configs() -> list[str]:
    return sorted(x.stem for x in CONFIG_DIR.glob("*.yaml"))


def split_override(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value")
    key, _, raw = text.partition("=")
    key = key.strip().lstrip("+")
    if not key:
        raise ConfigError(f"override {text!r}: empty key")
    return key, parse_override_value(raw)


@functools.lru_cache(maxsize=16)  # a check loads one file once per combination of values it tries
def _config_file_items(path: str, text: str) -> tuple[tuple[str, Any], ...]:
    """The file's keys and values, flattened (ConfigError for YAML that is not a mapping of sections)."""
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}:{where} invalid YAML ({getattr(err, 'problem', err)})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping of config sections")
    return tuple(flatten(raw).items())


def load_config(name_or_path: str | None = None, overrides: typing.Sequence[str] = ()) -> Config:
    """Defaults <- YAML file (shipped name or path) <- ``key=value`` overrides, then validated."""
    cfg = Config()
    if name_or_path is not None:
        path = resolve_config_path(name_or_path)
        try:
            text = path.read_text()
        except OSError as err:
            raise ConfigError(f"{path}: cannot read ({err.strerror})") from None
        for key, value in _config_file_items(str(path), text):
            _set(cfg, key, copy.deepcopy(value), str(path))
    for text in overrides:
        key, value = split_override(text)
        _set(cfg, key, value, f"override '{text}'")
    validate(cfg)
    return cfg


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def validate(cfg: Config) -> DerivedSizes:
    """Cross-field checks; returns the derived sizes."""
    d, a, r = cfg.data, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    for key in ("data.train_batch_size", "data.max_prompt_length", "data.max_response_length",
                "actor_rollout_ref.rollout.n", "actor_rollout_ref.actor.ppo_epochs", "trainer.total_training_steps",
                "algorithm.kl_ctrl.horizon", "algorithm.dynamic_gamma.window"):
        value = _get(cfg, key)
        _check(value > 0, f"{key}={value} must be positive")
    for key in ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "critic.forward_micro_batch_size_per_gpu",
                "reward_model.micro_batch_size_per_gpu"):  # optional sizes: null or positive
        value = _get(cfg, key)
        _check(value is None or value > 0, f"{key}={value} must be positive")
    for key in ("actor_rollout_ref.actor.optim.lr", "critic.optim.lr", "algorithm.kl_ctrl.kl_coef",
                "actor_rollout_ref.actor.kl_loss_coef", "actor_rollout_ref.actor.clip_ratio", "critic.cliprange_value"):
        value = _get(cfg, key)
        _check(value >= 0, f"{key}={value} must be >= 0")
    for key in ("algorithm.gamma", "algorithm.lam", "algorithm.dynamic_gamma.min_gamma"):
        value = _get(cfg, key)
        _check(0.0 <= value <= 1.0, f"{key}={value} must be in [0, 1]")
    _check(r.temperature > 0, f"actor_rollout_ref.rollout.temperature={r.temperature} must be > 0")
    vk = r.val_kwargs
    _check(not vk.do_sample or vk.temperature > 0,
           f"actor_rollout_ref.rollout.val_kwargs.temperature={vk.temperature} must be > 0 with "
           f"val_kwargs.do_sample=true (greedy validation: do_sample=false)")
    _check(vk.n > 0, f"actor_rollout_ref.rollout.val_kwargs.n={vk.n} must be positive")
    t = cfg.trainer
    _check(t.resume_mode != "resume_path" or bool(t.resume_from_path),
           "trainer.resume_mode=resume_path needs trainer.resume_from_path (a global_step_<N> directory)")
    _check(0 < r.top_p <= 1, f"actor_rollout_ref.rollout.top_p={r.top_p} must be in (0, 1]")
    _check(a.clip_ratio_c > 1, f"actor_rollout_ref.actor.clip_ratio_c={a.clip_ratio_c} must be > 1")
    _check(cfg.reward_model.temperature > 0,
           f"reward_model.temperature={cfg.reward_model.temperature} must be > 0")
    _check(cfg.algorithm.kl_ctrl.target_kl > 0,
           f"algorithm.kl_ctrl.target_kl={cfg.algorithm.kl_ctrl.target_kl} must be > 0")
    _check(cfg.algorithm.dynamic_gamma.var_threshold > 0,
           f"algorithm.dynamic_gamma.var_threshold={cfg.algorithm.dynamic_gamma.var_threshold} must be > 0")
    _check(cfg.algorithm.dynamic_gamma.min_gamma <= cfg.algorithm.gamma or not cfg.algorithm.dynamic_gamma.enable,
           f"algorithm.dynamic_gamma.min_gamma={cfg.algorithm.dynamic_gamma.min_gamma} must be <= "
           f"algorithm.gamma={cfg.algorithm.gamma}")
    if cfg.algorithm.adv_estimator == "grpo":
        _check(r.n > 1, f"actor_rollout_ref.rollout.n={r.n} must be > 1 with algorithm.adv_estimator=grpo")
        _check(not cfg.algorithm.dynamic_gamma.enable,
               "algorithm.dynamic_gamma.enable=true has no effect with algorithm.adv_estimator=grpo "
               "(only gae discounts)")
    _check(not r.reuse_log_probs or (r.name == "hf" and r.fast_decode),
           f"actor_rollout_ref.rollout.reuse_log_probs=true needs rollout.name=hf with fast_decode=true "
           f"(got name={r.name}, fast_decode={r.fast_decode})")
    if cfg.reward_model.enable:
        _check(bool(cfg.reward_model.model.path),
               "reward_model.model.path=None: reward_model.enable=true needs a model path")
    lat = cfg.evaluation.latency
    for key, value in (("evaluation.latency.batch_size", lat.batch_size),
                       ("evaluation.latency.num_batches", lat.num_batches),
                       ("evaluation.toxicity.batch_size", cfg.evaluation.toxicity.batch_size)):
        _check(value > 0, f"{key}={value} must be positive")
    _check(lat.warmup_batches >= 0, f"evaluation.latency.warmup_batches={lat.warmup_batches} must be >= 0")
    for spec in cfg.evaluation.custom:
        name, sep, target = spec.partition("=")
        _check(bool(sep and name.strip() and ":" in target),
               f"evaluation.custom: {spec!r} is not 'name=path/to/file.py:function' or 'name=module:function'")
    for name in cfg.trainer.logger:
        _check(name in ("console", "file"), f"trainer.logger: {name!r} is not one of console, file")
    _check(d.max_prompt_length + d.max_response_length <= 1 << 20, "data lengths are unreasonably large")
    return derive_sizes(cfg)


def _get(cfg: Any, key: str) -> Any:
    obj = cfg
    for p in key.split("."):
        obj = getattr(obj, p)
    return obj


def get(cfg: Config, key: str) -> Any:
    """Value of a dotted key."""
    if _resolve_field(key) is None:
        raise ConfigError(f"unknown config key '{key}'")
    return _get(cfg, key)


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def eval_metric_names(cfg: Config) -> list[str]:
    """The ``eval/*`` metrics a run of ``cfg`` logs at every evaluation (custom dict metrics add
    ``eval/<name>/<key>`` on top of ``eval/<name>``)."""
    names = ["eval/reward_mean", "eval/reward_std", "eval/response_length_mean"]
    if cfg.evaluation.toxicity.enable:
        names += ["eval/toxicity_mean", "eval/toxicity_max"]
    if cfg.evaluation.latency.enable:
        names += ["eval/latency_p50", "eval/latency_p95"]
    names += [f"eval/{spec.partition('=')[0].strip()}" for spec in cfg.evaluation.custom]
    return names


def produces_metric(cfg: Config, metric: str) -> bool:
    """Whether an evaluation of ``cfg`` logs ``metric`` (also ``val-core/...``, ``val-aux/...`` with
    ``val_kwargs.n > 1``, and custom sub-keys)."""
    names = eval_metric_names(cfg)
    if metric in names or metric.startswith("val-core/"):
        return True
    if metric.startswith("val-aux/") and cfg.actor_rollout_ref.rollout.val_kwargs.n > 1:
        return True
    custom = [f"eval/{spec.partition('=')[0].strip()}/" for spec in cfg.evaluation.custom]
    return any(metric.startswith(prefix) for prefix in custom)
