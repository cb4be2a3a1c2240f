"""The verl backend under population-based training: a segment's argv (resume_path from another member's
checkpoint, the weights only) composes with verl 0.9.1's own config; verl's own checkpoint manager shows why the
weights only (the restored optimizer's learning rate wins otherwise) and that the config's rate wins with it. A real
verl segment logging the new ``actor/lr`` from the resumed step on: ``test_verl_real.py``."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from hpo.backends.verl._check import compose_corners
from hpo.backends.verl._launch import verl_argv, weights_only_overrides
from tests.hpo.backends.test_verl import VERL_PY, needs_verl

pytestmark = pytest.mark.cpu_heavy  # verl on every core: make test-slow runs these one at a time


@pytest.mark.slow  # ~10-30 s on 2 cores: verl's imports and one hydra composition
@needs_verl
def test_the_segment_argv_composes_with_verl(tmp_path: Path) -> None:
    argv = verl_argv(str(VERL_PY), "ppo_trainer",
                     ["trainer.total_training_steps=8", "trainer.save_freq=8", "actor_rollout_ref.actor.optim.lr=3e-4",
                      "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                      "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                      "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
                      "critic.ppo_micro_batch_size_per_gpu=2", *weights_only_overrides()],
                     "s", 3, tmp_path / "3", 1, tmp_path / "pbt" / "m1-s2-ab" / "global_step_4")
    overrides = [a for a in argv[3:] if not a.startswith(("hydra.", "++ray_kwargs"))]
    assert "trainer.resume_mode=resume_path" in overrides
    assert f"trainer.resume_from_path={tmp_path / 'pbt' / 'm1-s2-ab' / 'global_step_4'}" in overrides
    report = compose_corners(str(VERL_PY), "ppo_trainer", [overrides], n_gpus=None)
    errors = [c for c in report.corners if isinstance(c, Exception)]
    assert not errors, errors
    code = textwrap.dedent("""
        import sys
        from hydra import compose, initialize_config_module
        from omegaconf import OmegaConf
        with initialize_config_module("verl.trainer.config", version_base=None):
            cfg = compose("ppo_trainer", overrides=sys.argv[1:])
        for key in ("actor_rollout_ref.actor.checkpoint.load_contents", "critic.checkpoint.load_contents",
                    "trainer.resume_mode", "trainer.resume_from_path", "actor_rollout_ref.actor.optim.lr"):
            print(key, OmegaConf.to_container(cfg, resolve=True) and OmegaConf.select(cfg, key))
    """)
    res = subprocess.run([str(VERL_PY), "-c", code, *overrides], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    seen = dict(line.split(" ", 1) for line in res.stdout.strip().splitlines())
    assert seen["actor_rollout_ref.actor.checkpoint.load_contents"] == "['model']"
    assert seen["critic.checkpoint.load_contents"] == "['model']"
    assert seen["trainer.resume_mode"] == "resume_path" and seen["actor_rollout_ref.actor.optim.lr"] == "0.0003"


@pytest.mark.slow  # ~10-30 s on 2 cores: torch, transformers and verl imported in verl's interpreter
@needs_verl
def test_verls_checkpoint_manager_restores_the_old_lr_unless_weights_only(tmp_path: Path) -> None:
    """verl 0.9.1's FSDPCheckpointManager (the one its FSDP engine uses) saves a tiny model's state and loads it into
    an optimizer built with a new learning rate: with the default load_contents the checkpoint's rate is the one
    in force after the scheduler's step; with load_contents=[model] the config's is, and the weights are restored."""
    code = textwrap.dedent("""
        import os, tempfile, torch, transformers, torch.distributed as dist
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("PORT", "29533"))
        dist.init_process_group("gloo", rank=0, world_size=1)
        from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
        from verl.utils.torch_functional import get_constant_schedule_with_warmup
        from verl.trainer.config import CheckpointConfig
        def build(lr, load):
            torch.manual_seed(0)
            m = transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=32, hidden_size=8,
                intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
            o = torch.optim.AdamW(m.parameters(), lr=lr)
            s = get_constant_schedule_with_warmup(o, 0)
            cfg = CheckpointConfig(save_contents=["model", "optimizer", "extra"], load_contents=load)
            return m, o, s, FSDPCheckpointManager(model=m, optimizer=o, lr_scheduler=s, checkpoint_config=cfg)
        m, o, s, mgr = build(1e-5, ["model", "optimizer", "extra"])
        m(torch.randint(0, 32, (2, 5))).logits.sum().backward(); o.step(); s.step()
        d = os.path.join(os.environ["OUT"], "global_step_2")
        mgr.save_checkpoint(d, global_step=2)
        for load in (["model", "optimizer", "extra"], ["model"]):
            m2, o2, s2, mgr2 = build(3e-4, load)
            mgr2.load_checkpoint(d, del_local_after_load=False)
            s2.step()
            print(len(load), o2.param_groups[0]["lr"], torch.equal(m2.lm_head.weight, m.lm_head.weight))
    """)
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    res = subprocess.run([str(VERL_PY), "-c", code], capture_output=True, text=True, timeout=300,
                         env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path), "PORT": str(port), "HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()[-2:]
    assert lines == ["3 1e-05 True", "1 0.0003 True"]
