"""What verl's interpreter makes of one composed corner for ``_compose.py`` (its neighbour): the checks verl does
not make (:func:`extra_checks`: what a verl 0.9.1 run would trip over later, or silently pad, that ``validate_config``
lets through) and what the driver needs to know of the config (:func:`describe`, with :data:`SEED_KEYS` and the
reward function's core variable, :func:`core_variable`).

Run in verl's interpreter it imports nothing of the project (its neighbour ``_compose_data`` is on ``sys.path``);
the driver imports it as ``hpo.backends.verl._compose_checks`` for :data:`SEED_KEYS` and for the batch rules
(:func:`batch_rules`), which it runs itself over the values it knows before a trial is launched
(``hpo.backends.verl._batch``).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from typing import Any

if __package__:  # imported by the driver (hpo.backends.verl._compose_checks)
    from ._compose_data import _data_sources, _files, _first_val_row, _get, _one_line
else:  # run in verl's interpreter: the neighbour is on sys.path
    from _compose_data import _data_sources, _files, _first_val_row, _get, _one_line  # type: ignore[no-redef]

Problem = tuple[str, Any, str]  # (key, value, message naming both)


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


# ----------------------------------------------------------------------------- checks verl does not make
# The batch rules read the config through ``get`` (a dotted key -> its composed value): here ``_get`` of the composed
# config; in the driver, the values it knows before anything is composed (``hpo.backends.verl._batch``), whose ``get``
# raises :class:`UnknownValue` for a value it cannot know. Each rule stands alone (none assumes another passed), so a
# rule that reads an unknown value is skipped and the others still answer (:func:`first_problem`).
Get = Callable[[str], Any]
Rule = Callable[[Get], "Problem | None"]
AR = "actor_rollout_ref"


class UnknownValue(LookupError):
    """A value the driver cannot know without composing the config (``get`` of ``hpo.backends.verl._batch``)."""


def _n_gpus(get: Get) -> int:
    return int(get("trainer.n_gpus_per_node")) * int(get("trainer.nnodes"))


def _batch_checks(get: Get, section: str, mini_key: str | None, micro_key: str, legacy_micro: str,
                  dyn_key: str, max_len_key: str, sp_key: str) -> Problem | None:
    """One pass's batch arithmetic: an update (``mini_key`` set: actor, critic) or a log-prob pass over the whole
    batch (rollout, ref). Without dynamic batching the mini-batch divides the batch and splits evenly over the
    data-parallel GPUs (the trial's GPUs / sequence parallelism ``sp_key``), and the micro-batch divides each GPU's
    share, as verl's ``prepare_micro_batches`` asserts at run time; with dynamic batching the token budget
    holds at least one full sequence."""
    n_gpus = _n_gpus(get)
    bs = int(get("data.train_batch_size"))
    n = int(get(f"{AR}.rollout.n"))
    sp = int(get(sp_key) or 1)
    if n_gpus % sp:
        return (sp_key, sp, f"{sp_key}={sp} does not divide the trial's {n_gpus} GPU(s) "
                f"(trainer.n_gpus_per_node x trainer.nnodes)")
    dp = n_gpus // sp
    share = bs * n // dp  # a log-prob pass sees the whole batch
    if mini_key is not None:
        mini = int(get(f"{section}.{mini_key}"))
        key = f"{section}.{mini_key}"
        if mini < 1:
            return key, mini, f"{key}={mini} must be at least 1"
        if mini > bs:
            return key, mini, f"{key}={mini} is larger than data.train_batch_size={bs} (both count prompts)"
        if bs % mini:
            return key, mini, (f"{key}={mini} does not divide data.train_batch_size={bs}: verl would pad every batch "
                               f"with dummy sequences up to a multiple of {mini} prompts")
        if (mini * n) % dp:
            return key, mini, (f"{key}={mini} x {AR}.rollout.n={n} = {mini * n} samples cannot be split "
                               f"evenly over {dp} data-parallel GPU(s)")
        share = mini * n // dp
    if get(f"{section}.{dyn_key}"):
        budget = get(f"{section}.{max_len_key}")
        longest = int(get("data.max_prompt_length")) + int(get("data.max_response_length"))
        if budget is not None and int(budget) < longest:
            return (f"{section}.{max_len_key}", budget, f"{section}.{max_len_key}={budget} is below one full "
                    f"sequence (data.max_prompt_length + data.max_response_length = {longest}) with {dyn_key}=true")
        return None
    micro, legacy = get(f"{section}.{micro_key}"), get(f"{section}.{legacy_micro}")
    key = f"{section}.{micro_key}"
    if micro is None and (legacy is None or section.startswith(f"{AR}.")):
        # verl 0.9.1's actor/rollout/ref workers read only the _per_gpu key (engine_workers.py init_model)
        also = f" (the deprecated {section}.{legacy_micro} is not read by verl's workers)" if legacy is not None else ""
        return key, None, f"{key}=null: set a micro-batch size per GPU (or {section}.{dyn_key}=true){also}"
    if micro is not None and share is not None:
        if int(micro) < 1:
            return key, micro, f"{key}={micro} must be at least 1"
        if share % int(micro):
            return key, micro, f"{key}={micro} does not divide the {share} samples each GPU gets per pass"
    return None


def _positive(key: str) -> Rule:
    def rule(get: Get) -> Problem | None:
        v = get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            return key, v, f"{key}={v!r} must be a positive integer"
        return None
    return rule


def _samples_per_gpu(get: Get) -> Problem | None:
    """Every GPU gets as many samples of a step (``verl/utils/config.py`` asserts it without dynamic batching; its
    data-parallel dispatch needs it always)."""
    n_gpus = _n_gpus(get)
    bs, n = int(get("data.train_batch_size")), int(get(f"{AR}.rollout.n"))
    if (bs * n) % n_gpus:
        return ("data.train_batch_size", bs, f"data.train_batch_size={bs} x {AR}.rollout.n={n} = {bs * n} samples "
                f"is not divisible by the trial's {n_gpus} GPU(s)")
    return None


def _group_size(get: Get) -> Problem | None:
    adv, n = str(get("algorithm.adv_estimator")), int(get(f"{AR}.rollout.n"))
    if adv in ("grpo", "grpo_passk", "grpo_vectorized", "rloo", "rloo_vectorized", "opo") and n < 2:
        return (f"{AR}.rollout.n", n, f"{AR}.rollout.n={n} with algorithm.adv_estimator={adv}: a group of one "
                "sample per prompt has advantage 0; use n >= 2")
    return None


def _rollout_tp(get: Get) -> Problem | None:
    n_gpus = _n_gpus(get)
    tp = int(get(f"{AR}.rollout.tensor_model_parallel_size") or 1)
    if tp > n_gpus or n_gpus % tp:
        return (f"{AR}.rollout.tensor_model_parallel_size", tp, f"{AR}.rollout.tensor_model_parallel_size={tp} does "
                f"not divide the trial's {n_gpus} GPU(s) (trial.gpus_per_trial)")
    return None


def _same_dynamic_bsz(get: Get) -> Problem | None:
    """verl 0.9.1's actor worker asserts at start-up (``verl/workers/engine_workers.py``
    ``ActorRolloutRefWorker.init_model``), minutes into a trial, after Ray, the model and vLLM have loaded, that the
    actor and the rollout batch alike and that the keys of that batching are set."""
    actor_dyn = bool(get(f"{AR}.actor.use_dynamic_bsz"))
    rollout_dyn = bool(get(f"{AR}.rollout.log_prob_use_dynamic_bsz"))
    if actor_dyn != rollout_dyn:
        return (f"{AR}.actor.use_dynamic_bsz", actor_dyn, f"{AR}.actor.use_dynamic_bsz={str(actor_dyn).lower()} but "
                f"{AR}.rollout.log_prob_use_dynamic_bsz={str(rollout_dyn).lower()}: verl's actor worker asserts "
                "they are equal at start-up; set both")
    if actor_dyn:
        needed = [f"{AR}.actor.ppo_max_token_len_per_gpu", f"{AR}.rollout.log_prob_max_token_len_per_gpu"]
        why = "with use_dynamic_bsz=true"
    else:
        needed = [f"{AR}.actor.ppo_micro_batch_size_per_gpu", f"{AR}.rollout.log_prob_micro_batch_size_per_gpu"]
        why = "(the deprecated key without _per_gpu passes validate_config but the workers read only this one)"
    for key in needed:
        if get(key) is None:
            return key, None, f"{key}=null: verl's actor worker asserts it is set at start-up {why}"
    return None


def _rollout_replica(get: Get) -> Problem | None:
    n_gpus = _n_gpus(get)
    rollout = f"{AR}.rollout"
    sizes = {k: int(get(f"{rollout}.{k}") or 1)
             for k in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size")}
    infer = sizes["tensor_model_parallel_size"] * sizes["data_parallel_size"] * sizes["pipeline_model_parallel_size"]
    if n_gpus % infer:
        shown = " x ".join(f"{rollout}.{k}={v}" for k, v in sizes.items())
        return (f"{rollout}.tensor_model_parallel_size", sizes["tensor_model_parallel_size"],
                f"{shown} = {infer} GPUs per rollout replica does not divide the trial's {n_gpus} GPU(s)")
    return None


def _pass(section: str, mini_key: str | None, prefix: str, sp_key: str) -> Rule:
    """The batch arithmetic of one pass (:func:`_batch_checks`): an update's keys (``ppo_``) or a log-prob pass's."""
    keys = (("ppo_micro_batch_size_per_gpu", "ppo_micro_batch_size", "use_dynamic_bsz", "ppo_max_token_len_per_gpu")
            if prefix == "ppo" else ("log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size",
                                     "log_prob_use_dynamic_bsz", "log_prob_max_token_len_per_gpu"))
    return lambda get: _batch_checks(get, section, mini_key, *keys, sp_key)


def batch_rules(use_critic: bool, use_ref: bool) -> list[Rule]:
    """verl 0.9.1's batch arithmetic that ``validate_config`` lets through (it fails later, or pads silently), in the
    order :func:`extra_checks` asks: the sizes are positive integers, every GPU gets as many samples, a GRPO-like
    group has two samples or more, the rollout's tensor parallelism and replicas divide the GPUs, the actor and rollout
    batch alike (:func:`_same_dynamic_bsz`), and each pass's batches divide (:func:`_batch_checks`: the actor's
    update, the rollout's and the reference's log-prob passes, the critic's update)."""
    actor_sp = f"{AR}.actor.ulysses_sequence_parallel_size"
    rules = [*(_positive(k) for k in ("trainer.n_gpus_per_node", "trainer.nnodes", "data.train_batch_size",
                                      f"{AR}.rollout.n")),
             _samples_per_gpu, _group_size, _rollout_tp, _same_dynamic_bsz, _rollout_replica,
             _pass(f"{AR}.actor", "ppo_mini_batch_size", "ppo", actor_sp),
             _pass(f"{AR}.rollout", None, "log_prob", actor_sp)]
    if use_ref:
        rules.append(_pass(f"{AR}.ref", None, "log_prob", f"{AR}.ref.ulysses_sequence_parallel_size"))
    if use_critic:
        rules.append(_pass("critic", "ppo_mini_batch_size", "ppo", "critic.ulysses_sequence_parallel_size"))
    return rules


