"""A tuned key that no worker of the run reads, decided from verl's composed config (issue 43 item 8): a critic key
in a GRPO run (no critic), the KL-loss coefficient without use_kl_loss, another rollout engine's engine_kwargs. Each
is one line naming the parameter, before any study: every trial would spend a search dimension on nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpo.backends.verl._check import unread_tuned
from tests.hpo.conftest import cli_env

ROOT = Path(__file__).resolve().parents[3]
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
