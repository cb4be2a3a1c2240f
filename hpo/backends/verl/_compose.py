"""Compose and validate verl configs in verl's own interpreter: what ``hpo.backends.verl._check.check_space`` runs.

    <verl's python> hpo/backends/verl/_compose.py < request.json

Request: ``{"config_dir": DIR or null, "config_name": NAME, "corners": [[override, ...], ...]}`` (null: the
installed package's ``verl/trainer/config``, as ``python -m verl.trainer.main_ppo`` uses), optionally
``"select": [dotted key, ...]``: the values of those keys in each composed corner (interpolations resolved; a
key the config lacks is null), what the memory estimate reads (``verl_core.memory.VERL_MEMORY_KEYS``), and
``"measure_prompts": N``: the token counts of the first N training prompts, in the first corner's result as
``"prompt_lengths"`` (:func:`measure_prompts`: the model's own tokenizer and chat template, from a local directory or
the Hugging Face cache, never downloaded). The reply is the one line on stdout (everything verl prints goes to stderr):

* ``{"status": "ok", "results": [one per corner]}``, each ``{"ok": true, "info": {...}, "seconds": s}`` (with
  ``"selected": {key: value}`` when the request selects keys) or
  ``{"ok": false, "key": KEY or null, "value": VALUE or null, "message": ONE LINE, "seconds": s}`` for a corner
  that hydra cannot compose, that :func:`extra_checks` rejects, or that verl's own
  ``verl.utils.config.validate_config`` rejects (in this order: ours name the key and value in verl's terms)
* ``{"status": "missing", "message": ...}`` when this interpreter has no verl or hydra, ``{"status": "error",
  "message": ...}`` when the config does not exist (or anything unexpected happens).

Each corner: hydra's ``compose(config_name, overrides)`` (the overrides ``main_ppo`` would get), then
:func:`extra_checks`, then ``validate_config(cfg, use_reference_policy=need_reference_policy(cfg),
use_critic=need_critic(cfg))`` from ``verl.trainer.ppo.utils``, as ``main_ppo.main`` calls it. Only the CPU is used.
This file imports nothing of the project, so that it runs in any interpreter that has verl.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import os
import re
import sys
import time
from typing import Any

Problem = tuple[str, Any, str]  # (key, value, message naming both)


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith(("Set the environment variable HYDRA_FULL_ERROR",
                                                                "object_type=", "reference_type="))]
    return " ".join(lines)


def load_error(err: BaseException) -> str:
    """Why a user's module did not load, from the root of the exception chain (verl wraps every failure in
    ``RuntimeError: Error loading module from module_path=...``): its type and message, the missing module's name, and
    the file and line (a syntax error's own, else the deepest frame in a file that is not the interpreter's)."""
    root = err
    while (nxt := root.__cause__ or root.__context__) is not None and nxt is not root:
        root = nxt
    text = f"{type(root).__name__}: {_one_line(str(root))[:300]}"
    if isinstance(root, ModuleNotFoundError) and root.name:
        text += f" (the module {root.name!r} is not installed in {sys.executable})"
    if isinstance(root, SyntaxError) and root.filename:
        return f"{text} at {root.filename}:{root.lineno}"
    import traceback

    frames = [f for f in traceback.extract_tb(root.__traceback__) if "site-packages" not in f.filename
              and "<frozen" not in f.filename and not f.filename.startswith(sys.prefix)]
    return f"{text} at {frames[-1].filename}:{frames[-1].lineno}" if frames else text


class ReasonedLoadError(ValueError):
    """A user's reward module that does not load: ``str(err)`` is one line with the root cause."""


def _get(cfg: Any, key: str) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, key, default=None)