def first_problem(rules: list[Rule], get: Get, unsure: tuple[type[Exception], ...] = (UnknownValue,)
                  ) -> Problem | None:
    """The first rule's problem; a rule that raises one of ``unsure`` (a value not known) says nothing."""
    for rule in rules:
        try:
            problem = rule(get)
        except unsure:
            continue
        if problem is not None:
            return problem
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


def extra_checks(cfg: Any, use_critic: bool, use_ref: bool) -> Problem | None:
    """What a verl 0.9.1 run would trip over later (or silently pad) that ``validate_config`` lets through: a required
    value left ``???``, a legacy reward key main_ppo never reads, the batch arithmetic (:func:`batch_rules`) and
    the learning rates."""
    from omegaconf import OmegaConf

    def get(key: str) -> Any:
        return _get(cfg, key)

    problem = first_problem(batch_rules(False, False)[:4], get)  # positive sizes: what the rest divides by
    if problem:
        return problem
    skip = ["reward.reward_model."] if not _get(cfg, "reward.reward_model.enable") else []
    skip += [] if use_critic else ["critic."]
    skip += [] if _get(cfg, "reward_model.enable") else ["reward_model."]
    for key in sorted(OmegaConf.missing_keys(cfg)):
        if not any(key.startswith(s) for s in skip):
            example = "vllm" if key.endswith("rollout.name") else "<value>"
            return key, "???", f"{key} has no value (??? in verl's config): set it, e.g. {key}={example}"
    legacy = _legacy_reward_keys(cfg)
    if legacy is not None:
        return legacy
    problem = first_problem(batch_rules(use_critic, use_ref)[4:], get)
    if problem:
        return problem
    for key in [f"{AR}.actor.optim.lr", *(["critic.optim.lr"] if use_critic else [])]:
        v = _get(cfg, key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            return key, v, f"{key}={v!r} must be a finite number >= 0"
    return None


# ----------------------------------------------------------------------------- what the driver needs to know
def _has_key(cfg: Any, key: str) -> bool:
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, key, default="<absent>", throw_on_missing=False) != "<absent>"


