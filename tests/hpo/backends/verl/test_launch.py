"""A verl trial's launch (``hpo/backends/verl/_launch.py``): hydra's override syntax, the trial's argv and environment
(its own scratch, Ray and logger settings), the default interpreter, and what the stand-in for ``main_ppo``
(``conftest.py``) does with them: the contract toward the driver, and a trial run by the driver's runner and cleaned
up. Under population-based training a segment's argv (resume_path from another member's checkpoint, the weights only)
composes with verl 0.9.1's own config; verl's own checkpoint manager shows why the weights only (the restored
optimizer's learning rate wins otherwise) and that the config's rate wins with it. A real verl segment logging the new
``actor/lr`` from the resumed step on: ``test_real.py``."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from hpo.backends import verl as _verl
from hpo.backends.verl import (
    DRIVER_KEYS,
    format_override,
    scratch_dir,
    verl_argv,
    verl_cleanup,
    verl_env,
)
from hpo.backends.verl._check import compose_corners
from hpo.backends.verl._cpu import host_cpus, storage_units
from hpo.backends.verl._launch import weights_only_overrides
from hpo.execution import MetricsTail, TrialProcess, TrialRun
from tests.hpo.backends.verl.conftest import VAL, VERL_PY, launch, needs_verl

pytestmark = pytest.mark.cpu_heavy  # verl on every core: make test-slow runs these one at a time


# ----------------------------------------------------------------------------- hydra override syntax
@pytest.mark.parametrize(("key", "value", "text"), [
    ("actor_rollout_ref.actor.optim.lr", 1e-6, "actor_rollout_ref.actor.optim.lr=1e-06"),
    ("data.train_batch_size", 32, "data.train_batch_size=32"),
    ("trainer.val_before_train", False, "trainer.val_before_train=false"),
    ("actor_rollout_ref.rollout.val_kwargs.top_k", None, "actor_rollout_ref.rollout.val_kwargs.top_k=null"),
    ("trainer.logger", ["console", "file"], "trainer.logger=[console,file]"),
    ("+ray_kwargs.ray_init.num_cpus", 4, "+ray_kwargs.ray_init.num_cpus=4"),
    ("++a.b", "x", "++a.b=x"),
    ("model.path", "Qwen/Qwen2.5-0.5B-Instruct", "model.path=Qwen/Qwen2.5-0.5B-Instruct"),
    ("a.b", "true", "a.b='true'"),  # a string that hydra would read as a bool stays a string
    ("a.b", "1", "a.b='1'"),
    ("a.b", "null", "a.b='null'"),
    ("a.b", "hello world", "a.b='hello world'"),
    ("a.b", "it's", "a.b='it\\'s'"),
    ("a.b", "", "a.b=''"),
    ("a.b", "${oc.env:HOME}/x.parquet", "a.b='${oc.env:HOME}/x.parquet'"),
    ("a.b", float("inf"), "a.b=inf"),
    ("a.b", [1, "a,b", None], "a.b=[1,'a,b',null]"),
])
def test_format_override(key: str, value: Any, text: str) -> None:
    assert format_override(key, value) == text


@needs_verl
def test_format_override_round_trips_through_hydras_own_parser() -> None:
    values = [1e-6, 0.1, 3, -2, True, None, "true", "1", "1e5", "nan", "", "a b", "it's", "back\\slash", "end\\",
              "quote\\'", "a,b", "a=b", "[x]", "{x}", "a:b", "/tmp/x-y.parquet", "${oc.env:HOME}/d", "~/x", "#x",
              ["console", "file"], [1, [2, "a b"]], {"k": 1, "v": "x y"}, float("inf"), float("-inf")]
    lines = [format_override("a.b", v) for v in values]
    code = textwrap.dedent("""
        import json, sys
        from hydra.core.override_parser.overrides_parser import OverridesParser
        p = OverridesParser.create()
        print(json.dumps([repr(p.parse_override(line).value()) for line in json.load(sys.stdin)]))
    """)
    res = subprocess.run([str(VERL_PY), "-c", code], input=json.dumps(lines), capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == [repr(v) for v in values]


# ----------------------------------------------------------------------------- argv and environment
def test_verl_argv_default_config(tmp_path: Path) -> None:
    trial_dir = tmp_path / "trials" / "3"
    argv = verl_argv("/venv/bin/python", "ppo_trainer", ["data.train_batch_size=32", "+fake.x=0.1"], "study-a", 3,
                     trial_dir, n_gpus=2)
    assert argv[:3] == ["/venv/bin/python", "-m", "verl.trainer.main_ppo"]
    assert argv[3:5] == ["data.train_batch_size=32", "+fake.x=0.1"]  # the space's, untouched, before the driver's
    units = storage_units(host_cpus(), cpu_platform=False)  # TransferQueue sized to this host (2 to 8)
    assert argv[5:] == [
        f"++transfer_queue.backend.SimpleStorage.num_data_storage_units={units}",
        "trainer.logger=[console,file]", "trainer.project_name=study-a", "trainer.experiment_name=trial-3",
        f"trainer.default_local_dir={trial_dir / 'checkpoints'}", "trainer.n_gpus_per_node=2", "trainer.nnodes=1",
        "trainer.resume_mode=auto", f"hydra.run.dir={trial_dir / 'hydra'}",
        "++ray_kwargs.ray_init.include_dashboard=false"]
    assert {_verl.override_key(a) for a in argv[5:]} >= set(DRIVER_KEYS) - {"trainer.resume_from_path"}
    assert not any(a.startswith("trainer.device=") for a in argv)  # GPUs handed: no CPU platform


def test_verl_argv_user_yaml_resume_cpu_and_loggers(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    yaml_path = tmp_path / "conf" / "my_grpo.yaml"
    yaml_path.write_text("defaults: [ppo_trainer, _self_]\n")
    resume = tmp_path / "trials" / "0" / "checkpoints" / "global_step_6"
    argv = verl_argv("py", str(yaml_path), ["trainer.logger=[console,wandb]",
                                            "+ray_kwargs.ray_init.include_dashboard=true"],
                     "s", 7, tmp_path / "trials" / "7", n_gpus=0, resume_from=resume)
    assert argv[3:7] == ["--config-path", str(tmp_path / "conf"), "--config-name", "my_grpo"]
    assert "trainer.logger=[console,file,wandb]" in argv  # the space's loggers kept, file added once
    assert sum(a.startswith("trainer.logger=") for a in argv) == 1
    assert f"trainer.default_local_dir={tmp_path / 'trials' / '7' / 'checkpoints'}" in argv  # its own
    assert argv[-3:-1] == ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={resume}"]  # the chain's
    assert "trainer.n_gpus_per_node=1" in argv  # a CPU-only host: the least verl accepts
    assert "++ray_kwargs.ray_init.include_dashboard=false" not in argv  # the space's own choice wins
    assert verl_argv("py", "ppo_megatron_trainer", [], "s", 1, tmp_path, 1)[3:5] == ["--config-name",
                                                                                   "ppo_megatron_trainer"]


def test_verl_env_isolates_each_attempt(tmp_path: Path) -> None:
    base = {"PATH": "/bin", "RAY_ADDRESS": "10.0.0.1:6379", "CUDA_VISIBLE_DEVICES": "1", "KEEP": "x"}
    long_dir = tmp_path / ("d" * 60) / "trials" / "5"
    first, retry = verl_env(base, long_dir, 0), verl_env(base, long_dir, 1)
    other = verl_env(base, tmp_path / ("d" * 60) / "trials" / "6", 0)
    assert first["VERL_FILE_LOGGER_PATH"] == str(long_dir / "metrics.jsonl")
    assert retry["VERL_FILE_LOGGER_PATH"] == str(long_dir / "metrics.attempt1.jsonl")
    assert len({first["RAY_TMPDIR"], retry["RAY_TMPDIR"], other["RAY_TMPDIR"]}) == 3
    for env in (first, retry, other):
        assert "RAY_ADDRESS" not in env  # never join a cluster someone else started
        assert env["TMPDIR"] == env["RAY_TMPDIR"] and Path(env["RAY_TMPDIR"]).is_dir()
        # Ray's sockets: <RAY_TMPDIR>/ray/session_<26-char date>_<7-digit pid>/sockets/plasma_store <= 107 bytes
        assert len(env["RAY_TMPDIR"] + "/ray/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store") <= 107
        assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["KEEP"] == "x" and env["HYDRA_FULL_ERROR"] == "1"
        assert env["RAY_AUTH_MODE"] == "token" and len(env["RAY_AUTH_TOKEN"]) == 64  # no ~/.ray/auth_token
    assert base["RAY_ADDRESS"] == "10.0.0.1:6379"  # the caller's mapping is not changed
    assert first["RAY_AUTH_TOKEN"] != other["RAY_AUTH_TOKEN"]
    assert verl_env({"RAY_AUTH_MODE": "disabled"}, long_dir, 0).get("RAY_AUTH_TOKEN") is None  # trial.env wins
    short = Path("/tmp/t1")
    assert scratch_dir(short, 0) == short / "tmp" and scratch_dir(short, 2) == short / "tmp2"
    for env, d, k in ((first, long_dir, 0), (retry, long_dir, 1), (other, tmp_path / ("d" * 60) / "trials" / "6", 0)):
        verl_cleanup(d, k)
        assert not Path(env["RAY_TMPDIR"]).exists()


def test_default_python_prefers_the_gpu_venv(tmp_path: Path) -> None:
    for venv in (".venv-verl", ".venv-gpu-verl"):
        (tmp_path / venv / "bin").mkdir(parents=True)
        (tmp_path / venv / "bin" / "python").write_text("")
        assert _verl.default_python(tmp_path) == str(tmp_path / venv / "bin" / "python")


# ----------------------------------------------------------------------------- the stand-in main_ppo
@pytest.mark.slow  # a real verl (or stand-in) process: ~20-60 s; make test-slow / CI
def test_stand_in_speaks_the_contract(fake_verl: dict[str, str], tmp_path: Path) -> None:
    trials, cwd = tmp_path / "trials", tmp_path / "cwd"
    cwd.mkdir()
    argv, env, metrics = launch(fake_verl, trials, 0, [f"+fake.env_file={tmp_path / 'seen.json'}", "+fake.nan_at=3"])
    res = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    records = MetricsTail(metrics).read()
    assert [s for s, _ in records] == list(range(11))
    assert [s for s, d in records if VAL in d] == [0, 2, 4, 6, 8, 10]
    assert records[-1][1][VAL] == pytest.approx(1 - 0.2 ** 2)
    assert "val-aux/openai/gsm8k/reward/mean@1" in records[-1][1]  # verl 0.9.1: `acc` is core, reward aux
    assert all(not k.startswith("val-core/") or k == VAL for _, d in records for k in d)
    nan_line = metrics.read_text().splitlines()[3]
    assert '"actor/pg_loss":null' in nan_line and '"actor/grad_norm":null' in nan_line  # orjson: NaN/inf -> null
    ckpt = trials / "0" / "checkpoints"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "10"
    assert sorted(p.name for p in ckpt.glob("global_step_*")) == [
        "global_step_10", "global_step_3", "global_step_6", "global_step_9"]
    assert sorted(p.name for p in (ckpt / "global_step_9" / "actor").iterdir()) == [
        "extra_state_world_size_1_rank_0.pt", "huggingface", "model_world_size_1_rank_0.pt",
        "optim_world_size_1_rank_0.pt"]
    assert all(_verl.checkpoint_complete(d) for d in ckpt.glob("global_step_*"))
    assert (trials / "0" / "hydra" / ".hydra" / "overrides.yaml").is_file()
    assert list(cwd.iterdir()) == []  # nothing in the driver's working directory (hydra's outputs/ included)
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["cfg"]["trainer.logger"] == ["console", "file"] and seen["cfg"]["fake.x"] == 0.5
    assert seen["env"]["RAY_TMPDIR"] == env["RAY_TMPDIR"] and "RAY_ADDRESS" not in seen["env"]
    assert "step:10 - " in res.stdout  # verl's console logger
    # a key verl's config lacks needs '+': hydra's own error, exit 1
    bad, env2, _ = launch(fake_verl, trials, 1, ["fake.y=1"])
    res = subprocess.run(bad, env=env2, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1 and "use +fake.y=1" in res.stderr


def test_the_driver_runner_runs_a_verl_trial_and_cleans_up(fake_verl: dict[str, str], tmp_path: Path) -> None:
    """Through hpo.execution._runner.TrialProcess as the driver runs trials: metrics reach the callback, the stand-in's
    "raylet" (own session, like Ray's processes) is killed with the trial, the scratch directory goes."""
    trials = tmp_path / "trials"
    argv, env, metrics = launch(fake_verl, trials, 0, ["+fake.ray_child=true", "+fake.crash_at=5"])
    seen: list[int] = []

    def on_metrics(step: int, data: dict[str, Any]) -> str | None:
        seen.append(step)
        return None

    result = TrialProcess(TrialRun(argv, env, trials / "0", metrics, on_metrics=on_metrics),
                          memory_mechanism="poll").run()
    assert result.failure == "crash" and result.final_exception == "RuntimeError: stand-in crash at step 5"
    assert seen == [0, 1, 2, 3, 4] and result.leftovers_killed >= 1
    scratch = Path(env["RAY_TMPDIR"])
    assert (scratch / "ray" / "session_latest" / "logs" / "raylet.out").is_file()
    verl_cleanup(trials / "0", 0, keep_logs=True)  # a failed trial keeps Ray's logs in its directory
    assert not scratch.exists()
    assert (trials / "0" / "ray_logs" / "raylet.out").read_text().startswith("stand-in raylet")


# ----------------------------------------------------------------------------- a PBT segment
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
