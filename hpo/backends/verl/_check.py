"""Checks of a verl space with verl's own code, before a study is created (:func:`check_verl_space`): no driver key
set by the space, every corner composed and validated in verl's interpreter, the data files, the metric names verl
logs (:func:`check_verl_metrics`) and no tuned key that no worker reads (:func:`unread_tuned`). Nothing here imports
torch, hydra or verl.

What the checks stand on lives beside this module, and the names it has always offered stay importable from here:
``_composer`` runs ``hpo/backends/verl/_compose.py`` in verl's interpreter (:func:`compose_corners`,
:class:`ComposedConfig`, :class:`VerlConfigError`, :func:`compose_timeout`), ``_metric_names`` says which metrics
verl logs (:func:`verl_metric_ok`), and ``_interpreter`` whether the interpreter can run the trials where they will
run, a GPU or the CPU (:func:`check_verl_launch`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hpo.backends.verl._composer import (
    COMPOSE_SCRIPT,
    COMPOSE_TIMEOUT_ENV,
    COMPOSE_TIMEOUT_S,
    ComposedConfig,
    ComposeReport,
    ComposeTimeout,
    Corner,
    VerlConfigError,
    check_space,
    compose_corners,
    compose_timed_out,
    compose_timeout,
    space_corners,
)
from hpo.backends.verl._interpreter import (
    SKIP_INTERPRETER_CHECK,
    check_verl_launch,
    interpreter_problem,
    trial_base_env,
    trial_gpus,
    trial_nodes,
    trials_on_cpu,
)
from hpo.backends.verl._launch import DRIVER_KEYS, override_key
from hpo.backends.verl._metric_names import val_core_metric, verl_metric_examples, verl_metric_ok

if TYPE_CHECKING:
    from hpo.experiment import Space

__all__ = [
    "COMPOSE_SCRIPT", "COMPOSE_TIMEOUT_ENV", "COMPOSE_TIMEOUT_S", "SKIP_INTERPRETER_CHECK", "ComposeReport",
    "ComposeTimeout", "ComposedConfig", "Corner", "VerlConfigError", "check_space", "check_verl_launch",
    "check_verl_metrics", "check_verl_space", "compose_corners", "compose_timed_out", "compose_timeout",
    "interpreter_problem", "space_corners", "trial_base_env", "trial_gpus", "trial_nodes", "trials_on_cpu",
    "unread_tuned", "val_core_metric", "verl_metric_examples", "verl_metric_ok",
]


def check_verl_space(space: Space, python: str, n_gpus: int | None = None) -> ComposeReport:
    """Everything a verl space must pass before a study is created: no driver key set by the space, every
    corner composed and validated by verl (:func:`check_space`, with ``trial.gpus_per_trial`` GPUs unless
    ``n_gpus``), data files that exist (or are the shipped set the prepare step writes), objective and
    early-stopping metrics that verl logs. Raises :class:`VerlConfigError` whose
    ``.where`` is the experiment field (the parameter or fixed override whose key verl's message names, else
    ``params``), for ``SpaceError``'s ``file: where: message`` form."""
    for where, key in [*((f"overrides.{k}", k) for k in space.overrides),
                       *((f"params.{p.name}.key", p.key) for p in space.params)]:
        if override_key(key) in DRIVER_KEYS:
            raise VerlConfigError(f"{override_key(key)} is set by the driver for every verl trial", where)
    from hpo.backends.verl._data import bad_rows, missing_files, missing_reward

    for key, value in space.overrides.items():  # before verl's interpreter starts: a typo costs nothing
        if override_key(key) in ("reward.custom_reward_function.path", "custom_reward_function.path"):
            problem = missing_reward(value)
            if problem:
                raise VerlConfigError(problem, f"overrides.{key}", key=override_key(key))
    corners = space_corners(space)
    try:
        report = check_space(python, space.config, [c.overrides for c in corners],
                             trial_gpus(space) if n_gpus is None else n_gpus, nnodes=trial_nodes(space))
    except VerlConfigError as err:
        if err.corner is None:
            raise
        values = corners[err.corner].values
        shown = ", ".join(f"{k}={v!r}" for k, v in values.items())
        param = next((p for p in space.params if override_key(p.key) == err.key), None)
        fixed = next((k for k in space.overrides if override_key(k) == err.key), None)
        if param is not None:
            others = ", ".join(f"{k}={v!r}" for k, v in values.items() if k != param.name)
            where = f"params.{param.name}"
            message = f"value {values[param.name]!r} (with {others or 'nothing else'}) is rejected by verl: {err}"
        else:
            where = f"overrides.{fixed}" if fixed is not None else "params"
            message = f"the combination {shown} is rejected by verl: {err}"
        raise VerlConfigError(message, where, err.corner, err.key, err.value) from None
    prompt_key = str(next((v for k, v in space.overrides.items() if override_key(k) == "data.prompt_key"), "prompt"))
    for i, info in enumerate(report.corners):
        for key, files in (("data.train_files", info.train_files), ("data.val_files", info.val_files)):
            problem = missing_files(key, files) or (bad_rows(key, files, prompt_key) if i == 0 else None)
            if problem:
                fixed = next((k for k in space.overrides if override_key(k) == key), None)
                raise VerlConfigError(problem, f"overrides.{fixed}" if fixed else "params", key=key)
    check_verl_metrics(space, report.corners[0])
    tuned = [(f"params.{p.name}", p.key) for p in space.params]
    every = [unread_tuned(tuned, {k: v for k, v in dataclasses.asdict(c).items() if v is not None})
             for c in report.corners]
    dead = [d for d in every[0] if all(any(o[0] == d[0] for o in other) for other in every[1:])]  # in no corner
    if dead:  # every trial would spend a dimension of the search on a value nothing reads
        raise VerlConfigError(dead[0][1], dead[0][0], key=space.param(dead[0][0].split(".", 1)[1]).key)
    return report