# ----------------------------------------------------------------------------- checks verl does not make
def _batch_checks(cfg: Any, section: str, n_gpus: int, mini_key: str | None, micro_key: str, legacy_micro: str,
                  dyn_key: str, max_len_key: str, sp_key: str) -> Problem | None:
    """One pass's batch arithmetic: an update (``mini_key`` set: actor, critic) or a log-prob pass over the whole
    batch (rollout, ref). Without dynamic batching the mini-batch divides the batch and splits evenly over the
    data-parallel GPUs (``n_gpus`` / sequence parallelism ``sp_key``), and the micro-batch divides each GPU's
    share, as verl's ``prepare_micro_batches`` asserts at run time; with dynamic batching the token budget
    holds at least one full sequence."""
    bs = int(_get(cfg, "data.train_batch_size"))
    n = int(_get(cfg, "actor_rollout_ref.rollout.n"))
    sp = int(_get(cfg, sp_key) or 1)
    if n_gpus % sp:
        return (sp_key, sp, f"{sp_key}={sp} does not divide the trial's {n_gpus} GPU(s) "
                f"(trainer.n_gpus_per_node x trainer.nnodes)")
    dp = n_gpus // sp
    share = bs * n // dp  # a log-prob pass sees the whole batch
    if mini_key is not None:
        mini = int(_get(cfg, f"{section}.{mini_key}"))
        key = f"{section}.{mini_key}"
        if mini < 1:
            return key, mini, f"{key}={mini} must be at least 1"
        if mini > bs:
            return key, mini, f"{key}={mini} is larger than data.train_batch_size={bs} (both count prompts)"
        if bs % mini:
            return key, mini, (f"{key}={mini} does not divide data.train_batch_size={bs}: verl would pad every batch "
                               f"with dummy sequences up to a multiple of {mini} prompts")
        if (mini * n) % dp:
            return key, mini, (f"{key}={mini} x actor_rollout_ref.rollout.n={n} = {mini * n} samples cannot be split "
                               f"evenly over {dp} data-parallel GPU(s)")
        share = mini * n // dp
    if _get(cfg, f"{section}.{dyn_key}"):
        budget = _get(cfg, f"{section}.{max_len_key}")
        longest = int(_get(cfg, "data.max_prompt_length")) + int(_get(cfg, "data.max_response_length"))
        if budget is not None and int(budget) < longest:
            return (f"{section}.{max_len_key}", budget, f"{section}.{max_len_key}={budget} is below one full "
                    f"sequence (data.max_prompt_length + data.max_response_length = {longest}) with {dyn_key}=true")
        return None
    micro, legacy = _get(cfg, f"{section}.{micro_key}"), _get(cfg, f"{section}.{legacy_micro}")
    key = f"{section}.{micro_key}"
    if micro is None and (legacy is None or section.startswith("actor_rollout_ref.")):
        # verl 0.9.1's actor/rollout/ref workers read only the _per_gpu key (engine_workers.py init_model)
        also = f" (the deprecated {section}.{legacy_micro} is not read by verl's workers)" if legacy is not None else ""
        return key, None, f"{key}=null: set a micro-batch size per GPU (or {section}.{dyn_key}=true){also}"
    if micro is not None and share is not None:
        if int(micro) < 1:
            return key, micro, f"{key}={micro} must be at least 1"
        if share % int(micro):
            return key, micro, f"{key}={micro} does not divide the {share} samples each GPU gets per pass"
    return None


# The top-level reward keys that verl 0.9.1's main_ppo no longer reads (only the fully-async entry point migrates
# them, verl/experimental/reward_loop/reward_loop.py migrate_legacy_reward_impl): legacy prefix -> the key it became.
LEGACY_REWARD_KEYS = {
    "custom_reward_function.path": "reward.custom_reward_function.path",
    "custom_reward_function.name": "reward.custom_reward_function.name",
    "reward_model.enable": "reward.reward_model.enable",
    "reward_model.model.path": "reward.reward_model.model_path",
    "reward_model.reward_manager": "reward.reward_manager.name",
    "reward_model.num_workers": "reward.num_workers",
    "reward_model.": "reward.reward_model.",
    "sandbox_fusion.": "reward.sandbox_fusion.",
}


def _set_leaves(value: Any, key: str) -> list[tuple[str, Any]]:
    """``(dotted key, value)`` of every leaf of a plain container that is not null."""
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _set_leaves(v, f"{key}.{k}")]
    return [] if value is None else [(key, value)]


def _legacy_reward_keys(cfg: Any) -> Problem | None:
    """A legacy top-level reward key that is set: it composes and passes ``validate_config``, and main_ppo never
    reads it (the run would silently score with verl's default reward)."""
    from omegaconf import OmegaConf

    for section in ("custom_reward_function", "reward_model", "sandbox_fusion"):
        node = _get(cfg, section)
        if node is None:
            continue
        for key, value in _set_leaves(OmegaConf.to_container(node, resolve=False), section):
            new = next((n if not o.endswith(".") else n + key[len(o):]) for o, n in LEGACY_REWARD_KEYS.items()
                       if key == o or (o.endswith(".") and key.startswith(o)))
            return key, value, (f"{key}={value!r} is ignored by verl 0.9.1's main_ppo, which reads {new}: "
                                f"set {new} instead")
    return None


