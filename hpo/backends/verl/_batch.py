"""Which tuned values verl 0.9.1 refuses together, told in the driver before a trial is launched
(``VerlBackend.infeasible``: a refused trial is recorded ``fail_reason=infeasible`` instead of crashing after verl's
start-up; at load, a value no combination makes valid refuses the space), without verl, hydra or torch.

:func:`verl_infeasible` runs verl's batch rules over the values the driver knows (:class:`KnownValues`): the trial's
tuned values, then the fixed overrides, the world size the driver gives every trial (``trainer.n_gpus_per_node`` =
``trial.gpus_per_trial``, at least 1, or ``trial.ray.num_gpus``; ``trainer.nnodes`` = 1 or ``trial.ray.nodes``), then
the config's own values: verl's ``ppo_trainer`` (:data:`VERL_DEFAULTS`, with its interpolations), or a user's YAML
read here (its values; verl's defaults under it only when its ``defaults`` list is ``[ppo_trainer, _self_]``). A value
none of these tells (another config's, an interpolation other than ``${key}`` / ``${.key}`` / ``${oc.select:key,...}``,
a config group chosen by an override) is unknown, and a rule that reads it says nothing: an unsure answer is "accepted",
never a false refusal.

The rules, in the order verl's interpreter meets them:

* what the project's compose step checks beside ``validate_config`` (``_compose_checks.batch_rules``, the same code
  run on the composed config in verl's interpreter): the sizes are positive integers; ``data.train_batch_size x
  rollout.n`` divides over the GPUs (``verl/utils/config.py:123``); GRPO-like estimators get groups of two or more;
  the rollout's tensor x data x pipeline parallelism divides the GPUs; ``actor.use_dynamic_bsz`` equals
  ``rollout.log_prob_use_dynamic_bsz`` and the per-GPU micro-batches (or token budgets) are set
  (``verl/workers/engine_workers.py:633-637``); per pass (the actor's update, the rollout's and, with a reference
  policy, the reference's log-prob pass, the critic's update with a critic) the mini-batch is at most the batch
  and divides it (``verl/workers/config/actor.py:225``; verl pads otherwise), the mini-batch x ``rollout.n`` splits
  over the data-parallel GPUs (``verl/workers/engine_workers.py:267``), and the micro-batch divides each GPU's share
  (``verl/workers/engine/utils.py:125``); with dynamic batching instead, the token budget holds one full sequence;
* ``validate_config``'s own (:func:`validate_config_rules`): the deprecated micro-batch key and its ``_per_gpu``
  successor are not both set, nor both unset (``verl/utils/config.py:131-182``,
  ``verl/workers/config/actor.py:199-210``, ``verl/workers/config/critic.py:107-108``), and a deprecated
  micro-batch divides the mini-batch and covers the GPUs (``actor.py:232-243``, ``critic.py:110-115, 227-232``).

Checked against verl's own compose and validation on a grid of combinations in
``tests/hpo/backends/verl/test_batch.py``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from hpo.backends.verl._compose_checks import AR, Get, Problem, Rule, UnknownValue, batch_rules, first_problem
from hpo.backends.verl._launch import DEFAULT_CONFIG, is_config_path, override_key, trial_gpus, trial_nodes

if TYPE_CHECKING:
    from hpo.experiment import Space

# What verl 0.9.1's ppo_trainer composes for the keys the rules read when a run does not set them
# (verl/trainer/config/_generated_ppo_trainer.yaml, the line of each; interpolations as there). The world size is the
# driver's (trainer.n_gpus_per_node, trainer.nnodes: always set for a trial).
VERL_DEFAULTS: dict[str, Any] = {
    "data.train_batch_size": 1024,  # :506
    "data.max_prompt_length": 512,  # :504
    "data.max_response_length": 512,  # :505
    "algorithm.adv_estimator": "gae",  # :861
    "algorithm.use_kl_in_reward": False,  # :869
    f"{AR}.actor.strategy": "fsdp",  # :79
    f"{AR}.actor.ppo_mini_batch_size": 256,  # :80
    f"{AR}.actor.ppo_micro_batch_size": None,  # :81
    f"{AR}.actor.ppo_micro_batch_size_per_gpu": None,  # :82
    f"{AR}.actor.use_dynamic_bsz": False,  # :83
    f"{AR}.actor.ppo_max_token_len_per_gpu": 16384,  # :84
    f"{AR}.actor.use_kl_loss": False,  # :106
    f"{AR}.actor.ulysses_sequence_parallel_size": 1,  # :178
    f"{AR}.ref.log_prob_micro_batch_size": None,  # :188
    f"{AR}.ref.log_prob_micro_batch_size_per_gpu": None,  # :189
    f"{AR}.ref.log_prob_use_dynamic_bsz": f"${{oc.select:{AR}.actor.use_dynamic_bsz,false}}",  # :190
    f"{AR}.ref.log_prob_max_token_len_per_gpu": f"${{oc.select:{AR}.actor.ppo_max_token_len_per_gpu,16384}}",
    f"{AR}.ref.ulysses_sequence_parallel_size": f"${{oc.select:{AR}.actor.ulysses_sequence_parallel_size,1}}",  # :286
    f"{AR}.rollout.tensor_model_parallel_size": 2,  # :310
    f"{AR}.rollout.data_parallel_size": 1,  # :311
    f"{AR}.rollout.pipeline_model_parallel_size": 1,  # :313
    f"{AR}.rollout.log_prob_micro_batch_size": None,  # :323
    f"{AR}.rollout.log_prob_micro_batch_size_per_gpu": None,  # :324
    f"{AR}.rollout.log_prob_use_dynamic_bsz": f"${{oc.select:{AR}.actor.use_dynamic_bsz,false}}",  # :325
    f"{AR}.rollout.log_prob_max_token_len_per_gpu": f"${{oc.select:{AR}.actor.ppo_max_token_len_per_gpu,16384}}",
    f"{AR}.rollout.n": 1,  # :329
    "critic.enable": None,  # :607
    "critic.ppo_mini_batch_size": f"${{oc.select:{AR}.actor.ppo_mini_batch_size,256}}",  # :608
    "critic.ppo_micro_batch_size": None,  # :609
    "critic.ppo_micro_batch_size_per_gpu": "${oc.select:.ppo_micro_batch_size,null}",  # :610
    "critic.use_dynamic_bsz": f"${{oc.select:{AR}.actor.use_dynamic_bsz,false}}",  # :611
    "critic.ppo_max_token_len_per_gpu": 32768,  # :612
    "critic.ulysses_sequence_parallel_size": 1,  # :673
}

_INTERPOLATION = re.compile(r"\$\{([^${}]*)\}")


def _walk(node: Any, key: str) -> tuple[bool, Any]:
    """(found, value) of dotted ``key`` in a nested mapping."""
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


class KnownValues:
    """The values of a trial's composed config that the driver knows: ``get(key)`` gives the value (interpolations
    resolved as OmegaConf would) or raises :class:`UnknownValue`. ``set_values``: what the trial's overrides set
    (the last one wins); ``own``: the user's config file's values (None: not read); ``base``: the config's defaults
    under them (verl's ``ppo_trainer``, else none known)."""

    def __init__(self, set_values: Mapping[str, Any], own: Mapping[str, Any] | None,
                 base: Mapping[str, Any]) -> None:
        self.set_values, self.own, self.base = dict(set_values), own, base

    def get(self, key: str) -> Any:
        return self._resolve(key, ())

    def _raw(self, key: str) -> Any:
        if key in self.set_values:  # a Python value reaches verl with its type (_launch.format_value quotes text)
            return self.set_values[key]
        if self.own is not None:
            found, v = _walk(self.own, key)
            if found:
                return v
        if key in self.base:
            return self.base[key]
        raise UnknownValue(key)

    def _resolve(self, key: str, seen: tuple[str, ...]) -> Any:
        if key in seen:
            raise UnknownValue(key)  # a loop: hydra would refuse it, not this check
        value = self._raw(key)
        if not isinstance(value, str) or "${" not in value:
            return value
        m = _INTERPOLATION.fullmatch(value.strip())
        if m is None:  # text around an interpolation, or several: not a number the rules read
            raise UnknownValue(key)
        inner = m.group(1).strip()
        if inner.startswith("oc.select:"):  # the key's value, None included; its default only if the key is absent,
            inner = inner[len("oc.select:"):].partition(",")[0].strip()  # which is never known here
        if not re.fullmatch(r"\.*[A-Za-z_][\w.]*", inner):  # ${oc.env:...} and other resolvers
            raise UnknownValue(key)
        return self._resolve(_absolute(key, inner), (*seen, key))


def _absolute(key: str, path: str) -> str:
    """OmegaConf's relative interpolation ``${.x}`` (a sibling of ``key``), ``${..x}`` (one level up), ..."""
    dots = len(path) - len(path.lstrip("."))
    if not dots:
        return path
    parent = key.split(".")[:-1]
    up = parent[:len(parent) - (dots - 1)] if dots > 1 else parent
    return ".".join([*up, path[dots:]])


@functools.lru_cache(maxsize=8)
def _read_config_file(path: str, stamp: tuple[int, int]) -> tuple[Mapping[str, Any] | None, bool]:
    """(the file's own values that win in the composed config, or None; whether verl's ``ppo_trainer`` is all
    that is under them). ``stamp``: the file's (mtime_ns, size), so that an edited file is read again."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None, False
    if not isinstance(raw, dict):
        return None, False
    defaults = raw.get("defaults", [])
    if not isinstance(defaults, list) or not all(isinstance(d, str) for d in defaults):
        return None, False  # a config group chosen (actor@...: ...): what it sets is not known here
    if "_self_" in defaults and defaults[-1] != "_self_":
        return None, False  # a default composed after the file's own values may replace them
    others = [d for d in defaults if d != "_self_"]
    if others and others != [DEFAULT_CONFIG]:
        return raw, False
    return raw, others == [DEFAULT_CONFIG]


def config_values(config: str) -> tuple[Mapping[str, Any] | None, Mapping[str, Any]]:
    """(the config file's own values or None, the defaults under them) of the experiment's ``config``: verl's
    ``ppo_trainer`` -> (None, :data:`VERL_DEFAULTS`); a user's YAML -> its values, with verl's defaults under them
    when it builds on ``ppo_trainer`` alone; another config of verl's -> nothing known."""
    if config == DEFAULT_CONFIG:
        return None, VERL_DEFAULTS
    if not is_config_path(config):
        return None, {}
    path = Path(config).expanduser().resolve()
    try:
        st = path.stat()
    except OSError:
        return None, {}
    own, on_verl = _read_config_file(str(path), (st.st_mtime_ns, st.st_size))
    return own, VERL_DEFAULTS if on_verl else {}


def known_values(space: Space, values: Mapping[str, Any]) -> KnownValues:
    """What a trial of ``space`` with the tuned ``values`` (by parameter name) composes, as far as the driver knows
    (see the module docstring)."""
    set_values: dict[str, Any] = {}
    deleted: set[str] = set()
    tuned = {p.key: values[p.name] for p in space.params if p.name in values}
    for key, value in [*space.overrides.items(), *tuned.items()]:
        bare = override_key(key)
        if key.startswith("~"):  # a deletion: what the key holds then is not known here
            deleted.add(bare)
            set_values.pop(bare, None)
        else:
            deleted.discard(bare)
            set_values[bare] = value
    set_values["trainer.n_gpus_per_node"] = max(1, trial_gpus(space))  # verl_argv's, last on a trial's argv
    set_values["trainer.nnodes"] = trial_nodes(space)
    own, base = config_values(space.config)
    if any("/" in k for k in set_values) or deleted:  # a config group chosen, or a key deleted: defaults unknown
        own, base = None, {}
    return KnownValues(set_values, own, base)


# ----------------------------------------------------------------------------- verl's validate_config
def _mutually_exclusive(section: str, legacy: str, dyn_key: str) -> Rule:
    """verl's ``check_mutually_exclusive`` (``verl/utils/config.py:131-182``; the actor's and critic's
    ``__post_init__``, ``verl/workers/config/actor.py:199-210``, ``critic.py:107-108``): without dynamic batching
    (``dyn_key``), exactly one of the deprecated micro-batch key and its ``_per_gpu`` successor is set."""
    def rule(get: Get) -> Problem | None:
        if get(dyn_key):
            return None
        old, new = f"{section}.{legacy}", f"{section}.{legacy}_per_gpu"
        mbs, per_gpu = get(old), get(new)
        if mbs is None and per_gpu is None:
            return new, None, f"{new}=null and {old}=null: verl's validate_config asks for one of them"
        if mbs is not None and per_gpu is not None:
            return old, mbs, (f"{old}={mbs} and {new}={per_gpu} are both set: verl's validate_config refuses the "
                              f"deprecated {old} beside {new}")
        return None
    return rule


def _legacy_micro(section: str, sp_key: str | None) -> Rule:
    """A deprecated ``ppo_micro_batch_size`` (global) without dynamic batching divides the mini-batch and, times the
    sequence parallelism, covers the GPUs (``actor.py:232-243``; ``critic.py:110-115``, ``critic.py:227-232``)."""
    def rule(get: Get) -> Problem | None:
        if get(f"{section}.use_dynamic_bsz"):
            return None
        key, mbs = f"{section}.ppo_micro_batch_size", get(f"{section}.ppo_micro_batch_size")
        if mbs is None:
            return None
        mini = get(f"{section}.ppo_mini_batch_size")
        if mini % mbs:
            return key, mbs, (f"{section}.ppo_mini_batch_size={mini} is not divisible by {key}={mbs} "
                              "(verl's validate_config)")
        sp = get(sp_key) if sp_key else 1
        n_gpus = int(get("trainer.n_gpus_per_node")) * int(get("trainer.nnodes"))
        if mbs * sp < n_gpus:
            return key, mbs, (f"{key}={mbs} x ulysses_sequence_parallel_size={sp} is below the trial's {n_gpus} "
                              "GPU(s) (verl's validate_config)")
        return None
    return rule


def validate_config_rules(use_critic: bool, use_ref: bool) -> list[Rule]:
    """The batch rules of verl 0.9.1's ``validate_config`` (``verl/utils/config.py:88``) that
    :func:`~hpo.backends.verl._compose_checks.batch_rules` does not already make (its ``train_batch_size`` >=
    mini-batch and samples-per-GPU rules are among those)."""
    actor, dyn = f"{AR}.actor", f"{AR}.actor.use_dynamic_bsz"
    rules = [_mutually_exclusive(actor, "ppo_micro_batch_size", dyn),
             _legacy_micro(actor, f"{actor}.ulysses_sequence_parallel_size"),
             _mutually_exclusive(f"{AR}.rollout", "log_prob_micro_batch_size", dyn)]
    if use_ref:
        rules.append(_mutually_exclusive(f"{AR}.ref", "log_prob_micro_batch_size", dyn))
    if use_critic:
        rules += [_mutually_exclusive("critic", "ppo_micro_batch_size", "critic.use_dynamic_bsz"),
                  _legacy_micro("critic", "critic.ulysses_sequence_parallel_size")]
    return rules


def _uses(get: Get) -> tuple[bool, bool]:
    """(a critic, a reference policy) as verl's ``need_critic`` and ``need_reference_policy`` decide
    (``verl/trainer/ppo/utils.py:75-107``); one that cannot be told here counts as absent (its rules say nothing)."""
    try:
        enable = get("critic.enable")
        critic = bool(enable) if enable is not None else get("algorithm.adv_estimator") == "gae"
    except UnknownValue:
        critic = False
    try:
        ref = bool(get("algorithm.use_kl_in_reward") or get(f"{AR}.actor.use_kl_loss"))
    except UnknownValue:
        ref = False
    return critic, ref


# a rule that reads an unknown value, or one of a type it cannot compute with, says nothing
_UNSURE = (UnknownValue, TypeError, ValueError, ZeroDivisionError)


def verl_problem(get: Get) -> Problem | None:
    """The first of verl's batch rules that the values of ``get`` break: ``(key, value, one line)``, or None."""
    use_critic, use_ref = _uses(get)
    return first_problem([*batch_rules(use_critic, use_ref), *validate_config_rules(use_critic, use_ref)], get,
                         _UNSURE)


def verl_infeasible(space: Space, values: Mapping[str, Any]) -> str | None:
    """Why verl 0.9.1 refuses the tuned ``values`` (by parameter name) of ``space`` together (one line naming the keys
    and values), or None: accepted, or not known here (see the module docstring)."""
    problem = verl_problem(known_values(space, values).get)
    return None if problem is None else problem[2]


def feasible_corners(space: Space, corners: Sequence[dict[str, Any]]
                     ) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], str]]]:
    """``(kept, skipped)``: a corner verl refuses (:func:`verl_infeasible`) while each of its values is in a corner it
    accepts is skipped, with the reason: a trial drawing it is not launched. Every other corner is kept, so that
    verl's own check of a corner names a value that nothing makes valid."""
    reasons = [verl_infeasible(space, c) for c in corners]
    accepted = {(name, repr(v)) for c, why in zip(corners, reasons, strict=True) if why is None
                for name, v in c.items()}
    kept: list[dict[str, Any]] = []
    skipped: list[tuple[dict[str, Any], str]] = []
    any_accepted = any(why is None for why in reasons)
    for c, why in zip(corners, reasons, strict=True):
        if why is not None and any_accepted and _all_in(c.items(), accepted):
            skipped.append((c, why))
        else:
            kept.append(c)
    return kept, skipped


def _all_in(items: Iterable[tuple[str, Any]], accepted: set[tuple[str, str]]) -> bool:
    return all((name, repr(v)) in accepted for name, v in items)