# Every seed of a verl 0.9.1 run on its default path: the train sampler (verl/trainer/ppo/utils.py, null = unseeded),
# vLLM's sampling (rollout.seed + replica rank, vllm_async_server.py), the actor's and critic's mini-batch shuffling
# (trainer_base.py). The engines' own seeds (fsdp_config.seed) act only with full_determinism.
SEED_KEYS = ("data.seed", "actor_rollout_ref.rollout.seed", "actor_rollout_ref.actor.data_loader_seed",
             "critic.data_loader_seed")


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
    key = (str(path), str(_get(cfg, "reward.custom_reward_function.name")), tuple(val_files))
    if key not in _CORE_VARS:  # one call for every corner: the function does not change between them
        limit = call_limit()
        try:
            result = _bounded(limit, fn, data_source=row.get("data_source"), solution_str="", ground_truth=truth,
                              extra_info=row.get("extra_info") or {})
            _CORE_VARS[key] = "reward" if isinstance(result, dict) and "acc" not in result else "acc"
        except TimeoutError:
            _CORE_VARS[key] = ReasonedLoadError(
                f"reward.custom_reward_function: the reward function {path} did not return within {limit:g} s (the "
                f"limit of one call, VERL_HPO_REWARD_CALL_TIMEOUT_S) on the first row of {val_files[0]} (ground truth "
                f"{str(truth)[:60]!r}): does it loop or wait on something?")
        except Exception:  # noqa: BLE001 - the function's own failure: the row check names it; here it is unknown
            _CORE_VARS[key] = None
    found = _CORE_VARS[key]
    if isinstance(found, ReasonedLoadError):
        raise found
    return found