def _worker_start_checks(cfg: Any, n_gpus: int) -> Problem | None:
    """What verl 0.9.1's workers assert when they start (``verl/workers/engine_workers.py``
    ``ActorRolloutRefWorker.init_model``), minutes into a trial, after Ray, the model and vLLM have loaded."""
    ar = "actor_rollout_ref"
    actor_dyn = bool(_get(cfg, f"{ar}.actor.use_dynamic_bsz"))
    rollout_dyn = bool(_get(cfg, f"{ar}.rollout.log_prob_use_dynamic_bsz"))
    if actor_dyn != rollout_dyn:
        return (f"{ar}.actor.use_dynamic_bsz", actor_dyn, f"{ar}.actor.use_dynamic_bsz={str(actor_dyn).lower()} but "
                f"{ar}.rollout.log_prob_use_dynamic_bsz={str(rollout_dyn).lower()}: verl's actor worker asserts "
                "they are equal at start-up; set both")
    if actor_dyn:
        needed = [f"{ar}.actor.ppo_max_token_len_per_gpu", f"{ar}.rollout.log_prob_max_token_len_per_gpu"]
        why = "with use_dynamic_bsz=true"
    else:
        needed = [f"{ar}.actor.ppo_micro_batch_size_per_gpu", f"{ar}.rollout.log_prob_micro_batch_size_per_gpu"]
        why = "(the deprecated key without _per_gpu passes validate_config but the workers read only this one)"
    for key in needed:
        if _get(cfg, key) is None:
            return key, None, f"{key}=null: verl's actor worker asserts it is set at start-up {why}"
    rollout = f"{ar}.rollout"
    sizes = {k: int(_get(cfg, f"{rollout}.{k}") or 1)
             for k in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size")}
    infer = sizes["tensor_model_parallel_size"] * sizes["data_parallel_size"] * sizes["pipeline_model_parallel_size"]
    if n_gpus % infer:
        shown = " x ".join(f"{rollout}.{k}={v}" for k, v in sizes.items())
        return (f"{rollout}.tensor_model_parallel_size", sizes["tensor_model_parallel_size"],
                f"{shown} = {infer} GPUs per rollout replica does not divide the trial's {n_gpus} GPU(s)")
    return None


def extra_checks(cfg: Any, use_critic: bool, use_ref: bool) -> Problem | None:
    """What a verl 0.9.1 run would trip over later (or silently pad) that ``validate_config`` lets through."""
    from omegaconf import OmegaConf

    ar = "actor_rollout_ref"
    for key in ("trainer.n_gpus_per_node", "trainer.nnodes", "data.train_batch_size", f"{ar}.rollout.n"):
        v = _get(cfg, key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            return key, v, f"{key}={v!r} must be a positive integer"
    skip = ["reward.reward_model."] if not _get(cfg, "reward.reward_model.enable") else []
    skip += [] if use_critic else ["critic."]
    skip += [] if _get(cfg, "reward_model.enable") else ["reward_model."]
    for key in sorted(OmegaConf.missing_keys(cfg)):
        if not any(key.startswith(s) for s in skip):
            example = "vllm" if key.endswith("rollout.name") else "<value>"
            return key, "???", f"{key} has no value (??? in verl's config): set it, e.g. {key}={example}"
    n_gpus = int(_get(cfg, "trainer.n_gpus_per_node")) * int(_get(cfg, "trainer.nnodes"))
    bs, n = int(_get(cfg, "data.train_batch_size")), int(_get(cfg, f"{ar}.rollout.n"))
    if (bs * n) % n_gpus:
        return ("data.train_batch_size", bs, f"data.train_batch_size={bs} x {ar}.rollout.n={n} = {bs * n} samples "
                f"is not divisible by the trial's {n_gpus} GPU(s)")
    legacy = _legacy_reward_keys(cfg)
    if legacy is not None:
        return legacy
    adv = str(_get(cfg, "algorithm.adv_estimator"))
    if adv in ("grpo", "grpo_passk", "grpo_vectorized", "rloo", "rloo_vectorized", "opo") and n < 2:
        return (f"{ar}.rollout.n", n, f"{ar}.rollout.n={n} with algorithm.adv_estimator={adv}: a group of one "
                "sample per prompt has advantage 0; use n >= 2")
    tp = int(_get(cfg, f"{ar}.rollout.tensor_model_parallel_size") or 1)
    if tp > n_gpus or n_gpus % tp:
        return (f"{ar}.rollout.tensor_model_parallel_size", tp, f"{ar}.rollout.tensor_model_parallel_size={tp} does "
                f"not divide the trial's {n_gpus} GPU(s) (trial.gpus_per_trial)")
    problem = _worker_start_checks(cfg, n_gpus)
    if problem:
        return problem
    actor, sp = f"{ar}.actor", f"{ar}.actor.ulysses_sequence_parallel_size"
    passes = [(actor, "ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu", "ppo_micro_batch_size",
               "use_dynamic_bsz", "ppo_max_token_len_per_gpu", sp),
              (f"{ar}.rollout", None, "log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size",
               "log_prob_use_dynamic_bsz", "log_prob_max_token_len_per_gpu", sp)]
    if use_ref:
        passes.append((f"{ar}.ref", None, "log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size",
                       "log_prob_use_dynamic_bsz", "log_prob_max_token_len_per_gpu",
                       f"{ar}.ref.ulysses_sequence_parallel_size"))
    if use_critic:
        passes.append(("critic", "ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu", "ppo_micro_batch_size",
                       "use_dynamic_bsz", "ppo_max_token_len_per_gpu", "critic.ulysses_sequence_parallel_size"))
    for p in passes:
        problem = _batch_checks(cfg, p[0], n_gpus, *p[1:])
        if problem:
            return problem
    for key in [f"{ar}.actor.optim.lr", *(["critic.optim.lr"] if use_critic else [])]:
        v = _get(cfg, key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            return key, v, f"{key}={v!r} must be a finite number >= 0"
    return None


# ----------------------------------------------------------------------------- what the driver needs to know
def _files(value: Any) -> list[str]:
    from omegaconf import OmegaConf

    if value is None:
        return []
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def _has_key(cfg: Any, key: str) -> bool:
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, key, default="<absent>", throw_on_missing=False) != "<absent>"


def _data_sources(paths: list[str]) -> list[str] | None:
    """The ``data_source`` values of the validation parquet files; None when one is missing or unreadable."""
    sources: set[str] = set()
    for path in paths:
        try:
            import pyarrow.parquet as pq

            table = pq.read_table(os.path.expanduser(path), columns=["data_source"])
        except Exception:  # noqa: BLE001 - not there yet (made by the prepare step) or not a parquet file
            return None
        sources.update(str(s) for s in table.column("data_source").to_pylist())
    return sorted(sources) if paths else None


# Every seed of a verl 0.9.1 run on its default path: the train sampler (verl/trainer/ppo/utils.py, null = unseeded),
# vLLM's sampling (rollout.seed + replica rank, vllm_async_server.py), the actor's and critic's mini-batch shuffling
# (trainer_base.py). The engines' own seeds (fsdp_config.seed) act only with full_determinism.
SEED_KEYS = ("data.seed", "actor_rollout_ref.rollout.seed", "actor_rollout_ref.actor.data_loader_seed",
             "critic.data_loader_seed")


def _first_val_row(paths: list[str]) -> dict[str, Any] | None:
    try:
        import pyarrow.parquet as pq

        rows = pq.read_table(os.path.expanduser(paths[0])).slice(0, 1).to_pylist()
    except Exception:  # noqa: BLE001 - not there yet (made by the prepare step) or not a parquet file
        return None
    return rows[0] if rows else None


def core_variable(cfg: Any, val_files: list[str]) -> str | None:
    """The variable verl names its ``val-core`` metrics after: ``acc`` unless the reward function returns a dict
    without ``acc`` (then ``reward``); None when that cannot be known here.

    verl 0.9.1's reward managers (``experimental/reward_loop/reward_manager/naive.py`` and the others) record a
    float score as ``acc`` too, and ``_val_metrics_update`` makes ``acc`` the core variable whenever it is there.
    A custom function (``reward.custom_reward_function``, loaded with verl's own ``get_custom_reward_fn``) is called
    once on the first validation row to see what it returns; verl's default scorer returns a float or a dict with
    ``acc``."""
    from verl.trainer.ppo.reward import get_custom_reward_fn

    path = _get(cfg, "reward.custom_reward_function.path")
    if path and not os.path.isfile(os.path.expanduser(str(path))):
        return None  # not written yet (a prepare step's file), missing, or a FIFO/device: never opened here
    try:
        fn = get_custom_reward_fn(cfg)
    except Exception as err:  # noqa: BLE001 - the user's file: a syntax error, a missing import, a missing name
        raise ReasonedLoadError(f"reward.custom_reward_function: {path} does not load: {load_error(err)}") from None
    if fn is None:
        return "acc"
    row = _first_val_row(val_files)
    if row is None:
        return None
    truth = (row.get("reward_model") or {}).get("ground_truth")
    try:
        result = fn(data_source=row.get("data_source"), solution_str="", ground_truth=truth,
                    extra_info=row.get("extra_info") or {})
    except Exception:  # noqa: BLE001 - the function's own failure shows in the trial; here it is just unknown
        return None
    return "reward" if isinstance(result, dict) and "acc" not in result else "acc"


def describe(cfg: Any, use_critic: bool, use_ref: bool) -> dict[str, Any]:
    val_files = _files(_get(cfg, "data.val_files"))
    steps = _get(cfg, "trainer.total_training_steps")
    override = _get(cfg, "actor_rollout_ref.model.override_config") or {}
    return {
        "rollout_name": str(_get(cfg, "actor_rollout_ref.rollout.name")),
        "strategy": str(_get(cfg, "actor_rollout_ref.actor.strategy")),
        # workers/config/model.py: HFModelConfig loads the actor and reference with this (default flash_attention_2)
        "attn_implementation": str(override.get("attn_implementation", "flash_attention_2")),
        "val_core_var": core_variable(cfg, val_files),
        "seed_keys": [k for k in SEED_KEYS if _has_key(cfg, k)],
        "val_n": int(_get(cfg, "actor_rollout_ref.rollout.val_kwargs.n") or 1),
        "data_sources": _data_sources(val_files),
        "total_training_steps": None if steps is None else int(steps),
        "test_freq": int(_get(cfg, "trainer.test_freq")),
        "save_freq": int(_get(cfg, "trainer.save_freq")),
        "val_before_train": bool(_get(cfg, "trainer.val_before_train")),
        "n_gpus": int(_get(cfg, "trainer.n_gpus_per_node")) * int(_get(cfg, "trainer.nnodes")),
        "use_critic": use_critic,
        "use_reference_policy": use_ref,
        "adv_estimator": str(_get(cfg, "algorithm.adv_estimator")),
        "use_kl_loss": bool(_get(cfg, "actor_rollout_ref.actor.use_kl_loss")),
        "use_kl_in_reward": bool(_get(cfg, "algorithm.use_kl_in_reward")),
        "reward_model_enable": bool(_get(cfg, "reward.reward_model.enable") or _get(cfg, "reward_model.enable")),
        "train_files": _files(_get(cfg, "data.train_files")),
        "val_files": val_files,
    }


# ----------------------------------------------------------------------------- prompt lengths
def _tokenizer_source(path: str) -> str | None:
    """A local directory with the tokenizer of verl model path ``path``: the directory itself, else the newest
    snapshot of the Hugging Face cache (``$HF_HUB_CACHE``, ``$HF_HOME/hub``) holding a tokenizer; None: neither."""
    local = os.path.expanduser(path)
    if os.path.isdir(local):
        return local
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(os.environ.get("HF_HOME", "~/.cache/huggingface"), "hub")
    snapshots = os.path.join(os.path.expanduser(hub), "models--" + path.replace("/", "--"), "snapshots")
    found = sorted((os.path.join(snapshots, d) for d in (os.listdir(snapshots) if os.path.isdir(snapshots) else [])
                    if os.path.isfile(os.path.join(snapshots, d, "tokenizer_config.json"))), key=os.path.getmtime)
    return found[-1] if found else None


def prompt_lengths(tokenizer: Any, paths: list[str], prompt_key: str, rows: int,
                   chat_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Token counts of the first ``rows`` prompts of the parquet files ``paths`` as verl's ``RLHFDataset`` makes them
    (``apply_chat_template(messages, add_generation_prompt=True)``; a plain string prompt is tokenized as it is):
    ``{"mean", "max", "rows", "file"}``; ``{"error": ONE LINE}`` naming the file and row that fails."""
    import pyarrow.parquet as pq

    counts: list[int] = []
    for path in paths:
        table = pq.read_table(os.path.expanduser(path))
        if prompt_key not in table.column_names:
            return {"error": f"{path}: no column {prompt_key!r} (data.prompt_key); its columns: "
                             f"{', '.join(table.column_names)}"}
        for i, prompt in enumerate(table.column(prompt_key).slice(0, rows - len(counts)).to_pylist()):
            try:
                if isinstance(prompt, str):
                    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
                else:
                    ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                        **(chat_kwargs or {}))
                    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            except Exception as err:  # noqa: BLE001 - a row verl's dataset would fail on too
                return {"error": f"{path} row {i}: {prompt_key!r} cannot be tokenized with the model's chat template "
                                 f"({type(err).__name__}: {_one_line(str(err))[:300]})"}
            counts.append(len(ids))
        if len(counts) >= rows:
            break
    if not counts:
        return {"error": f"{', '.join(paths)}: no rows"}
    return {"mean": sum(counts) / len(counts), "max": max(counts), "rows": len(counts), "file": paths[0]}


def _token_ids(tokenizer: Any, prompt: Any, chat: dict[str, Any]) -> list[int]:
    """``prompt``'s token ids as verl's ``RLHFDataset`` makes them (a chat through the template, a string as it is)."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, **chat)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def _byte_bound(tokenizer: Any, prompt: Any, chat: dict[str, Any], overheads: dict[Any, int]) -> int:
    """An upper bound of ``prompt``'s token count without tokenizing it: a byte-level or byte-fallback tokenizer
    makes at most one token per UTF-8 byte of text, plus one per message for a word-start marker, plus the chat
    template's own tokens (measured once per sequence of roles, with empty contents)."""
    if isinstance(prompt, str):
        return len(prompt.encode("utf-8", "replace")) + 1
    if not isinstance(prompt, list) or not all(isinstance(m, dict) for m in prompt):
        return 1 << 30  # not a chat verl can read: tokenized, and its error named
    roles = tuple(str(m.get("role")) for m in prompt)
    if roles not in overheads:
        try:
            overheads[roles] = len(_token_ids(tokenizer, [{"role": r, "content": ""} for r in roles], chat))
        except Exception:  # noqa: BLE001 - a template that refuses empty turns: tokenize these rows
            overheads[roles] = 1 << 30
    text = sum(len(str(m.get("content") or "").encode("utf-8", "replace")) + 2 for m in prompt)
    return overheads[roles] + text


OVERLONG_TOKENIZED_CAP = 20_000  # rows tokenized at most by the length check (the byte bound clears the rest)


def overlong_prompts(tokenizer: Any, paths: list[str], prompt_key: str, limit: int,
                     chat: dict[str, Any] | None = None, batch_rows: int = 65_536,
                     cap: int = OVERLONG_TOKENIZED_CAP) -> dict[str, Any]:
    """Every prompt of ``paths`` longer than ``limit`` tokens (``data.max_prompt_length``), read one column in
    batches (bounded memory); only rows whose byte bound (:func:`_byte_bound`) exceeds ``limit`` are tokenized, at
    most ``cap`` of them. ``{"rows": N read, "tokenized": K, "count": over, "first": [[file, row, tokens], ...3],
    "longest": [file, row, tokens] or None, "capped": bool}``."""
    import pyarrow.parquet as pq

    chat = chat or {}
    overheads: dict[Any, int] = {}
    out: dict[str, Any] = {"rows": 0, "tokenized": 0, "count": 0, "first": [], "longest": None, "capped": False}
    for path in paths:
        local = os.path.expanduser(path)
        try:
            pf = pq.ParquetFile(local)
            if prompt_key not in pf.schema_arrow.names:
                continue  # the column check names it
            batches = pf.iter_batches(batch_size=batch_rows, columns=[prompt_key])
        except Exception:  # noqa: BLE001 - not parquet: the data check names it
            continue
        row = 0
        for batch in batches:
            for prompt in batch.column(0).to_pylist():
                if _byte_bound(tokenizer, prompt, chat, overheads) > limit:
                    if out["tokenized"] >= cap:
                        out["capped"] = True
                    else:
                        out["tokenized"] += 1
                        try:
                            n = len(_token_ids(tokenizer, prompt, chat))
                        except Exception:  # noqa: BLE001 - the first rows' measurement names such a row
                            n = 0
                        if n > limit:
                            out["count"] += 1
                            if len(out["first"]) < 3:
                                out["first"].append([path, row, n])
                            if out["longest"] is None or n > out["longest"][2]:
                                out["longest"] = [path, row, n]
                row += 1
        out["rows"] += row
    return out


def chat_kwargs(cfg: Any) -> dict[str, Any]:
    """``data.apply_chat_template_kwargs`` as a plain dict (what verl's dataset passes to ``apply_chat_template``)."""
    from omegaconf import OmegaConf

    kwargs = _get(cfg, "data.apply_chat_template_kwargs")
    return OmegaConf.to_container(kwargs, resolve=True) if OmegaConf.is_config(kwargs) else dict(kwargs or {})


def measure_prompts(cfg: Any, rows: int) -> dict[str, Any]:
    """:func:`prompt_lengths` of ``data.train_files`` with the tokenizer of ``actor_rollout_ref.model.path`` (a local
    directory or the Hugging Face cache; nothing is downloaded); ``{"error": ...}`` when either is missing."""
    path = str(_get(cfg, "actor_rollout_ref.model.tokenizer_path") or _get(cfg, "actor_rollout_ref.model.path"))
    source = _tokenizer_source(path)
    if source is None:
        return {"error": f"no tokenizer of {path!r} here (no local directory, not in the Hugging Face cache)"}
    files = [f for f in _files(_get(cfg, "data.train_files")) if os.path.isfile(os.path.expanduser(f))]
    if not files:
        return {"error": "data.train_files: not there yet"}
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    except Exception as err:  # noqa: BLE001 - a broken tokenizer directory: no measurement
        return {"error": f"tokenizer of {path!r}: {type(err).__name__}: {_one_line(str(err))[:300]}"}
    prompt_key = str(_get(cfg, "data.prompt_key") or "prompt")
    measured = {**prompt_lengths(tokenizer, files, prompt_key, rows, chat_kwargs(cfg)), "tokenizer": source}
    limit = _get(cfg, "data.max_prompt_length")
    if isinstance(limit, int) and limit > 0 and "error" not in measured:
        every = files + [f for f in _files(_get(cfg, "data.val_files")) if os.path.isfile(os.path.expanduser(f))]
        measured["overlong"] = {**overlong_prompts(tokenizer, list(dict.fromkeys(every)), prompt_key, limit,
                                                   chat_kwargs(cfg)),
                                "limit": limit, "truncation": str(_get(cfg, "data.truncation") or "error"),
                                "filter": bool(_get(cfg, "data.filter_overlong_prompts"))}
    return measured


# ----------------------------------------------------------------------------- compose + validate
def _culprit(message: str, overrides: list[str]) -> tuple[str | None, str | None]:
    """The override a hydra error message names (``'key'`` in quotes), as (key, value)."""
    for o in overrides:
        key, _, value = o.partition("=")
        bare = key.lstrip("+~")
        if re.search(rf"['\"]{re.escape(bare)}['\"]", message) or re.search(rf"\b{re.escape(o)}\b", message):
            return bare, value
    return None, None


def _compose_error(err: Exception, overrides: list[str]) -> dict[str, Any]:
    """Hydra's composition error as one line naming the override."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    text = _one_line(f"{err} {err.__cause__ or ''}")
    text = re.sub(r"\s*full_key: \S+", "", text)
    key, value = _culprit(text, overrides)
    if key is None:  # a syntax error names no key: find the override hydra cannot parse
        parser = OverridesParser.create()
        for o in overrides:
            try:
                parser.parse_override(o)
            except Exception as bad:  # noqa: BLE001 - hydra's OverrideParseException
                key, _, value = o.partition("=")
                return {"ok": False, "key": key.lstrip("+~"), "value": value,
                        "message": f"override '{o}': not hydra override syntax ({_one_line(str(bad))})"}
        return {"ok": False, "key": None, "value": None, "message": text}
    if "is not in struct" in text:
        text = f"{key} is not a key of verl's config (add a new key with +{key}={value})"
    elif "already at" in text:
        text = f"{key} is already in verl's config: set it without '+' (or with '++')"
    return {"ok": False, "key": key, "value": value, "message": f"override '{key}={value}': {text}"}


def select(cfg: Any, keys: list[str]) -> dict[str, Any]:
    """``{key: value}`` of the composed config, as plain JSON values (a missing or unresolvable key is None)."""
    from omegaconf import OmegaConf

    out: dict[str, Any] = {}
    for key in keys:
        try:
            value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
            if OmegaConf.is_config(value):
                value = OmegaConf.to_container(value, resolve=True)
        except Exception:  # noqa: BLE001 - an interpolation that does not resolve: unknown to the estimate
            value = None
        out[key] = value if value != "???" else None
    return out


def check_corner(compose: Any, validate: Any, name: str, overrides: list[str],
                 keys: list[str] | None = None, measure_rows: int = 0) -> dict[str, Any]:
    """One corner: ``{"ok": true, "info": ...[, "selected": ...]}`` or ``{"ok": false, "key", "value", "message"}``."""
    try:
        cfg = compose(config_name=name, overrides=overrides)
    except Exception as err:  # noqa: BLE001 - hydra's errors: unknown key, bad syntax, bad value type
        return _compose_error(err, overrides)
    validate_config, need_critic, need_reference_policy = validate()
    try:
        use_critic, use_ref = bool(need_critic(cfg)), bool(need_reference_policy(cfg))
        problem = extra_checks(cfg, use_critic, use_ref)
        if problem is None:
            validate_config(cfg, use_reference_policy=use_ref, use_critic=use_critic)
    except Exception as err:  # noqa: BLE001 - verl raises AssertionError, ValueError, InstantiationException
        cause = err.__cause__ or err.__context__
        text = _one_line(f"{err}" + (f" ({cause})" if cause and str(cause) not in str(err) else ""))
        text = re.sub(r"^Error in call to target '[\w.]+': ", "", text)  # hydra's InstantiationException
        return {"ok": False, "key": None, "value": None,
                "message": f"verl's validate_config: {type(err).__name__}: {text}"}
    if problem is not None:
        key, value, message = problem
        return {"ok": False, "key": key, "value": json.dumps(value), "message": message}
    try:
        result = {"ok": True, "info": describe(cfg, use_critic, use_ref)}
    except ReasonedLoadError as err:
        return {"ok": False, "key": "reward.custom_reward_function.path", "value": None, "message": str(err)}
    if keys:
        result["selected"] = select(cfg, keys)
    if measure_rows:
        result["prompt_lengths"] = measure_prompts(cfg, measure_rows)
    return result


def probe_interpreter() -> dict[str, Any]:
    """What this interpreter can run a verl trial with, found without importing anything heavy: torch's CUDA
    build (``cuda = '12.8'`` in ``torch/version.py``; None for a CPU wheel), whether vLLM, SGLang and
    flash-attn are installed, the version verl reads for vLLM (the ``vllm`` distribution's: ``+cpu`` for the CPU
    build's alias) and whether the CPU platform plugin (``plugins/verl-cpu``) is there."""
    def has(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            return False

    torch_version, cuda = None, None
    spec = importlib.util.find_spec("torch")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            text = open(os.path.join(folder, "version.py")).read()
        except OSError:
            continue
        m = re.search(r"^__version__\s*=\s*'([^']*)'", text, re.M)
        torch_version = m.group(1) if m else None
        m = re.search(r"^cuda(?::[^=]*)?=\s*'([^']*)'", text, re.M)
        cuda = m.group(1) if m else None
        break
    try:
        vllm_version: str | None = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        vllm_version = None
    return {"python": sys.executable, "torch": torch_version, "torch_cuda": cuda, "vllm": has("vllm"),
            "vllm_version": vllm_version, "sglang": has("sglang"), "flash_attn": has("flash_attn"),
            "verl": has("verl"), "verl_cpu_platform": has("verl_cpu_platform")}


def run(request: dict[str, Any]) -> dict[str, Any]:
    if request.get("probe_only"):
        return {"status": "ok", "results": [], "interpreter": probe_interpreter()}
    spec = importlib.util.find_spec("verl")
    if spec is None or importlib.util.find_spec("hydra") is None:
        return {"status": "missing", "message": "verl is not installed in this interpreter"}
    from hydra import compose, initialize_config_dir

    config_dir = request.get("config_dir") or os.path.join(list(spec.submodule_search_locations or [])[0],
                                                           "trainer", "config")
    name = request["config_name"]
    if not any(os.path.isfile(os.path.join(config_dir, name + ext)) for ext in (".yaml", ".yml", "")):
        return {"status": "error", "message": f"config {name!r}: not found in {config_dir}"}
    imported: list[Any] = []

    def validate() -> Any:  # verl's own checks import torch: once, after the first compose
        if not imported:
            from verl.trainer.ppo.utils import need_critic, need_reference_policy
            from verl.utils.config import validate_config

            imported.extend((validate_config, need_critic, need_reference_policy))
        return imported

    results = []
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        for i, overrides in enumerate(request["corners"]):
            started = time.monotonic()
            # the prompts are the same in every corner unless a corner sets the data or the model: measured once
            result = check_corner(compose, validate, name, list(overrides), request.get("select"),
                                  int(request.get("measure_prompts") or 0) if i == 0 else 0)
            result["seconds"] = round(time.monotonic() - started, 3)
            results.append(result)
    return {"status": "ok", "results": results, "interpreter": probe_interpreter()}


def serve(handler: Any) -> int:
    """Answer the JSON request on stdin with ``handler(request)`` as the one line on the real stdout (verl, hydra and
    transformers print to stderr meanwhile); anything unexpected is still one ``{"status": "error"}`` line."""
    reply_to = sys.stdout
    sys.stdout = sys.stderr
    try:
        reply = handler(json.load(sys.stdin))
    except Exception as err:  # noqa: BLE001 - anything unexpected is still one line for the driver
        reply = {"status": "error", "message": f"{type(err).__name__}: {_one_line(str(err))[:500]}"}
    reply_to.write(json.dumps(reply) + "\n")
    reply_to.flush()
    return 0


if __name__ == "__main__":
    sys.exit(serve(run))
