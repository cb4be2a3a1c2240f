"""The config schema: documented keys, typed overrides, one-line errors, torch-free import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from verl_core.config import (
    CONFIG_DIR,
    ConfigError,
    derive_sizes,
    flatten,
    iter_fields,
    known_keys,
    load_config,
)


def test_every_key_is_documented() -> None:
    missing = [k for k, _, f in iter_fields() if not f.metadata.get("help")]
    assert missing == []


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load_and_every_key_has_a_comment(path: Path) -> None:
    load_config(str(path))
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        assert i > 0 and lines[i - 1].strip().startswith("#"), f"{path.name}:{i + 1} has no comment above: {line}"


def test_verl_key_names_exist() -> None:
    keys = set(known_keys())
    for key in ["data.train_batch_size", "data.max_prompt_length", "data.max_response_length",
                "actor_rollout_ref.model.path", "actor_rollout_ref.actor.optim.lr",
                "actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                "actor_rollout_ref.actor.ppo_epochs", "actor_rollout_ref.actor.clip_ratio",
                "actor_rollout_ref.actor.entropy_coeff", "actor_rollout_ref.actor.use_kl_loss",
                "actor_rollout_ref.actor.kl_loss_coef", "actor_rollout_ref.actor.kl_loss_type",
                "actor_rollout_ref.actor.grad_clip", "actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.n",
                "actor_rollout_ref.rollout.temperature", "critic.optim.lr", "critic.cliprange_value",
                "algorithm.adv_estimator", "algorithm.gamma", "algorithm.lam", "algorithm.use_kl_in_reward",
                "algorithm.kl_penalty", "algorithm.kl_ctrl.type", "algorithm.kl_ctrl.kl_coef",
                "algorithm.kl_ctrl.target_kl", "algorithm.kl_ctrl.horizon", "reward_model.enable",
                "reward_model.temperature", "custom_reward_function.path", "custom_reward_function.name",
                "trainer.total_training_steps", "trainer.test_freq", "trainer.val_before_train",
                "trainer.save_freq", "trainer.default_local_dir", "trainer.device", "trainer.seed"]:
        assert key in keys, key


def test_overrides_are_typed() -> None:
    cfg = load_config("tiny_arith", ["actor_rollout_ref.actor.optim.lr=3e-5", "algorithm.kl_ctrl.kl_coef=0.1",
                                     "trainer.val_before_train=false", "data.train_batch_size=32",
                                     "actor_rollout_ref.actor.kl_threshold=null", "trainer.logger=[file]"])
    assert cfg.actor_rollout_ref.actor.optim.lr == pytest.approx(3e-5)
    assert cfg.algorithm.kl_ctrl.kl_coef == pytest.approx(0.1)
    assert cfg.trainer.val_before_train is False
    assert cfg.data.train_batch_size == 32
    assert cfg.trainer.logger == ["file"]
    # later layers win: YAML over defaults, overrides over YAML
    assert load_config("tiny_arith").actor_rollout_ref.actor.optim.lr == pytest.approx(1e-5)


@pytest.mark.parametrize("override, needle", [
    ("actor_rollout_ref.actor.optim.lrr=1e-5", "unknown config key 'actor_rollout_ref.actor.optim.lrr'"),
    ("data.train_batch_size=abc", "data.train_batch_size='abc' is not a valid int"),
    ("data.train_batch_size=1.5", "data.train_batch_size=1.5 is not a valid int"),
    ("trainer.val_before_train=maybe", "trainer.val_before_train='maybe' is not a valid bool"),
    ("algorithm.adv_estimator=ppo", "algorithm.adv_estimator='ppo' is not one of gae, grpo"),
    ("algorithm.kl_ctrl=3", "key 'algorithm.kl_ctrl' is a section"),
    ("critic.forward_micro_batch_size_per_gpu=0", "critic.forward_micro_batch_size_per_gpu=0 must be positive"),
    ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=-4",
     "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=-4 must be positive"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size=48",
     "data.train_batch_size=64 is not divisible by actor_rollout_ref.actor.ppo_mini_batch_size=48"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=12",
     "is not divisible by actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=12"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size=128",
     "actor_rollout_ref.actor.ppo_mini_batch_size=128 is larger than data.train_batch_size=64"),
    ("algorithm.gamma=1.5", "algorithm.gamma=1.5 must be in [0, 1]"),
    ("actor_rollout_ref.rollout.temperature=0", "actor_rollout_ref.rollout.temperature=0.0 must be > 0"),
    ("actor_rollout_ref.rollout.val_kwargs.do_sample=true actor_rollout_ref.rollout.val_kwargs.temperature=0",
     "actor_rollout_ref.rollout.val_kwargs.temperature=0.0 must be > 0 with val_kwargs.do_sample=true"),
    ("actor_rollout_ref.rollout.val_kwargs.do_sample=true actor_rollout_ref.rollout.val_kwargs.temperature=-1",
     "actor_rollout_ref.rollout.val_kwargs.temperature=-1.0 must be > 0 with val_kwargs.do_sample=true"),
    ("noequals", "expected key=value"),
])
def test_bad_overrides_are_one_line_errors(override: str, needle: str) -> None:
    """``override`` is one or more space-separated ``key=value`` (tiny_arith validates greedily)."""
    with pytest.raises(ConfigError) as info:
        load_config("tiny_arith", override.split())
    msg = str(info.value)
    assert needle in msg
    assert "\n" not in msg


@pytest.mark.parametrize("other", ["actor_rollout_ref.rollout.fast_decode=false",
                                   "actor_rollout_ref.rollout.name=vllm"])
def test_reuse_log_probs_needs_the_fast_hf_decoder(other: str) -> None:
    with pytest.raises(ConfigError, match="reuse_log_probs=true needs rollout.name=hf with fast_decode=true"):
        load_config("tiny_arith", ["actor_rollout_ref.rollout.reuse_log_probs=true", other])
    load_config("tiny_arith", [other])


def test_grpo_needs_groups() -> None:
    with pytest.raises(ConfigError, match="rollout.n=1 must be > 1"):
        load_config("tiny_arith", ["algorithm.adv_estimator=grpo"])


def test_dynamic_gamma_with_grpo_is_an_error() -> None:
    """GRPO does not discount: a gamma schedule there would silently do nothing."""
    grpo = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4"]
    with pytest.raises(ConfigError) as info:
        load_config("tiny_arith", [*grpo, "algorithm.dynamic_gamma.enable=true"])
    assert str(info.value) == ("algorithm.dynamic_gamma.enable=true has no effect with "
                               "algorithm.adv_estimator=grpo (only gae discounts)")
    load_config("tiny_arith", grpo)
    load_config("tiny_arith", ["algorithm.dynamic_gamma.enable=true"])


def test_greedy_validation_ignores_its_temperature() -> None:
    """verl's validation default (greedy, temperature 0) is valid; sampling at temperature 0 is not."""
    cfg = load_config(None)
    vk = cfg.actor_rollout_ref.rollout.val_kwargs
    assert (vk.do_sample, vk.temperature, vk.n) == (False, 0.0, 1)
    load_config("tiny_arith", ["actor_rollout_ref.rollout.val_kwargs.do_sample=false",
                               "actor_rollout_ref.rollout.val_kwargs.temperature=0"])


