"""The verl backend's checks with verl's own code (``hpo/backends/verl/_check.py``): verl's metric names, whether an
interpreter can run the trials, every corner of a space composed and validated in verl's interpreter (one line naming
the key and the value of a corner verl refuses), the tuned keys no worker of the run reads, and the seeds confirmation
varies.

Real verl 0.9.1 in ``.venv-verl`` (``make install-verl``) composes and validates configs (CPU only: verl 0.9.1 cannot
train without a GPU); those tests are skipped without it. The stand-in for ``main_ppo``: ``conftest.py``."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpo.backends import verl as _verl
from hpo.backends.verl import (
    ComposedConfig,
    VerlBackend,
    VerlConfigError,
    check_verl_metrics,
    check_verl_space,
    compose_corners,
)
from hpo.backends.verl._check import unread_tuned
from hpo.execution import MetricsTail
from hpo.experiment._objective import parse_objective
from hpo.experiment._space import Space, SpaceError, read_yaml
from tests.hpo.backends.verl.conftest import (
    SPACE_FILE,
    VAL,
    VERL_PY,
    composed,
    errors,
    launch,
    load_verl_space,
    needs_verl,
    small_verl_space,
    user_experiment,
    validate,
)
from tests.hpo.conftest import PY, ROOT, cli_env

pytestmark = pytest.mark.cpu_heavy  # verl on every core: make test-slow runs these one at a time


def test_the_core_metric_follows_the_reward_function() -> None:
    """verl 0.9.1 records a float score as `acc` too and makes `acc` the core variable; only a reward function
    returning a dict without `acc` leaves `reward` in val-core."""
    reward = "val-core/openai/gsm8k/reward/mean@1"
    old = dataclasses.replace(load_verl_space(), objective=parse_objective({"metric": reward},
                                                                           lambda w, m: SpaceError(m)))
    with pytest.raises(VerlConfigError, match="acc/mean@1"):  # what the shipped space used to name
        check_verl_metrics(old, composed())
    check_verl_metrics(old, composed(val_core_var="reward"))
    check_verl_metrics(old, composed(val_core_var=None))  # a custom function not probed: either name


def test_a_space_naming_a_metric_verl_does_not_log_is_a_one_line_error() -> None:
    space = load_verl_space()
    check_verl_metrics(space, composed())  # the shipped objective is verl's own validation score
    objective = parse_objective({"metric": "eval/reward_mean"}, lambda where, msg: SpaceError(f"{where}: {msg}"))
    bad = dataclasses.replace(space, objective=objective)
    with pytest.raises(VerlConfigError) as err:
        check_verl_metrics(bad, composed())
    assert err.value.where == "objective.metric" and "'eval/reward_mean'" in str(err.value)
    assert VAL in str(err.value) and "\n" not in str(err.value)
    es = dataclasses.replace(space, early_stopping=dataclasses.replace(  # the default spread, as a load fills it in
        space.early_stopping, enabled=True, metric=VerlBackend.metrics.spread))
    with pytest.raises(VerlConfigError, match="val_kwargs.n=1") as err:
        check_verl_metrics(es, composed())  # verl_core's eval/reward_std: verl logs no such spread
    assert err.value.where == "early_stopping.metric"
    spread = dataclasses.replace(es.early_stopping, metric="val-aux/openai/gsm8k/reward/std@4")
    four = parse_objective({"metric": "val-core/openai/gsm8k/acc/mean@4"}, lambda w, m: SpaceError(m))
    check_verl_metrics(dataclasses.replace(es, early_stopping=spread, objective=four), composed(val_n=4))
    with pytest.raises(VerlConfigError, match="mean@1"):  # the objective must follow val_kwargs.n
        check_verl_metrics(dataclasses.replace(es, early_stopping=spread), composed(val_n=4))


# ----------------------------------------------------------------------------- real verl: compose + validate
@pytest.mark.slow  # ~25 s on 2 cores: 24 compositions
@needs_verl
def test_shipped_space_composes_and_validates_with_real_verl() -> None:
    space = load_verl_space()
    report = check_verl_space(space, str(VERL_PY))
    assert len(report.corners) == 2 * 2 * 2 * 3  # every joint corner of actor_lr, kl_coef, temperature, mini_batch
    info = report.corners[0]
    assert (info.val_n, info.adv_estimator, info.total_training_steps, info.n_gpus) == (1, "grpo", 40, 1)
    assert info.use_reference_policy and not info.use_critic  # GRPO with a KL loss: a reference, no critic
    assert info.val_files[0].endswith(".cache/verl_hpo/gsm8k_small/test.parquet")
    assert (info.attn_implementation, info.rollout_name, info.val_core_var) == ("sdpa", "vllm", "acc")
    print(f"\ncomposed {len(report.corners)} corners in {report.seconds:.1f} s (first {report.corner_seconds[0]:.1f} "
          f"s with verl's imports, then {sum(report.corner_seconds[1:]) / (len(report.corners) - 1):.2f} s each)")


_BASE = ["algorithm.adv_estimator=grpo", "data.train_batch_size=8", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.use_kl_loss=true"]
_ONE = ["trainer.n_gpus_per_node=1", "trainer.nnodes=1"]
_A = "actor_rollout_ref.actor"
BAD_CASES: list[tuple[list[str], str | None, str | None]] = [  # extra overrides, key named, text in the message
    ([], None, None),
    (["+ray_kwargs.ray_init.include_dashboard=false"], None, None),  # '+' adds a key verl's config lacks
    (["ray_kwargs.ray_init.include_dashboard=false"], "ray_kwargs.ray_init.include_dashboard", "+ray_kwargs"),
    ([f"{_A}.no_such_key=1"], f"{_A}.no_such_key", "is not a key of verl's config"),
    ([f"{_A}.optim.lr=[1,"], f"{_A}.optim.lr", "not hydra override syntax"),
    ([f"{_A}.ppo_mini_batch_size=7"], f"{_A}.ppo_mini_batch_size", "=7 does not divide data.train_batch_size=8"),
    ([f"{_A}.ppo_mini_batch_size=16"], f"{_A}.ppo_mini_batch_size", "=16 is larger than data.train_batch_size=8"),
    ([f"{_A}.ppo_micro_batch_size_per_gpu=null"], f"{_A}.ppo_micro_batch_size_per_gpu", "=null: verl's actor"),
    # what verl's workers assert at start-up, minutes into a trial (engine_workers.py init_model)
    ([f"{_A}.use_dynamic_bsz=true", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=false",
      f"{_A}.ppo_max_token_len_per_gpu=4096"], f"{_A}.use_dynamic_bsz", "asserts they are equal"),
    (["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=null",
      "actor_rollout_ref.rollout.log_prob_micro_batch_size=4"],
     "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "the workers read only this one"),
    (["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=null",
      "actor_rollout_ref.ref.log_prob_micro_batch_size=4"],
     "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "is not read by verl's workers"),
    (["actor_rollout_ref.rollout.data_parallel_size=2"], "actor_rollout_ref.rollout.tensor_model_parallel_size",
     "= 2 GPUs per rollout replica does not divide the trial's 1 GPU"),
    # legacy reward keys compose and pass validate_config, but main_ppo 0.9.1 never reads them
    (["custom_reward_function.path=/my/reward.py"], "custom_reward_function.path",
     "set reward.custom_reward_function.path instead"),
    (["reward_model.enable=true"], "reward_model.enable", "reads reward.reward_model.enable"),
    ([f"{_A}.ppo_micro_batch_size_per_gpu=3"], f"{_A}.ppo_micro_batch_size_per_gpu", "=3 does not divide the 8"),
    (["trainer.n_gpus_per_node=3"], "data.train_batch_size", "16 samples is not divisible by the trial's 3 GPU"),
    (["actor_rollout_ref.rollout.tensor_model_parallel_size=2"],
     "actor_rollout_ref.rollout.tensor_model_parallel_size", "=2 does not divide the trial's 1 GPU"),
    (["actor_rollout_ref.rollout.n=1"], "actor_rollout_ref.rollout.n", "n=1 with algorithm.adv_estimator=grpo"),
    (["actor_rollout_ref.rollout.name=???"], "actor_rollout_ref.rollout.name", "has no value"),
    ([f"{_A}.use_dynamic_bsz=true", f"{_A}.ppo_max_token_len_per_gpu=100"], f"{_A}.ppo_max_token_len_per_gpu",
     "=100 is below one full sequence"),
    ([f"{_A}.ppo_micro_batch_size=2"], None, "verl's validate_config: "),  # caught by verl's own check
    (["actor_rollout_ref.rollout.val_kwargs.do_sample=true", "actor_rollout_ref.rollout.temperature=0"], None,
     "validation gen temperature should be greater than 0"),
]


def bad_corner(extra: list[str]) -> list[str]:
    return _BASE + _ONE + extra


@pytest.mark.slow  # 22 of the module's shared compositions (:func:`compositions`)
@needs_verl
def test_bad_corners_are_one_line_errors_naming_key_and_value(
        compositions: dict[str, list[ComposedConfig | VerlConfigError]]) -> None:
    for (extra, key, text), result in zip(BAD_CASES, compositions["bad corners"], strict=True):
        if text is None:
            assert isinstance(result, ComposedConfig), (extra, result)
            continue
        assert isinstance(result, VerlConfigError), extra
        message = str(result)
        assert "\n" not in message and text in message, (extra, message)
        assert result.key == key, (extra, result.key, message)
        if key is not None:
            assert f"{key}=" in message or f"{key} " in message, message


@needs_verl
@pytest.mark.slow  # a real verl (or stand-in) process: ~20-60 s; make test-slow / CI
def test_check_verl_space_names_the_parameter_and_the_value() -> None:
    actor_lr = read_yaml(SPACE_FILE)["params"]["actor_lr"]
    bad = load_verl_space(params={"actor_lr": actor_lr, "mini_batch": {
        "key": "actor_rollout_ref.actor.ppo_mini_batch_size", "type": "categorical", "choices": [8, 12]}})
    with pytest.raises(VerlConfigError) as err:
        check_verl_space(bad, str(VERL_PY))
    assert err.value.where == "params.mini_batch"
    assert "value 12 (with actor_lr=1e-07) is rejected by verl: " in str(err.value)
    assert "actor_rollout_ref.actor.ppo_mini_batch_size=12 does not divide data.train_batch_size=32" in str(err.value)
    driver_key = load_verl_space(overrides={**read_yaml(SPACE_FILE)["overrides"], "trainer.nnodes": 2})
    with pytest.raises(VerlConfigError, match="set by the driver") as err:
        check_verl_space(driver_key, str(VERL_PY))
    assert err.value.where == "overrides.trainer.nnodes"


@needs_verl
@pytest.mark.slow  # a real verl (or stand-in) process: ~20-60 s; make test-slow / CI
def test_verl_search_with_a_cpu_interpreter_exits_2_naming_the_fix(tmp_path: Path) -> None:
    raw = read_yaml(SPACE_FILE)
    raw["overrides"]["actor_rollout_ref.actor.ppo_mini_batch_size"] = 16
    raw["params"] = {"actor_lr": raw["params"]["actor_lr"]}
    raw["trial"] = {"backend": "verl", "python": str(VERL_PY), "devices": ["0"], "prepare_command": None}
    space = tmp_path / "verl_cpu.yaml"
    space.write_text(yaml.safe_dump(raw, sort_keys=False))
    res = subprocess.run([PY, "-m", "hpo", "search", "--space", str(space), "--studies-dir", str(tmp_path / "s")],
                         cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr[-2000:]
    assert len(res.stderr.strip().splitlines()) == 1 and "make install-verl-gpu" in res.stderr
    assert not (tmp_path / "s" / "verl_cpu").exists()  # no trial ran


@needs_verl
@pytest.mark.slow  # a real verl process (check_verl_space), and one of the module's shared compositions
def test_verl_s_composed_config_has_every_seed_that_confirm_varies(
        compositions: dict[str, list[ComposedConfig | VerlConfigError]]) -> None:
    from hpo.study._confirm import seed_overrides

    space = small_verl_space()
    report = check_verl_space(space, str(VERL_PY))
    assert report.corners[0].seed_keys == _verl_compose_seed_keys()
    # a confirmation run's overrides compose (each key exists) and set every seed
    seeds = seed_overrides(space, 1007)
    assert set(seeds) == set(_verl_compose_seed_keys()) and set(seeds.values()) == {1007}
    (result,) = compositions["confirmation seeds"]  # space_corner0(space, seeds) (:func:`compositions`)
    assert isinstance(result, ComposedConfig), result


def _verl_compose_seed_keys() -> tuple[str, ...]:
    from hpo.backends.verl._compose_checks import SEED_KEYS

    return SEED_KEYS


def space_corner0(space: Space, extra: dict[str, Any]) -> list[str]:
    corner = _verl.space_corners(space)[0]
    fixed = {k: v for k, v in space.overrides.items() if k not in extra}
    values = {p.key: corner.values[p.name] for p in space.params}
    return _verl.verl_overrides(fixed, {**values, **extra})


def reward_corners(root: Path) -> list[list[str]]:
    """A GRPO corner validated on 4 rows of ``root/test.parquet``, then the same with each of three custom reward
    functions: a plain float, a dict with ``acc``, a dict without."""
    from hpo.backends.verl._data import write_parquet

    val = write_parquet(root / "test.parquet", "test", n=4)
    fns = {"plain": "return 1.0", "acc": "return {'score': 1.0, 'acc': True}", "noacc": "return {'score': 1.0}"}
    ar = "actor_rollout_ref"
    corners = [["algorithm.adv_estimator=grpo", "data.train_batch_size=8", f"data.val_files={val}",
                f"{ar}.rollout.name=vllm", f"{ar}.rollout.n=2", f"{ar}.rollout.tensor_model_parallel_size=1",
                f"{ar}.actor.ppo_mini_batch_size=4", f"{ar}.actor.ppo_micro_batch_size_per_gpu=2",
                f"{ar}.rollout.log_prob_micro_batch_size_per_gpu=4", f"{ar}.ref.log_prob_micro_batch_size_per_gpu=4",
                "trainer.n_gpus_per_node=1", "trainer.nnodes=1"]]
    for name, body in fns.items():
        (root / f"{name}.py").write_text(f"def compute_score(data_source, solution_str, ground_truth, "
                                         f"extra_info=None):\n    {body}\n")
        corners.append([*corners[0], f"reward.custom_reward_function.path={root / name}.py"])
    return corners


@pytest.fixture(scope="module")
def compositions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[ComposedConfig | VerlConfigError]]:
    """The corners of three tests composed by real verl in one run of its interpreter (each run pays verl's imports,
    ~10-20 s on 2 cores): per test, its corners' results in order."""
    from hpo.study._confirm import seed_overrides

    space = small_verl_space()
    groups = {"bad corners": [bad_corner(extra) for extra, _, _ in BAD_CASES],
              "custom rewards": reward_corners(tmp_path_factory.mktemp("rewards")),
              "confirmation seeds": [[*space_corner0(space, seed_overrides(space, 1007)),
                                      "trainer.n_gpus_per_node=1", "trainer.nnodes=1"]]}  # as a trial composes it
    report = compose_corners(str(VERL_PY), "ppo_trainer", [c for corners in groups.values() for c in corners],
                             n_gpus=None)
    print(f"\n{len(report.results)} corners in {report.seconds:.1f} s")
    results, out = list(report.results), {}
    for name, corners in groups.items():
        out[name], results = results[:len(corners)], results[len(corners):]
    return out


