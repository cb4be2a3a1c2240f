"""Throughput studies' schema (hpo/experiment/_throughput.py) and their backends' key checks: every refusal is one
line naming the file and key, exit 2, before any study exists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpo.backends import load_space
from hpo.experiment._space import SpaceError
from hpo.experiment._throughput import is_speed_key
from tests.hpo.conftest import cli_env

SPACES = Path(__file__).resolve().parents[3] / "search_spaces"


def _space(tmp_path: Path, **changes: Any) -> Path:
    """A verl_core throughput experiment in a directory of the user's own; ``changes``: top-level sections merged."""
    raw: dict[str, Any] = {
        "config": "tiny_arith",
        "overrides": {"trainer.total_training_steps": 3, "trainer.test_freq": -1, "trainer.val_before_train": False},
        "params": {"micro": {"key": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "type": "categorical",
                             "choices": [8, 16]}},
        "study": {"kind": "throughput", "n_trials": 2},
    }
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict) and key != "params":
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    path = tmp_path / "speed.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _refused(path: Path, *where: str) -> str:
    with pytest.raises(SpaceError) as err:
        load_space(str(path))
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg, msg
    for w in where:
        assert w in msg, msg
    return msg


def test_a_throughput_study_gets_no_pruner_no_early_stopping_and_the_mean_of_measured_steps(tmp_path: Path) -> None:
    space = load_space(str(_space(tmp_path)))
    assert space.study.kind == "throughput"
    assert space.study.pruner.type == "none" and not space.early_stopping.enabled
    assert (space.objective.metric, space.objective.direction, space.objective.aggregate) == (
        "perf/throughput", "maximize", "mean")
    assert space.objective.aggregated([[10.0], [20.0], [30.0]]) == [20.0]


@pytest.mark.parametrize("key", ["actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.actor.ppo_epochs",
                                 "actor_rollout_ref.rollout.n", "data.train_batch_size",
                                 "actor_rollout_ref.actor.loss_agg_mode"])
def test_a_learning_key_is_refused(tmp_path: Path, key: str) -> None:
    choices = {"actor_rollout_ref.actor.loss_agg_mode": ["token-mean", "seq-mean-token-sum"]}.get(key, [1, 2])
    path = _space(tmp_path, params={"x": {"key": key, "type": "categorical", "choices": choices}})
    msg = _refused(path, "params.x.key", key, "changes what the model learns")
    assert "ppo_micro_batch_size_per_gpu" in msg  # names what may be tuned


def test_a_learning_key_in_the_users_config_is_refused(tmp_path: Path) -> None:
    path = _space(tmp_path, study={"kind": "throughput", "baseline": {"actor_rollout_ref.actor.optim.lr": 1e-5}})
    _refused(path, "study.baseline.actor_rollout_ref.actor.optim.lr", "changes what the model learns")


def test_neutral_keys_let_a_user_declare_a_key_of_their_own(tmp_path: Path) -> None:
    path = _space(tmp_path, params={"x": {"key": "actor_rollout_ref.actor.loss_agg_mode", "type": "categorical",
                                          "choices": ["token-mean", "seq-mean-token-sum"]}},
                  study={"kind": "throughput", "throughput": {"neutral_keys": ["actor_rollout_ref.actor.loss_*"]}})
    assert load_space(str(path)).params[0].key == "actor_rollout_ref.actor.loss_agg_mode"


def test_the_verl_backend_knows_its_own_speed_keys(tmp_path: Path) -> None:
    from hpo.backends.verl._backend import VerlBackend

    assert VerlBackend.speed is not None
    keys = VerlBackend.speed.keys
    for ok in ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "+actor_rollout_ref.rollout.max_num_seqs",
               "actor_rollout_ref.ref.fsdp_config.param_offload", "actor_rollout_ref.rollout.gpu_memory_utilization",
               "critic.fsdp.optimizer_offload", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"):
        assert is_speed_key(ok, keys), ok
    for bad in ("actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.rollout.n", "data.train_batch_size",
                "actor_rollout_ref.actor.ppo_epochs", "actor_rollout_ref.actor.ppo_mini_batch_size",
                "actor_rollout_ref.rollout.temperature", "actor_rollout_ref.actor.loss_agg_mode"):
        assert not is_speed_key(bad, keys), bad


def test_no_speed_knob_is_refused(tmp_path: Path) -> None:
    _refused(_space(tmp_path, params={}), "params", "at least one speed knob")


def test_a_warmup_as_long_as_the_trial_is_refused(tmp_path: Path) -> None:
    path = _space(tmp_path, study={"kind": "throughput", "throughput": {"warmup_steps": 3}})
    _refused(path, "study.throughput.warmup_steps", "3 step(s)", "no step would be measured")


@pytest.mark.parametrize("objective, where", [
    ({"metric": "eval/reward_mean", "direction": "maximize"}, "objective.metric"),
    ({"metric": "perf/throughput", "direction": "minimize"}, "objective.direction"),
    ({"metric": "perf/throughput", "aggregate": "last"}, "objective.aggregate"),
    ({"mode": "pareto", "objectives": [{"metric": "perf/throughput", "direction": "maximize"},
                                       {"metric": "eval/reward_mean", "direction": "maximize"}]},
     "objective.objectives[1].metric"),
])
def test_an_objective_that_is_not_a_throughput_metric_is_refused(tmp_path: Path, objective: dict[str, Any],
                                                                 where: str) -> None:
    _refused(_space(tmp_path, objective=objective), where)


def test_memory_as_a_second_objective_is_a_pareto_throughput_study(tmp_path: Path) -> None:
    path = _space(tmp_path, objective={"mode": "pareto", "objectives": [
        {"metric": "perf/throughput", "direction": "maximize"},
        {"metric": "perf/cpu_memory_used_gb", "direction": "minimize"}]})
    assert load_space(str(path)).objective.multi


def test_a_pruner_in_a_throughput_study_is_refused(tmp_path: Path) -> None:
    _refused(_space(tmp_path, study={"kind": "throughput", "pruner": {"type": "median"}}), "study.pruner.type")


def test_the_cli_refuses_before_any_study_exists(tmp_path: Path) -> None:
    """From a directory of the user's own: one line, exit 2, no storage and no studies-dir entry."""
    path = _space(tmp_path, params={"lr": {"key": "actor_rollout_ref.actor.optim.lr", "type": "float",
                                           "low": 1e-6, "high": 1e-4, "log": True}})
    studies = tmp_path / "studies"
    proc = subprocess.run([sys.executable, "-m", "hpo", "search", "--space", str(path), "--studies-dir",
                           str(studies)], cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "params.lr.key" in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert not studies.exists()


@pytest.mark.parametrize("name", ["throughput_cpu", "verl_throughput_cpu", "verl_throughput_gsm8k"])
def test_the_shipped_throughput_experiments_parse(name: str) -> None:
    space = load_space(str(SPACES / f"{name}.yaml"))
    assert space.study.kind == "throughput" and space.params