def test_defaults_follow_verl() -> None:
    cfg = load_config(None)
    assert cfg.actor_rollout_ref.actor.optim.lr == pytest.approx(1e-6)
    assert cfg.critic.optim.lr == pytest.approx(1e-5)
    assert cfg.actor_rollout_ref.actor.shuffle is False
    assert load_config("tiny_arith").actor_rollout_ref.actor.shuffle is True  # documented in the YAML


def test_val_aux_metrics_need_several_validation_samples() -> None:
    from verl_core.config import produces_metric

    metric = "val-aux/synthetic/arith/reward/std@4"
    assert not produces_metric(load_config("tiny_arith"), metric)
    assert produces_metric(load_config("tiny_arith", ["actor_rollout_ref.rollout.val_kwargs.n=4"]), metric)


def test_bad_yaml_file_names_file_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("data:\n  train_batch_sise: 8\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: unknown config key 'data.train_batch_sise'"):
        load_config(str(bad))
    bad.write_text("data: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: line \d+ invalid YAML"):
        load_config(str(bad))
    with pytest.raises(ConfigError, match="no such file or shipped config"):
        load_config("nope")


def test_derived_sizes() -> None:
    cfg = load_config("tiny_arith", ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4",
                                     "data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                                     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"])
    s = derive_sizes(cfg)
    assert (s.batch_samples, s.actor_mini_samples, s.actor_num_mini, s.actor_grad_accum) == (64, 32, 2, 4)
    assert s.critic_mini_samples == 32 and s.critic_micro_samples == 8


def test_flatten_keeps_lists() -> None:
    assert flatten({"a": {"b": 1, "c": [1, 2]}}) == {"a.b": 1, "a.c": [1, 2]}


def test_config_module_does_not_import_torch() -> None:
    code = "import sys, verl_core.config as c; c.load_config('tiny_arith'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cli_bad_override_exits_2_with_one_line() -> None:
    out = subprocess.run([sys.executable, "-m", "verl_core", "train", "--config", "tiny_arith",
                          "algorithm.kl_ctrl.kl_coef=lots"], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0
    assert "algorithm.kl_ctrl.kl_coef='lots'" in out.stderr
    assert "Traceback" not in out.stderr