@needs_verl
@pytest.mark.slow  # the module's shared compositions (:func:`compositions`)
def test_the_core_metric_of_a_custom_reward_function_is_found_by_calling_it(
        compositions: dict[str, list[ComposedConfig | VerlConfigError]]) -> None:
    assert [r.val_core_var if isinstance(r, ComposedConfig) else r for r in compositions["custom rewards"]] == [
        "acc", "acc", "acc", "reward"]


@needs_verl
def test_a_missing_data_file_is_refused_before_the_study(tmp_path: Path) -> None:
    raw = read_yaml(SPACE_FILE)
    typo = {**raw["overrides"], "data.train_files": str(tmp_path / "my_data" / "trian.parquet"),
            "actor_rollout_ref.actor.ppo_mini_batch_size": 16}
    with pytest.raises(VerlConfigError) as err:
        check_verl_space(small_verl_space(overrides=typo), str(VERL_PY))
    assert err.value.where == "overrides.data.train_files" and "trian.parquet does not exist" in str(err.value)


@pytest.mark.slow  # a real verl (or stand-in) process: ~20-60 s; make test-slow / CI
def test_a_custom_reward_without_acc_keeps_reward_as_the_core_metric(fake_verl: dict[str, str],
                                                                     tmp_path: Path) -> None:
    """verl names val-core after `acc` when the reward function's result has it (a float counts as acc too), else
    after `reward`: the stand-in scores with verl's own reward manager and names with verl's own code."""
    fn = tmp_path / "my_reward.py"
    fn.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                  "    return {'score': float(solution_str.endswith(str(ground_truth))), 'format': 1.0}\n")
    argv, env, metrics = launch(fake_verl, tmp_path / "trials", 0, [
        f"reward.custom_reward_function.path={fn}", "trainer.total_training_steps=2", "++fake.x=0.3"])
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    last = MetricsTail(metrics).read()[-1][1]
    assert last["val-core/openai/gsm8k/reward/mean@1"] == pytest.approx(1.0)
    assert "val-aux/openai/gsm8k/format/mean@1" in last and VAL not in last


