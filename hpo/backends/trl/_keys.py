"""The keys of a ``trial.backend: trl`` config, shared by the driver (``_backend``) and the launcher (``_train.py``,
which imports this file as its sibling in TRL's interpreter): the standard library and PyYAML only.

* :data:`GRPO_FIELDS`: the field names of ``trl.GRPOConfig`` (trl==1.16.0, with its ``transformers.TrainingArguments``
  base), the flat keys an experiment may set, checked by the driver without importing trl. Written by
  ``python hpo/backends/trl/_train.py --keys`` in TRL's interpreter; ``tests/hpo/backends/trl/test_keys.py`` fails
  when the installed TRL's fields differ (regenerate the list then). The launcher itself checks against the
  installed ``GRPOConfig``.
* :data:`LAUNCHER_KEYS`: the launcher's own keys (dotted: a section and a name) and their defaults.
* :data:`DRIVER_KEYS`: what the driver sets on every trial (an experiment must not).
* :func:`load_value`, :func:`load_mapping`: YAML as both sides read a config and its ``key=value`` overrides.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import yaml

TRL_VERSION = "1.16.0"
GRPO_FIELDS: frozenset[str] = frozenset((
    "accelerator_config", "adam_beta1", "adam_beta2", "adam_epsilon", "auto_find_batch_size",
    "average_tokens_across_devices", "batch_eval_metrics", "beta", "bf16", "bf16_full_eval", "cache_implementation",
    "cast_lm_head_to_fp32", "chat_template_kwargs", "data_seed", "dataloader_drop_last", "dataloader_in_order",
    "dataloader_multiprocessing_context", "dataloader_num_workers", "dataloader_persistent_workers",
    "dataloader_pin_memory", "dataloader_prefetch_factor", "ddp_backend", "ddp_broadcast_buffers",
    "ddp_bucket_cap_mb", "ddp_find_unused_parameters", "ddp_static_graph", "ddp_timeout", "debug", "deepspeed",
    "delta", "disable_dropout", "disable_tqdm", "do_eval", "do_predict", "do_train", "ds3_gather_for_generation",
    "enable_jit_checkpoint", "entropy_coef", "entropy_coef_delta", "entropy_coef_max", "entropy_coef_min",
    "entropy_target", "epsilon", "epsilon_high", "eval_accumulation_steps", "eval_delay", "eval_do_concat_batches",
    "eval_on_start", "eval_steps", "eval_strategy", "eval_use_gather_object", "fp16", "fp16_full_eval", "fsdp",
    "fsdp_config", "full_determinism", "generation_batch_size", "generation_kwargs", "gradient_accumulation_steps",
    "gradient_checkpointing", "gradient_checkpointing_kwargs", "greater_is_better", "hub_always_push",
    "hub_model_id", "hub_private_repo", "hub_revision", "hub_strategy", "hub_token", "ignore_data_skip",
    "importance_sampling_level", "include_for_metrics", "include_num_input_tokens_seen", "label_names",
    "label_smoothing_factor", "learning_rate", "length_column_name", "liger_kernel_config",
    "load_best_model_at_end", "local_rank", "log_completions", "log_completions_hub_repo", "log_level",
    "log_level_replica", "log_multimodal", "log_on_each_node", "log_unique_prompts", "logging_first_step",
    "logging_nan_inf_filter", "logging_steps", "logging_strategy", "loss_type", "lr_scheduler_kwargs",
    "lr_scheduler_type", "mask_truncated_completions", "max_completion_length", "max_grad_norm", "max_steps",
    "max_tool_calling_iterations", "metric_for_best_model", "min_p", "model_init_kwargs",
    "multi_objective_aggregation", "neftune_noise_alpha", "num_completions_to_print", "num_generations",
    "num_generations_eval", "num_iterations", "num_train_epochs", "off_policy_mask_threshold", "optim",
    "optim_args", "optim_target_modules", "output_dir", "pad_to_multiple_of", "parallelism_config",
    "per_device_eval_batch_size", "per_device_train_batch_size", "prediction_loss_only", "project", "push_to_hub",
    "ref_model_mixup_alpha", "ref_model_sync_steps", "remove_unused_columns", "repetition_penalty", "report_to",
    "restore_callback_states_from_checkpoint", "resume_from_checkpoint", "reward_weights", "router_aux_loss_coef",
    "run_name", "sapo_temperature_neg", "sapo_temperature_pos", "save_on_each_node", "save_only_model",
    "save_steps", "save_strategy", "save_total_limit", "scale_rewards", "seed", "shuffle_dataset",
    "skip_memory_metrics", "steps_per_generation", "sync_ref_model", "temperature", "tf32", "top_entropy_quantile",
    "top_k", "top_p", "torch_compile", "torch_compile_backend", "torch_compile_mode", "torch_empty_cache_steps",
    "trackio_bucket_id", "trackio_space_id", "trackio_static_space_id", "train_sampling_strategy",
    "transformers_continuous_batching_config", "trust_remote_code", "use_adaptive_entropy",
    "use_bias_correction_kl", "use_cache", "use_cpu", "use_liger_kernel", "use_transformers_continuous_batching",
    "use_transformers_paged", "use_vllm", "vespo_k_neg", "vespo_k_pos", "vespo_lambda_neg", "vespo_lambda_pos",
    "vllm_enable_sleep_mode", "vllm_gpu_memory_utilization", "vllm_group_port", "vllm_importance_sampling_cap",
    "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min", "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode", "vllm_max_model_length", "vllm_mode", "vllm_model_impl",
    "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout",
    "vllm_structured_outputs_regex", "vllm_tensor_parallel_size", "warmup_steps", "weight_decay"
))


# The launcher's own keys (dotted) and their defaults; every flat key is a GRPOConfig field.
LAUNCHER_KEYS: dict[str, Any] = {
    "model.path": "builtin:tiny_arith",  # a local Hugging Face directory, or builtin:tiny_arith / builtin:smollm2
    "data.train_files": "builtin:arith",  # verl-format parquet (or builtin:<task>): the training prompts
    "data.val_files": "builtin:arith",  # the validation prompts, decoded greedily at each evaluation
    "data.test_files": None,  # the held-out split: confirmation runs only, scored once at the last step (test/*)
    "reward.path": None,  # a .py file with verl's compute_score(data_source, solution_str, ground_truth, extra_info)
    "reward.name": "compute_score",  # its function
    "eval.before_train": True,  # evaluate the starting policy at step 0 (a fresh start only)
    "runtime.threads": 1,  # torch's CPU threads (OMP_NUM_THREADS, set before torch loads)
}
SECTIONS = tuple(sorted({k.split(".")[0] for k in LAUNCHER_KEYS}))
TEST_FILES = "data.test_files"
# output_dir: <trial dir>/checkpoints; resume_from_checkpoint: a retry's checkpoint-N; report_to: the metrics file.
DRIVER_KEYS = ("output_dir", "resume_from_checkpoint")


def flatten(raw: dict[str, Any]) -> dict[str, Any]:
    """A config file's mapping with the launcher's sections (``data: {train_files: ...}``) as dotted keys; any other
    mapping value (``model_init_kwargs: {...}``) is a GRPOConfig field's value and stays one."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key in SECTIONS and isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[str(key)] = value
    return out


