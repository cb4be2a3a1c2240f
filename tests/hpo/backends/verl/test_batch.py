"""Which tuned values real verl refuses together, told by the driver without verl (``hpo/backends/verl/_batch.py``:
``VerlBackend.infeasible``): the batch rules over the fixed overrides, the tuned values, the world size and the
config's own values (verl's ``ppo_trainer`` defaults, a user's YAML), and "not known" (None) where a value cannot be
told here. The real-verl tests compose grids of combinations in verl 0.9.1's interpreter (one subprocess each) and
check that the driver's answer agrees with verl's accept or refusal on every one, and that its view of the config's
values is what verl composes."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpo.backends import backend_of, load_space
from hpo.backends.verl import verl_overrides
from hpo.backends.verl._batch import VERL_DEFAULTS, feasible_corners, known_values, verl_infeasible
from hpo.backends.verl._composer import COMPOSE_SCRIPT
from hpo.experiment import SpaceError
from hpo.experiment._space import Space, parse_space
from tests.hpo.backends.verl.conftest import VERL_PY, needs_verl

A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"
REF = "actor_rollout_ref.ref"
FIXED = {f"{R}.name": "vllm", f"{R}.tensor_model_parallel_size": 1, "data.max_prompt_length": 256,
         "data.max_response_length": 256, "actor_rollout_ref.model.use_remove_padding": True}
# the tuned keys of the grids, by parameter name; a GRPO run with a reference policy (kl loss), 8 prompts x 2
KEYS = {"adv": "algorithm.adv_estimator", "kl": f"{A}.use_kl_loss", "bs": "data.train_batch_size", "n": f"{R}.n",
        "mini": f"{A}.ppo_mini_batch_size", "micro": f"{A}.ppo_micro_batch_size_per_gpu",
        "lp": f"{R}.log_prob_micro_batch_size_per_gpu", "ref": f"{REF}.log_prob_micro_batch_size_per_gpu",
        "critic": "critic.ppo_micro_batch_size_per_gpu", "critic_mini": "critic.ppo_mini_batch_size",
        "dyn": f"{A}.use_dynamic_bsz", "lp_dyn": f"{R}.log_prob_use_dynamic_bsz",
        "max_len": f"{A}.ppo_max_token_len_per_gpu", "legacy": f"{A}.ppo_micro_batch_size",
        "lp_legacy": f"{R}.log_prob_micro_batch_size", "critic_legacy": "critic.ppo_micro_batch_size",
        "sp": f"{A}.ulysses_sequence_parallel_size"}
BASE = {"adv": "grpo", "kl": True, "bs": 8, "n": 2, "mini": 4, "micro": 2, "lp": 4, "ref": 4}


def space_of(gpus: int = 1, fixed: dict[str, Any] | None = None, config: str = "ppo_trainer",
             keys: dict[str, str] | None = None) -> Space:
    """A verl experiment tuning ``keys`` (default: :data:`KEYS`) over ``fixed`` overrides, on ``gpus`` GPUs."""
    fixed_keys = {k.lstrip("+~") for k in fixed or {}}
    params = {name: {"key": key, "type": "categorical", "choices": [0, 1]} for name, key in (keys or KEYS).items()
              if key not in fixed_keys}  # a key is fixed or tuned
    return parse_space({"config": config, "overrides": {**FIXED, **(fixed or {})}, "params": params,
                        "objective": {"metric": "val-core/x/acc/mean@1", "direction": "maximize"},
                        "trial": {"backend": "verl", "gpus_per_trial": gpus}}, "exp.yaml", "exp")


def refused(values: dict[str, Any], gpus: int = 1, **kw: Any) -> str | None:
    return verl_infeasible(space_of(gpus, **kw), {**BASE, **values})


# ----------------------------------------------------------------------------- the rules, without verl
def test_a_micro_batch_must_divide_each_gpu_s_share_of_the_mini_batch() -> None:
    assert refused({}) is None
    assert refused({"micro": 8}) is None  # 4 prompts x 2 samples on one GPU
    why = refused({"micro": 3})
    assert why == f"{A}.ppo_micro_batch_size_per_gpu=3 does not divide the 8 samples each GPU gets per pass"
    assert "does not divide the 4 samples" in str(refused({"micro": 8}, gpus=2))  # each of 2 GPUs gets 4
    assert "does not divide the 16 samples" in str(refused({"lp": 3}))  # a log-prob pass: the whole batch
    assert refused({"n": 4, "micro": 16}) is None  # rollout.n x the mini-batch


def test_a_mini_batch_must_fit_the_batch_and_split_over_the_gpus() -> None:
    assert "is larger than data.train_batch_size=8" in str(refused({"mini": 16}))
    assert "does not divide data.train_batch_size=8" in str(refused({"mini": 3, "micro": 1}))
    assert "samples is not divisible by the trial's 3 GPU(s)" in str(refused({}, gpus=3))
    assert "= 2 samples cannot be split evenly over 4" in str(refused({"mini": 1, "micro": 1, "lp": 1, "ref": 1},
                                                                      gpus=4))
    assert "rollout.n=1 with algorithm.adv_estimator=grpo" in str(refused({"n": 1}))


def test_dynamic_batching_skips_the_micro_batch_rules_but_needs_a_budget_of_one_sequence() -> None:
    assert refused({"dyn": True, "micro": 3, "lp": 3, "ref": 3, "max_len": 4096}) is None
    # the rollout's and reference's log_prob_use_dynamic_bsz follow the actor's (verl's interpolation)
    why = refused({"dyn": True, "max_len": 256})
    assert why is not None and "ppo_max_token_len_per_gpu=256 is below one full sequence" in why
    assert "asserts they are equal" in str(refused({"dyn": True, "lp_dyn": False, "max_len": 4096}))


def test_the_critic_s_and_reference_s_rules_apply_only_to_a_run_that_has_them() -> None:
    assert refused({"ref": 3, "kl": False}) is None  # no reference policy: its micro-batch is never read
    assert "does not divide" in str(refused({"ref": 3}))
    gae = {"adv": "gae", "kl": False}
    assert "critic.ppo_micro_batch_size_per_gpu=null" in str(refused(gae))  # verl's default: null
    assert refused({**gae, "critic": 2}) is None
    assert "critic.ppo_micro_batch_size_per_gpu=3" in str(refused({**gae, "critic": 3}))
    # critic.ppo_micro_batch_size_per_gpu follows the deprecated critic.ppo_micro_batch_size: both set
    assert "are both set" in str(refused({**gae, "critic_legacy": 4}))
    assert refused({"critic_legacy": 4}) is None  # GRPO: no critic


def test_verl_s_validate_config_refuses_the_deprecated_micro_batch_beside_its_successor() -> None:
    why = refused({"lp_legacy": 4})
    assert why is not None and f"{R}.log_prob_micro_batch_size=4 and {R}.log_prob_micro_batch_size_per_gpu=4" in why
    assert refused({"lp_legacy": 4, "dyn": True, "max_len": 4096}) is None  # only without dynamic batching


def test_values_left_to_verl_s_config_are_its_defaults() -> None:
    trial = {k: v for k, v in BASE.items() if k != "bs"}
    assert verl_infeasible(space_of(), trial) is None  # verl's 1024 prompts take a mini-batch of 4
    no_mini = {k: v for k, v in BASE.items() if k != "mini"}
    assert "ppo_mini_batch_size=256 is larger than data.train_batch_size=8" in str(verl_infeasible(space_of(),
                                                                                                      no_mini))
    known = known_values(space_of(), {"mini": 4})
    assert known.get("critic.ppo_mini_batch_size") == 4  # ${oc.select:actor_rollout_ref.actor.ppo_mini_batch_size}
    assert known.get(f"{REF}.log_prob_use_dynamic_bsz") is False
    assert known.get("trainer.n_gpus_per_node") == 1 and known.get("trainer.nnodes") == 1


def test_fixed_overrides_and_tuned_values_together_and_interpolations() -> None:
    fixed = {"data.train_batch_size": 16, f"{A}.ppo_micro_batch_size_per_gpu": None, KEYS["adv"]: "grpo",
             KEYS["n"]: 2}
    space = space_of(fixed=fixed, keys={"mini": KEYS["mini"]})
    assert "=null: verl's actor worker asserts" in str(verl_infeasible(space, {"mini": 4}))
    space = space_of(fixed={**fixed, f"{A}.ppo_micro_batch_size_per_gpu": 2, f"{R}.log_prob_micro_batch_size_per_gpu":
                            "${actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu}"}, keys={"mini": KEYS["mini"]})
    assert verl_infeasible(space, {"mini": 4}) is None and verl_infeasible(space, {"mini": 32}) is not None
    assert known_values(space, {}).get(f"{R}.log_prob_micro_batch_size_per_gpu") == 2


def test_what_cannot_be_known_here_is_never_refused(tmp_path: Path) -> None:
    assert refused({"micro": 3}, config="ppo_megatron_trainer") is None  # another config: its defaults unknown
    env = space_of(fixed={"data.train_batch_size": "${oc.env:BATCH}"})
    assert verl_infeasible(env, {k: v for k, v in BASE.items() if k != "bs"}) is None
    group = space_of(fixed={"actor_rollout_ref/actor": "megatron_actor"})
    assert verl_infeasible(group, {k: v for k, v in BASE.items() if k != "mini"}) is None  # its defaults may differ
    deleted = space_of(fixed={f"~{R}.n": None})
    assert verl_infeasible(deleted, {k: v for k, v in BASE.items() if k != "n"}) is None
    assert refused({"micro": [2]}) is None  # a value no rule computes with


def test_a_user_s_config_is_read_for_its_values(tmp_path: Path) -> None:
    on_verl = tmp_path / "mine.yaml"
    on_verl.write_text(yaml.safe_dump({"defaults": ["ppo_trainer", "_self_"], "data": {"train_batch_size": 8}}))
    no_bs = {k: v for k, v in BASE.items() if k != "bs"}
    assert "larger than data.train_batch_size=8" in str(verl_infeasible(space_of(config=str(on_verl)),
                                                                        {**no_bs, "mini": 16}))
    assert verl_infeasible(space_of(config=str(on_verl)), no_bs) is None
    known = known_values(space_of(config=str(on_verl)), no_bs)
    assert known.get("critic.ppo_max_token_len_per_gpu") == 32768  # verl's own, under the file
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"defaults": [{"actor@actor_rollout_ref.actor": "megatron_actor"}, "_self_"],
                                     "data": {"train_batch_size": 8}}))
    assert verl_infeasible(space_of(config=str(other)), {**no_bs, "mini": 16}) is None  # the group's keys unknown
    alone = tmp_path / "alone.yaml"  # no defaults: the file is the whole config
    alone.write_text(yaml.safe_dump({"data": {"train_batch_size": 8}}))
    assert "16 samples is not divisible by the trial's 3 GPU" in str(verl_infeasible(space_of(3, config=str(alone)),
                                                                                     no_bs))
    assert verl_infeasible(space_of(config=str(alone)), {**no_bs, "micro": 3}) is None  # its sequence parallelism?
    assert verl_infeasible(space_of(config=str(tmp_path / "missing.yaml")), {**no_bs, "mini": 16}) is None


def test_a_corner_verl_refuses_is_skipped_when_each_of_its_values_runs_elsewhere() -> None:
    space = space_of(keys={"mini": KEYS["mini"], "micro": KEYS["micro"]},
                     fixed={f"{R}.log_prob_micro_batch_size_per_gpu": 4, f"{REF}.log_prob_micro_batch_size_per_gpu": 4,
                            **{KEYS[k]: BASE[k] for k in ("adv", "kl", "bs", "n")}})
    corners = [{"mini": m, "micro": u} for m in (2, 8) for u in (2, 16)]
    kept, skipped = feasible_corners(space, corners)
    assert kept == [{"mini": 2, "micro": 2}, {"mini": 8, "micro": 2}, {"mini": 8, "micro": 16}]
    assert [c for c, _ in skipped] == [{"mini": 2, "micro": 16}] and "does not divide the 4" in skipped[0][1]
    never = [{"mini": 16, "micro": 2}, {"mini": 2, "micro": 2}]  # 16 prompts > 8: valid in no corner, kept
    assert feasible_corners(space, never)[0] == never


def _experiment(tmp_path: Path, params: dict[str, Any]) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({
        "config": "ppo_trainer", "overrides": {**FIXED, **{KEYS[k]: BASE[k] for k in ("adv", "kl", "bs", "n", "lp",
                                                                                       "ref")}},
        "params": params, "objective": {"metric": "val-core/x/acc/mean@1", "direction": "maximize"},
        "trial": {"backend": "verl", "gpus_per_trial": 1, "prepare_command": None}}))
    return path


def test_at_load_a_value_no_combination_makes_valid_refuses_the_space(tmp_path: Path) -> None:
    mini = {"key": KEYS["mini"], "type": "categorical", "choices": [2, 4]}
    ok = load_space(str(_experiment(tmp_path, {"mini": mini, "micro": {"key": KEYS["micro"], "type": "categorical",
                                                                        "choices": [2, 8]}})))
    backend = backend_of(ok)
    assert backend.answers_infeasible()
    assert backend.infeasible(ok, {"mini": 2, "micro": 8}) is not None  # skipped when drawn: 8 > 2 prompts x 2
    assert backend.infeasible(ok, {"mini": 4, "micro": 8}) is None
    with pytest.raises(SpaceError) as err:
        load_space(str(_experiment(tmp_path, {"mini": mini, "micro": {"key": KEYS["micro"], "type": "int", "low": 2,
                                                                       "high": 3}})))
    assert "params.micro: value 3 is rejected by the trainer with every combination" in str(err.value)
    assert "ppo_micro_batch_size_per_gpu=3 does not divide" in str(err.value)


# ----------------------------------------------------------------------------- against real verl
def _compose_grid(combos: list[tuple[int, dict[str, Any]]], model: Path) -> list[dict[str, Any]]:
    """Each ``(gpus, values)`` composed and checked by verl 0.9.1 in its interpreter, as ``compose_corners`` does
    (hydra, the compose step's checks, ``validate_config``), all in one subprocess, with the values of
    :data:`VERL_DEFAULTS`' keys of every corner verl accepts. ``model``: the critic's (``validate_config`` loads its
    config and tokenizer)."""
    corners = []
    for gpus, values in combos:
        space = space_of(gpus)
        tuned = {p.key: values[p.name] for p in space.params if p.name in values}
        corners.append([*verl_overrides(space.overrides, tuned), f"critic.model.path={model}",
                        f"trainer.n_gpus_per_node={gpus}", "trainer.nnodes=1"])
    request = {"config_dir": None, "config_name": "ppo_trainer", "corners": corners, "select": sorted(VERL_DEFAULTS)}
    started = time.monotonic()
    res = subprocess.run([str(VERL_PY), str(COMPOSE_SCRIPT)], input=json.dumps(request), capture_output=True,
                         text=True, timeout=1800)
    reply = json.loads(res.stdout.strip().splitlines()[-1])
    assert reply["status"] == "ok", reply
    print(f"\n{len(corners)} combinations composed by verl in {time.monotonic() - started:.1f} s")
    return list(reply["results"])


def _agree(combos: list[tuple[int, dict[str, Any]]], model: Path) -> None:
    results = _compose_grid(combos, model)
    disagree = []
    for (gpus, values), verl in zip(combos, results, strict=True):
        ours = verl_infeasible(space_of(gpus), values)
        if (ours is None) != bool(verl["ok"]):
            disagree.append((gpus, values, ours, verl.get("message")))
        if verl["ok"]:  # what the driver knows of the config is what verl composed
            known = known_values(space_of(gpus), values)
            wrong = {k: (known.get(k), v) for k, v in verl["selected"].items() if known.get(k) != v}
            assert not wrong, (gpus, values, wrong)
    accepted = sum(r["ok"] for r in results)
    print(f"verl accepts {accepted}, refuses {len(results) - accepted}; disagreements: {len(disagree)}")
    assert not disagree, disagree[:5]
    assert 0 < accepted < len(results)


# each rule both ways: micro-batches against a GPU's share, mini-batches against the batch and the GPUs, dynamic
# batching, rollout.n, the critic and the reference, verl's defaults, validate_config's deprecated keys
RULE_CASES: list[tuple[int, dict[str, Any]]] = [(1, BASE), (1, {**BASE, "micro": 3}), (1, {**BASE, "mini": 16}),
    (2, BASE), (2, {**BASE, "micro": 8}), (3, BASE), (1, {**BASE, "dyn": True, "micro": 3, "lp": 3, "max_len": 4096}),
    (1, {**BASE, "dyn": True, "max_len": 256}), (1, {**BASE, "adv": "gae", "kl": False}),
    (1, {**BASE, "adv": "gae", "kl": False, "critic": 2, "ref": 3}), (1, {**BASE, "adv": "gae", "critic_legacy": 4}),
    (1, {**BASE, "lp_legacy": 4}), (1, {k: v for k, v in BASE.items() if k != "bs"})]


@needs_verl
def test_the_driver_agrees_with_verl_on_each_rule(user_models: Path) -> None:
    _agree(RULE_CASES, user_models / "model")


def random_grid(count: int, seed: int = 0) -> list[tuple[int, dict[str, Any]]]:
    """``count`` combinations: a GRPO or GAE run that verl accepts with one to three keys changed (or left to
    verl's default), on 1, 2 or 4 GPUs."""
    domain: dict[str, list[Any]] = {
        "bs": [4, 8, 16], "n": [1, 2, 3, 4], "mini": [1, 2, 4, 6, 8, 16, 32], "micro": [1, 2, 3, 4, 8, 16, 64, None],
        "lp": [1, 3, 4, 8, 32, 128, None], "ref": [2, 3, 8, 64, None], "critic": [1, 3, 4, 8, None],
        "critic_mini": [2, 8], "dyn": [True, False], "lp_dyn": [True, False], "max_len": [256, 4096],
        "legacy": [4], "lp_legacy": [4], "critic_legacy": [2, 4], "sp": [2], "kl": [True, False]}
    rng = random.Random(seed)
    bases = [BASE, {**BASE, "adv": "gae", "kl": False, "critic": 2}]
    out = []
    for _ in range(count):
        values = dict(rng.choice(bases))
        for key in rng.sample(sorted(domain), rng.randint(1, 3)):
            if key in values and rng.random() < 0.15:
                del values[key]  # verl's default
            else:
                values[key] = rng.choice(domain[key])
        out.append((rng.choice([1, 1, 2, 4]), values))
    return out


@needs_verl
@pytest.mark.slow  # ~1 s a combination on 2 busy cores (240 combinations): make test-extended; each rule is
@pytest.mark.extended  # checked against real verl by the test above, in make test
def test_the_driver_agrees_with_verl_on_a_grid_of_combinations(user_models: Path) -> None:
    _agree(random_grid(240), user_models / "model")


def test_the_grid_tries_every_key_and_gpu_count() -> None:
    grid = random_grid(240)
    assert {g for g, _ in grid} == {1, 2, 4}
    assert set(itertools.chain.from_iterable(v for _, v in grid)) == set(KEYS)