# ----------------------------------------------------------------------------- the tuned keys no worker reads
GRPO = {"use_critic": False, "use_reference_policy": True, "adv_estimator": "grpo", "use_kl_loss": True,
        "use_kl_in_reward": False, "reward_model_enable": False, "rollout_name": "vllm"}


def test_the_keys_no_worker_reads() -> None:
    keys = [("params.critic_lr", "critic.optim.lr"), ("params.lr", "actor_rollout_ref.actor.optim.lr"),
            ("params.kl", "algorithm.kl_ctrl.kl_coef"), ("params.rm", "reward.reward_model.model_path"),
            ("params.sg", "+actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend"),
            ("params.vl", "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space"),
            ("params.klc", "actor_rollout_ref.actor.kl_loss_coef")]
    found = dict(unread_tuned(keys, GRPO))
    assert sorted(found) == ["params.critic_lr", "params.kl", "params.rm", "params.sg"]
    assert "no critic (algorithm.adv_estimator=grpo)" in found["params.critic_lr"]
    assert "use_kl_in_reward is false" in found["params.kl"] and "engine is vllm, not sglang" in found["params.sg"]
    off = dict(unread_tuned(keys, {**GRPO, "use_kl_loss": False}))
    assert "use_kl_loss is false" in off["params.klc"]
    assert unread_tuned(keys, {}) == []  # nothing known: nothing decided
    assert unread_tuned([("params.x", "+algorithm.kl_ctrl.kl_coeff")], GRPO) == []  # added: not verl's key