class _Loader(yaml.SafeLoader):
    """YAML 1.1 with YAML 1.2's floats: ``1e-06`` (what ``repr`` writes, and the driver's overrides) is a number, not
    the string PyYAML's SafeLoader makes of a float without a dot."""


_Loader.add_implicit_resolver(  # type: ignore[no-untyped-call]
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def load_value(text: str) -> Any:
    """The right-hand side of ``key=value``: a YAML scalar or list (``''`` for nothing, the text itself when it is
    not YAML)."""
    if not text.strip():
        return ""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError:
        return text


def load_mapping(text: str) -> Any:
    """A config file's document (YAMLError when it is not YAML)."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader


ENV_REF = re.compile(r"^\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)\}$")  # hpo.experiment._secrets writes them


def resolve_env_refs(overrides: list[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """``key=${oc.env:NAME}`` overrides with the variable's value (what a trainer does at start-up); ValueError
    naming the key when the variable is not set."""
    environ = os.environ if environ is None else environ
    out = []
    for text in overrides:
        key, sep, value = text.partition("=")
        m = ENV_REF.match(value.strip()) if sep else None
        if m is None:
            out.append(text)
            continue
        if m.group(1) not in environ:
            raise ValueError(f"{key}: ${{oc.env:{m.group(1)}}} is not set in the trainer's environment")
        out.append(f"{key}='" + environ[m.group(1)].replace("'", "''") + "'")  # a YAML string, whatever it holds
    return out