_CORE_VARS: dict[Any, Any] = {}  # core_variable's answer (or its error) per reward function and validation files
CALL_LIMIT_ENV = "VERL_HPO_REWARD_CALL_TIMEOUT_S"  # seconds one call of the user's reward function may take here


def call_limit(default: float = 30.0) -> float:
    """:data:`CALL_LIMIT_ENV` (the driver refuses a bad value before it runs this), else ``default``."""
    try:
        value = float(os.environ.get(CALL_LIMIT_ENV) or default)
    except ValueError:
        return default
    return value if 0 < value < math.inf else default


class _Expired(BaseException):
    """SIGALRM in :func:`_bounded`."""


def _bounded(seconds: float, fn: Any, **kwargs: Any) -> Any:
    """``fn(**kwargs)`` (awaited when it is a coroutine), TimeoutError after ``seconds`` (a SIGALRM: the main
    thread only, as verl's interpreter runs this)."""
    import asyncio
    import inspect
    import signal

    def expired(signum: int, frame: Any) -> None:
        raise _Expired

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        result = fn(**kwargs)
        return asyncio.run(result) if inspect.iscoroutine(result) else result
    except _Expired:
        raise TimeoutError from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


ESTIMATOR_KEYS = ("gamma", "lam")  # algorithm keys that only the advantage estimator reads


def estimator_reads(adv: str) -> list[str] | None:
    """Which of :data:`ESTIMATOR_KEYS` (``algorithm.gamma``, ``algorithm.lam``) the advantage estimator ``adv``
    reads, from verl 0.9.1's code: ``compute_advantage`` gives GAE both and GRPO neither; any other registered
    estimator gets the algorithm config and reads what its function's body names. None when it cannot be told here
    (an estimator this verl does not register, or one that hands the config on to another function)."""
    if adv in ("gae", "grpo"):
        return list(ESTIMATOR_KEYS) if adv == "gae" else []
    import ast
    import inspect
    import textwrap

    try:
        from verl.trainer.ppo.core_algos import get_adv_estimator_fn

        tree = ast.parse(textwrap.dedent(inspect.getsource(get_adv_estimator_fn(adv))))
    except Exception:  # noqa: BLE001 - not registered here (a user's own estimator), no source
        return None
    body = [node for stmt in tree.body[0].body for node in ast.walk(stmt)]  # type: ignore[attr-defined]
    for node in body:
        if isinstance(node, ast.Call) and any(isinstance(a, ast.Name) and a.id == "config"
                                              for a in [*node.args, *(k.value for k in node.keywords)]):
            return None  # the config handed on: what the callee reads is not looked into
    named = {n.attr for n in body if isinstance(n, ast.Attribute)}
    named |= {n.value for n in body if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return [k for k in ESTIMATOR_KEYS if k in named]


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
        "adv_reads": estimator_reads(str(_get(cfg, "algorithm.adv_estimator"))),
        "use_kl_loss": bool(_get(cfg, "actor_rollout_ref.actor.use_kl_loss")),
        "use_kl_in_reward": bool(_get(cfg, "algorithm.use_kl_in_reward")),
        "reward_model_enable": bool(_get(cfg, "reward.reward_model.enable") or _get(cfg, "reward_model.enable")),
        "train_files": _files(_get(cfg, "data.train_files")),
        "val_files": val_files,
    }