@pytest.mark.skipif(not (ROOT / ".venv-verl" / "bin" / "python").exists(), reason="needs make install-verl")
def test_validate_refuses_a_critic_key_in_a_grpo_run(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "hpo", "validate", "--space", str(ROOT / "search_spaces" / "verl_grpo_cpu.yaml"),
         "--override", "params.critic_lr={key: critic.optim.lr, type: float, low: 1.0e-6, high: 1.0e-4, log: true}"],
        cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "params.critic_lr" in lines[0] and "no critic" in lines[0], res.stderr


def test_gamma_and_lambda_are_dead_only_where_the_estimator_reads_neither() -> None:
    keys = [("params.lam", "algorithm.lam"), ("params.gamma", "algorithm.gamma")]
    def dead(info: dict[str, Any]) -> list[str]:
        return [where for where, _ in unread_tuned(keys, info)]

    assert dead({"adv_estimator": "grpo", "adv_reads": ()}) == ["params.lam", "params.gamma"]
    assert dead({"adv_estimator": "reinforce_plus_plus", "adv_reads": ("gamma",)}) == ["params.lam"]
    assert unread_tuned(keys, {"adv_estimator": "gae", "adv_reads": ("gamma", "lam")}) == []
    assert unread_tuned(keys, {"adv_estimator": "mine", "adv_reads": None}) == []  # not known: not decided


@needs_verl
def test_gae_s_lambda_tuned_under_grpo_is_refused(user_models: Path, tmp_path: Path) -> None:
    """verl 0.9.1's compute_advantage gives algorithm.lam to GAE only: under GRPO every trial would spend a dimension
    of the search on a value nothing reads."""
    space = user_experiment(tmp_path / "mine", user_models / "model",
                       changes={"params/lam": {"key": "algorithm.lam", "type": "float", "low": 0.9, "high": 1.0}})
    res = validate(space)
    assert res.returncode == 2, (res.stdout, res.stderr)
    line, = errors(res)
    assert "params.lam" in line and "algorithm.lam: algorithm.adv_estimator=grpo does not read it" in line, line