def check_verl_metrics(space: Space, info: ComposedConfig) -> None:
    """The objective's and constraints' metrics, and the early-stopping metric when enabled, must be ones verl
    logs for this config (``val_kwargs.n``, the validation data's sources when known)."""
    from hpo.experiment import check_metrics

    def ok(metric: str) -> bool:
        return verl_metric_ok(metric, info.val_n, info.data_sources, info.val_core_var)

    known = verl_metric_examples(info.val_n, info.data_sources or ("<data_source>",), info.val_core_var)

    def error(where: str, msg: str) -> VerlConfigError:
        return VerlConfigError(msg.replace("the trainer's evaluations log", "verl logs e.g."), where)

    check_metrics(space.objective, ok, known, error)
    es = space.early_stopping
    if es.enabled and es.metric is not None and not ok(es.metric):
        hint = (f"verl logs the spread of the {info.val_n} samples of a prompt as "
                f"{verl_metric_examples(info.val_n, info.data_sources or ('<data_source>',), info.val_core_var)[1]}"
                if info.val_n > 1 else
                "verl logs no validation spread with actor_rollout_ref.rollout.val_kwargs.n=1; set it above 1 "
                "or early_stopping.enabled: false")
        raise VerlConfigError(f"unknown metric {es.metric!r} for a verl trial: {hint}", "early_stopping.metric")


def unread_tuned(keys: Sequence[tuple[str, str]], info: dict[str, Any]) -> list[tuple[str, str]]:
    """The tuned keys (``(field, key)``) that no worker of this run reads, decided from one composed corner's
    ``info`` (:func:`hpo.backends.verl._compose_checks.describe`): a critic key without a critic, a reference key
    without a reference policy, a reward-model key without a reward model, the KL-loss coefficient without
    ``use_kl_loss``, the in-reward KL controller without ``use_kl_in_reward``, another rollout engine's
    ``engine_kwargs``, ``algorithm.gamma``/``algorithm.lam`` that the advantage estimator does not read (``adv_reads``,
    from verl's code: GAE reads both, GRPO neither). ``(field, why)`` each; keys it cannot decide (``info`` lacks
    the fact) are left out."""
    rollout = str(info.get("rollout_name") or "")
    no_rm = "this run has no reward model (reward.reward_model.enable)"
    no_critic = f"this run has no critic (algorithm.adv_estimator={info.get('adv_estimator')})"
    rules = (
        ("critic.", "use_critic", False, no_critic),
        ("actor_rollout_ref.ref.", "use_reference_policy", False, "this run has no reference policy"),
        ("reward.reward_model.", "reward_model_enable", False, no_rm),
        ("reward_model.", "reward_model_enable", False, no_rm),
        ("actor_rollout_ref.actor.kl_loss", "use_kl_loss", False, "actor_rollout_ref.actor.use_kl_loss is false"),
        ("algorithm.kl_ctrl.", "use_kl_in_reward", False, "algorithm.use_kl_in_reward is false"),
    )
    out = []
    for where, key in keys:
        bare = key.lstrip("+~")
        for prefix, fact, off, why in rules:  # a key added with '+' is not verl's: the rehearsal's check names it
            if not key.startswith("+") and bare.startswith(prefix) and fact in info and bool(info[fact]) == off:
                out.append((where, f"{key}: {why}, so no worker reads it"))
                break
        else:
            reads = info.get("adv_reads")
            name = bare.removeprefix("algorithm.")
            if not key.startswith("+") and name in ("gamma", "lam") and bare != name and reads is not None \
                    and name not in reads:
                out.append((where, f"{key}: algorithm.adv_estimator={info.get('adv_estimator')} does not read it "
                                   "(verl's gae does), so no worker reads it"))
                continue
            engine = re.match(r"actor_rollout_ref\.rollout\.engine_kwargs\.([a-z_]+)\.", bare)
            if engine and rollout and engine.group(1) != rollout:
                out.append((where, f"{key}: the rollout engine is {rollout}, not {engine.group(1)}, so no worker "
                                   "reads it"))
    return out
