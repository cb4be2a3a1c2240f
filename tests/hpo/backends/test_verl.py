"""The verl backend (hpo.backends.verl): hydra override syntax, the trial's argv and environment, metric names, resume
from checkpoints after a kill, and the pre-flight check of a space with verl's own config code.

Two kinds of verl here:
* real verl 0.9.1 in ``.venv-verl`` (``make install-verl``) composes and validates configs (CPU only: verl 0.9.1
  cannot train without a GPU); those tests are skipped without it;
* ``tests/hpo/fake_verl_main_ppo.py``, a STAND-IN for ``python -m verl.trainer.main_ppo`` that behaves like it
  toward the driver (argv, env, ``"wb"`` file logger, checkpoints, ``resume_mode=auto``), installed for these
  tests as a package ``verl.trainer.main_ppo`` on ``PYTHONPATH`` so that the exact argv of :func:`verl_argv` runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpo.backends import verl as _verl
from hpo.backends.verl import (
    DRIVER_KEYS,
    ComposedConfig,
    VerlBackend,
    VerlConfigError,
    check_space,
    check_verl_metrics,
    check_verl_space,
    compose_corners,
    format_override,
    replay_records,
    resume_checkpoints,
    scratch_dir,
    verl_argv,
    verl_cleanup,
    verl_env,
    verl_metric_ok,
    verl_metrics_path,
)
from hpo.backends.verl._cpu import host_cpus, storage_units
from hpo.execution import MetricsTail, TrialProcess, TrialRun
from hpo.experiment._objective import parse_objective
from hpo.experiment._space import Space, SpaceError, TrialSpec, parse_space, read_yaml
from tests.hpo.conftest import PY, ROOT, cli_env

VERL_PY = ROOT / ".venv-verl" / "bin" / "python"
needs_verl = pytest.mark.skipif(not VERL_PY.exists(),
                                reason="real verl is not installed: run `make install-verl` (creates .venv-verl)")
pytestmark = pytest.mark.cpu_heavy  # verl on every core: make test-slow runs these one at a time
STAND_IN = Path(__file__).parents[1] / "fake_verl_main_ppo.py"
SPACE_FILE = ROOT / "search_spaces" / "verl_grpo_gsm8k.yaml"
VAL = "val-core/openai/gsm8k/acc/mean@1"  # verl 0.9.1: `acc` is the core variable


def load_verl_space(path: Path = SPACE_FILE, **changes: Any) -> Space:
    """The shipped verl space as a Space; the fields the driver adds for verl (trial.backend, trial.python) are
    dropped while TrialSpec does not know them yet. ``changes``: raw sections replaced."""
    raw = read_yaml(path)
    raw.update(changes)
    known = {f.name for f in dataclasses.fields(TrialSpec)}
    raw["trial"] = {k: v for k, v in (raw.get("trial") or {}).items() if k in known}
    return parse_space(raw, str(path), path.stem)


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


# ----------------------------------------------------------------------------- metric names
@pytest.mark.parametrize(("metric", "val_n", "sources", "ok"), [
    (VAL, None, None, True),
    (VAL, 1, ("openai/gsm8k",), True),
    ("val-core/openai/gsm8k/reward/mean@1", None, None, True),  # a reward function's dict without acc
    ("val-aux/openai/gsm8k/reward/mean@1", None, None, True),  # with acc: reward is aux
    ("val-aux/openai/gsm8k/acc/std@4", 4, None, True),
    ("val-core/openai/gsm8k/reward/mean@4", 1, None, False),  # verl logs mean@<val_kwargs.n>
    ("val-core/openai/gsm8k/reward/mean@4", 4, None, True),
    ("val-aux/openai/gsm8k/reward/std@4", 4, None, True),
    ("val-aux/openai/gsm8k/reward/std@1", 1, None, False),  # no spread of one sample
    ("val-core/openai/gsm8k/reward/std@4", 4, None, False),  # std is aux, not core
    ("val-core/openai/gsm8k/reward/best@4/mean", 4, None, True),
    ("val-aux/openai/gsm8k/reward/worst@2/std", 4, None, True),
    ("val-core/openai/gsm8k/reward/best@8/mean", 4, None, False),
    ("val-core/lighteval/MATH/reward/mean@1", 1, ("openai/gsm8k",), False),  # not a source of the data
    ("val-aux/num_turns/mean", 1, None, True),
    ("critic/score/mean", 1, None, True),
    ("actor/entropy", 1, None, True),
    ("timing_s/gen", 1, None, True),
    ("eval/reward_mean", 1, None, False),  # verl_core's name: verl never logs it
    ("eval/reward_std", None, None, False),
    ("val-core/openai/gsm8k/reward/mean1", None, None, False),
    ("val/test_score/openai/gsm8k", None, None, False),  # verl's pre-0.3 name
    ("critic/", None, None, False),
])
def test_verl_metric_ok(metric: str, val_n: int | None, sources: tuple[str, ...] | None, ok: bool) -> None:
    assert verl_metric_ok(metric, val_n, sources) is ok


def composed(val_n: int = 1, sources: tuple[str, ...] | None = ("openai/gsm8k",), **more: Any) -> ComposedConfig:
    return ComposedConfig(**{**dict(val_n=val_n, data_sources=sources, total_training_steps=10, test_freq=2,
                                    save_freq=2, val_before_train=True, n_gpus=1, use_critic=False,
                                    use_reference_policy=True, adv_estimator="grpo", train_files=(), val_files=()),
                             **more})


def test_the_core_metric_follows_the_reward_function() -> None:
    """verl 0.9.1 records a float score as `acc` too and makes `acc` the core variable; only a reward function
    returning a dict without `acc` leaves `reward` in val-core."""
    reward = "val-core/openai/gsm8k/reward/mean@1"
    assert verl_metric_ok(VAL, 1, None, "acc") and not verl_metric_ok(reward, 1, None, "acc")
    assert verl_metric_ok(reward, 1, None, "reward") and not verl_metric_ok(VAL, 1, None, "reward")
    assert not verl_metric_ok("val-aux/openai/gsm8k/acc/mean@1", 1, None, "acc")  # the core mean is val-core
    assert verl_metric_ok("val-aux/openai/gsm8k/reward/mean@1", 1, None, "acc")
    old = dataclasses.replace(load_verl_space(), objective=parse_objective({"metric": reward},
                                                                           lambda w, m: SpaceError(m)))
    with pytest.raises(VerlConfigError, match="acc/mean@1"):  # what the shipped space used to name
        check_verl_metrics(old, composed())
    check_verl_metrics(old, composed(val_core_var="reward"))
    check_verl_metrics(old, composed(val_core_var=None))  # a custom function not probed: either name
    assert _verl.verl_metric_examples(1, ("ds",), "reward")[0] == "val-core/ds/reward/mean@1"
    assert _verl.verl_metric_examples(1, ("ds",), "acc")[0] == "val-core/ds/acc/mean@1"


# ----------------------------------------------------------------------------- checkpoints and the retry chain
def fake_checkpoint(root: Path, step: int, actor: bool = True, data: bool = True, world: int = 1,
                    critic: bool = False, tracker: bool = True) -> Path:
    """A verl 0.9.1 FSDP checkpoint laid out as FSDPCheckpointManager and _save_checkpoint write it."""
    folder = root / f"global_step_{step}"
    for role, wanted in (("actor", actor), ("critic", critic)):
        if wanted:
            (folder / role / "huggingface").mkdir(parents=True, exist_ok=True)
            for r in range(world):
                for kind in ("model", "optim", "extra_state"):
                    (folder / role / f"{kind}_world_size_{world}_rank_{r}.pt").write_bytes(b"x")
    folder.mkdir(parents=True, exist_ok=True)
    if data:
        (folder / "data.pt").write_bytes(b"x")
    if tracker:
        (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    return folder


def test_checkpoint_step_checks_every_piece_verl_loads(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    fake_checkpoint(root, 3)
    assert _verl.checkpoint_step(root) == 3
    fake_checkpoint(root, 6, data=False, tracker=False)  # killed mid-save: actor/ written, no data.pt
    assert _verl.checkpoint_step(root) == 3
    (root / "global_step_6" / "data.pt").write_bytes(b"x")  # killed right before the tracker: complete
    assert _verl.checkpoint_step(root) == 6
    half = tmp_path / "half"  # max_actor_ckpt_to_keep=1: the tracker's step lost its actor/ to the next save
    fake_checkpoint(half, 3)
    fake_checkpoint(half, 6, data=False, tracker=False)
    import shutil

    shutil.rmtree(half / "global_step_3" / "actor")
    assert (half / "latest_checkpointed_iteration.txt").read_text() == "3"
    assert _verl.checkpoint_step(half) is None
    two = tmp_path / "two"  # a rank's shard missing
    fake_checkpoint(two, 2, world=2)
    assert _verl.checkpoint_step(two) == 2
    (two / "global_step_2" / "actor" / "optim_world_size_2_rank_1.pt").unlink()
    assert _verl.checkpoint_step(two) is None
    critic = tmp_path / "critic"  # a run with a critic needs critic/ too
    fake_checkpoint(critic, 4, critic=True)
    fake_checkpoint(critic, 8)
    assert _verl.checkpoint_step(critic) == 4
    assert _verl.checkpoint_step(tmp_path / "none") is None


def test_resume_point_is_the_newest_complete_checkpoint_of_the_whole_chain(tmp_path: Path) -> None:
    trials = tmp_path / "trials"

    def attempt(number: int, resumed_from: Path | None) -> None:
        (trials / str(number)).mkdir(parents=True, exist_ok=True)
        argv = ["py", "-m", "verl.trainer.main_ppo"] + (
            [f"trainer.resume_from_path={resumed_from}"] if resumed_from else ["trainer.resume_mode=auto"])
        (trials / str(number) / "command.json").write_text(json.dumps({"argv": argv}))

    attempt(4, None)  # attempt 0: saved step 6
    fake_checkpoint(trials / "4" / "checkpoints", 6)
    attempt(9, trials / "4" / "checkpoints" / "global_step_6")  # attempt 1: resumed from 6, saved 9
    fake_checkpoint(trials / "9" / "checkpoints", 9)
    attempt(12, None)  # attempt 2: no checkpoint found then (say), saved nothing
    point = _verl.resume_point(trials, (4, 9, 12))
    assert point is not None and point.checkpoint == trials / "9" / "checkpoints" / "global_step_9"
    assert point.step == 9 and point.starts == (None, 6)
    assert point.lineage == (trials / "4" / "metrics.jsonl", trials / "9" / "metrics.attempt1.jsonl")
    assert resume_checkpoints(trials, (4, 9, 12)) == point.checkpoint
    assert resume_checkpoints(trials, (4,)) == trials / "4" / "checkpoints" / "global_step_6"
    # attempt 2 restarted from scratch and saved step 3: older than 9, not used
    fake_checkpoint(trials / "12" / "checkpoints", 3)
    assert resume_checkpoints(trials, (4, 9, 12)) == point.checkpoint
    assert resume_checkpoints(trials, ()) is None and resume_checkpoints(trials, (77,)) is None


def test_replay_follows_the_lineage_of_the_checkpoint(tmp_path: Path) -> None:
    def log(path: Path, steps_: range, scale: int) -> Path:
        path.write_text("".join(json.dumps({"step": s, "data": {"x": scale * s}}) + "\n" for s in steps_))
        return path

    a = log(tmp_path / "a.jsonl", range(0, 8), 1)  # resumed from nothing, killed at 7
    b = log(tmp_path / "b.jsonl", range(6, 12), 10)  # resumed from a's step 6, killed at 11
    assert replay_records([a, b], upto_step=9, starts=[None, 6]) == [
        *[(s, {"x": s}) for s in range(6)], *[(s, {"x": 10 * s}) for s in range(6, 10)]]
    # at the resume step both attempts' records are merged, the later one winning
    c = tmp_path / "c.jsonl"
    c.write_text(json.dumps({"step": 6, "data": {"val": 1}}) + "\n")
    assert replay_records([a, c], upto_step=6, starts=[None, 6])[-1] == (6, {"x": 6, "val": 1})
    # a fresh start in the lineage drops everything before it
    assert replay_records([a, log(tmp_path / "d.jsonl", range(0, 3), 5)], upto_step=9, starts=[None, None]) == [
        (0, {"x": 0}), (1, {"x": 5}), (2, {"x": 10})]
    # without starts: from each file's first step
    assert [d["x"] for _, d in replay_records([a, b], upto_step=7)] == [0, 1, 2, 3, 4, 5, 60, 70]
    assert replay_records([a, tmp_path / "missing.jsonl"], upto_step=1) == [(0, {"x": 0}), (1, {"x": 1})]


# ----------------------------------------------------------------------------- can the interpreter run trials?
GPU_PY = {"torch": "2.11.0", "torch_cuda": "13.0", "vllm": True, "sglang": False, "flash_attn": False}


@pytest.mark.parametrize(("interpreter", "info", "text"), [
    ({**GPU_PY, "torch": "2.13.0+cpu", "torch_cuda": None}, {}, "without CUDA"),  # `make install-verl`'s venv
    ({**GPU_PY, "vllm": False}, {}, "actor_rollout_ref.rollout.name=vllm but"),
    (GPU_PY, {"attn_implementation": "flash_attention_2"}, "attn_implementation=sdpa"),
    (GPU_PY, {"attn_implementation": "sdpa", "use_critic": True, "adv_estimator": "gae"}, "trains a critic"),
    (GPU_PY, {"attn_implementation": "sdpa"}, None),
    ({**GPU_PY, "flash_attn": True}, {"use_critic": True}, None),
    ({**GPU_PY, "vllm": False}, {"rollout_name": "hf", "attn_implementation": "sdpa"}, None),
])
def test_an_interpreter_that_cannot_run_the_trials_is_one_line_naming_the_fix(
        interpreter: dict[str, Any], info: dict[str, Any], text: str | None) -> None:
    problem = _verl.interpreter_problem(interpreter, composed(**info), "/venv/bin/python")
    if text is None:
        assert problem is None
        return
    assert problem is not None and text in problem and "\n" not in problem
    if not interpreter["torch_cuda"] or not interpreter["vllm"]:
        assert "make install-verl-gpu" in problem


def test_default_python_prefers_the_gpu_venv(tmp_path: Path) -> None:
    for venv in (".venv-verl", ".venv-gpu-verl"):
        (tmp_path / venv / "bin").mkdir(parents=True)
        (tmp_path / venv / "bin" / "python").write_text("")
        assert _verl.default_python(tmp_path) == str(tmp_path / venv / "bin" / "python")


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


def test_no_verl_in_the_interpreter_says_make_install_verl(tmp_path: Path) -> None:
    for python in (PY, str(tmp_path / "no-such-python")):  # the driver's venv has no verl
        with pytest.raises(VerlConfigError, match="make install-verl") as err:
            check_space(python, "ppo_trainer", [[]])
        assert err.value.where == "trial.python" and "\n" not in str(err.value)
    with pytest.raises(VerlConfigError, match="no such file"):
        check_space(PY, str(tmp_path / "missing.yaml"), [[]])


def small_verl_space(**changes: Any) -> Space:
    """The shipped space with one parameter at two values (two corners: quick to compose)."""
    raw = read_yaml(SPACE_FILE)
    changes.setdefault("overrides", {**raw["overrides"], "actor_rollout_ref.actor.ppo_mini_batch_size": 16})
    return load_verl_space(params={"actor_lr": raw["params"]["actor_lr"]}, **changes)


@needs_verl
@pytest.mark.slow  # three compositions in verl's interpreter: ~20 s; make test-slow / CI
def test_verl_s_cpu_interpreter_runs_cpu_trials_and_is_refused_for_gpu_trials() -> None:
    """`make install-verl`'s venv (CPU torch, vLLM's CPU build, the CPU platform plugin) runs trials that get no GPU;
    trials handed GPUs need a CUDA build (one line naming both ways out); a space whose trials run the stand-in
    (trial.env sets VERL_HPO_SKIP_INTERPRETER_CHECK) launches either way."""
    space = small_verl_space()
    with pytest.raises(VerlConfigError) as err:
        _verl.check_verl_launch(space, str(VERL_PY), cpu=False)
    assert err.value.where == "trial.python" and "\n" not in str(err.value)
    assert "without CUDA" in str(err.value) and "make install-verl-gpu" in str(err.value)
    assert "gpus_per_trial: 0" in str(err.value)
    _verl.check_verl_launch(space, str(VERL_PY), cpu=True)  # every corner composes with the CPU platform's overrides
    stand_in = dataclasses.replace(space, trial=dataclasses.replace(
        space.trial, env={_verl.SKIP_INTERPRETER_CHECK: "1"}))
    _verl.check_verl_launch(stand_in, str(VERL_PY), cpu=False)


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


# ----------------------------------------------------------------------------- the data
def test_gsm8k_format_data_is_written_only_where_the_shipped_space_keeps_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow.parquet as pq

    from hpo.backends.verl._data import main

    env_dir = tmp_path / "home"
    monkeypatch.setenv("HOME", str(env_dir))
    monkeypatch.setenv("VERL_HPO_TEST_DATA", str(env_dir / "elsewhere"))
    # a mistyped path to real data is an error, never replaced by synthetic problems; so is each item of a list
    assert main(["data.train_files=${oc.env:VERL_HPO_TEST_DATA}/train.parquet"]) == 2
    assert "train.parquet does not exist" in capsys.readouterr().err
    assert main(["data.train_files=[~/.cache/verl_hpo/gsm8k_small/train.parquet,'~/mine/b.parquet']"]) == 2
    assert "mine/b.parquet does not exist" in capsys.readouterr().err
    assert main(["data.train_files=${oc.env:NO_SUCH_VARIABLE_HPO}/x.parquet"]) == 2
    assert not (env_dir / "elsewhere").exists() and not (env_dir / ".cache").exists()
    shipped = read_yaml(SPACE_FILE)["overrides"]
    assert main(["--config", "ppo_trainer", f"data.train_files={shipped['data.train_files']}",
                 f"data.val_files={shipped['data.val_files']}", "data.train_batch_size=8"]) == 0
    d = env_dir / ".cache" / "verl_hpo" / "gsm8k_small"
    # files that exist are the user's: kept as they are (a list of them too)
    assert main([f"data.train_files=[{d / 'train.parquet'},{d / 'test.parquet'}]"]) == 0
    rows = pq.read_table(d / "train.parquet").to_pylist()
    val = pq.read_table(d / "test.parquet").to_pylist()
    assert (len(rows), len(val)) == (512, 128)
    row = rows[0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
    assert row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"].endswith('after "####".')
    assert row["reward_model"]["style"] == "rule"
    assert row["extra_info"]["answer"].endswith("#### " + row["reward_model"]["ground_truth"])
    assert {r["extra_info"]["question"] for r in rows}.isdisjoint({r["extra_info"]["question"] for r in val})


@needs_verl
def test_verls_gsm8k_reward_scores_the_worked_answers(tmp_path: Path) -> None:
    from hpo.backends.verl._data import write_parquet

    path = write_parquet(tmp_path / "test.parquet", "test", n=20)
    code = textwrap.dedent("""
        import sys, pyarrow.parquet as pq
        from verl.utils.reward_score import default_compute_score
        rows = pq.read_table(sys.argv[1]).to_pylist()
        truth = [r["reward_model"]["ground_truth"] for r in rows]
        print([default_compute_score(r["data_source"], r["extra_info"]["answer"], t) for r, t in zip(rows, truth)]
              + [default_compute_score("openai/gsm8k", "#### 999999", truth[0])])
    """)
    res = subprocess.run([str(VERL_PY), "-c", code, str(path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == str([1.0] * 20 + [0.0])


# ----------------------------------------------------------------------------- the stand-in main_ppo
# A sys.meta_path finder (in a sitecustomize on PYTHONPATH) maps `verl.trainer.main_ppo` to the stand-in, while
# the rest of `verl` stays the real 0.9.1 package: the stand-in logs, checkpoints and names metrics with it.
_SITECUSTOMIZE = """
import importlib.util, sys


class _StandInMainPpo:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "verl.trainer.main_ppo":
            return importlib.util.spec_from_file_location(name, {stand_in!r})
        return None


sys.meta_path.insert(0, _StandInMainPpo)
"""


@pytest.fixture
def fake_verl(tmp_path: Path) -> dict[str, str]:
    """The environment in which ``python -m verl.trainer.main_ppo`` runs the stand-in (in verl's interpreter)."""
    if not VERL_PY.exists():
        pytest.skip("the stand-in runs with real verl's code: run `make install-verl` (creates .venv-verl)")
    site = tmp_path / "fake-verl"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(stand_in=str(STAND_IN)))
    return {**os.environ, "PYTHONPATH": str(site)}


BASE = {"trainer.total_training_steps": 10, "trainer.test_freq": 2, "trainer.save_freq": 3, "+fake.step_s": 0.02,
        "algorithm.adv_estimator": "grpo"}


def launch(fake_env: dict[str, str], trials: Path, number: int, extra: list[str], history: tuple[int, ...] = (),
           fixed: dict[str, Any] | None = None) -> tuple[list[str], dict[str, str], Path]:
    """What the driver does for trial ``number`` (a retry of ``history``): argv, env, its metrics file."""
    trial_dir = trials / str(number)
    trial_dir.mkdir(parents=True, exist_ok=True)
    overrides = _verl.verl_overrides({**BASE, **(fixed or {})}, {"+fake.x": 0.5})
    argv = verl_argv(str(VERL_PY), "ppo_trainer", [*overrides, *extra], "study", number, trial_dir, n_gpus=1,
                     resume_from=resume_checkpoints(trials, history))
    env = verl_env(fake_env, trial_dir, attempt=len(history))
    (trial_dir / "command.json").write_text(json.dumps({"argv": argv}))  # as the driver writes it
    return argv, env, verl_metrics_path(trial_dir, len(history))


def steps(path: Path) -> list[int]:
    return [s for s, _ in MetricsTail(path).read()]


def run_until(argv: list[str], env: dict[str, str], tracker: Path, step: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not (tracker.is_file() and tracker.read_text() == step) and time.monotonic() < deadline:
        assert proc.poll() is None, "the stand-in exited before the checkpoint"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the host dies: no clean exit, no last checkpoint
    assert proc.wait(timeout=30) == -signal.SIGKILL
    return proc


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


@pytest.mark.slow  # a real verl (or stand-in) process: ~20-60 s; make test-slow / CI
def test_kill_then_retry_resumes_from_the_last_checkpoint(fake_verl: dict[str, str], tmp_path: Path) -> None:
    """Three attempts: the first is killed after its checkpoint at step 6, the second resumes from it, saves
    step 9 in its own directory and is killed; the third continues from step 9 (the newest checkpoint of the
    chain, not the first attempt's), and the replayed curve equals an uninterrupted run's."""
    trials = tmp_path / "trials"
    longer = {"trainer.total_training_steps": 12}
    argv, env, first = launch(fake_verl, trials, 0, ["++fake.step_s=0.3"], fixed=longer)
    run_until(argv, env, trials / "0" / "checkpoints" / "latest_checkpointed_iteration.txt", "6")
    killed_at = steps(first)
    assert killed_at[0] == 0 and 5 <= killed_at[-1] < 9 and killed_at == list(range(killed_at[-1] + 1))

    assert resume_checkpoints(trials, (0,)) == trials / "0" / "checkpoints" / "global_step_6"
    argv, env, second = launch(fake_verl, trials, 1, ["++fake.step_s=0.3"], history=(0,), fixed=longer)
    assert "trainer.resume_mode=resume_path" in argv
    assert f"trainer.default_local_dir={trials / '1' / 'checkpoints'}" in argv  # each attempt saves its own
    run_until(argv, env, trials / "1" / "checkpoints" / "latest_checkpointed_iteration.txt", "9")
    assert steps(second)[0] == 6 and steps(first) == killed_at  # "wb" went to a file of its own

    point = _verl.resume_point(trials, (0, 1))
    assert point is not None and point.checkpoint == trials / "1" / "checkpoints" / "global_step_9"
    assert point.lineage == (first, second) and point.starts == (None, 6)
    argv, env, third = launch(fake_verl, trials, 2, [], history=(0, 1), fixed=longer)
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Resuming from" in res.stdout and steps(third) == list(range(9, 13))

    curve = {s: d[VAL] for s, d in [*point.records(), *MetricsTail(third).read()] if VAL in d}
    argv, env, whole = launch(fake_verl, tmp_path / "uninterrupted", 0, [], fixed=longer)
    assert subprocess.run(argv, env=env, capture_output=True, timeout=300).returncode == 0
    # as if never interrupted, plus the resumed run's validation of its checkpoint at step 9 (val_before_train)
    assert curve == {**{s: d[VAL] for s, d in MetricsTail(whole).read() if VAL in d}, 9: pytest.approx(0.72)}


@pytest.mark.slow  # a real verl (or stand-in) process: ~20-60 s; make test-slow / CI
def test_a_half_deleted_checkpoint_is_not_resumed(fake_verl: dict[str, str], tmp_path: Path) -> None:
    """verl removes the previous step's actor/ (max_actor_ckpt_to_keep=1) before it rewrites the tracker: killed
    in between, the tracker names a step whose actor/ is gone. Resuming it would crash as verl's loader does;
    the retry starts afresh instead."""
    trials = tmp_path / "trials"
    argv, env, _ = launch(fake_verl, trials, 0, ["+fake.kill_after_actor_save=6"],
                          fixed={"trainer.max_actor_ckpt_to_keep": 1})
    assert subprocess.run(argv, env=env, capture_output=True, timeout=300).returncode == -signal.SIGKILL
    ckpt = trials / "0" / "checkpoints"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "3"
    assert not (ckpt / "global_step_3" / "actor").exists() and (ckpt / "global_step_6" / "actor").is_dir()
    assert _verl.checkpoint_step(ckpt) is None and resume_checkpoints(trials, (0,)) is None
    # what resuming the tracker's step would do: verl's own loader fails on the missing shard
    crash, env2, _ = launch(fake_verl, trials, 1, [])
    crash = [a for a in crash if not a.startswith("trainer.resume_mode=")] + [
        "trainer.resume_mode=resume_path", f"trainer.resume_from_path={ckpt / 'global_step_3'}"]
    res = subprocess.run(crash, env=env2, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1 and "FileNotFoundError" in res.stderr
    argv, env, metrics = launch(fake_verl, trials, 2, [], history=(0,))
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert steps(metrics) == list(range(11))


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


# through the driver: real verl on the CPU, tests/hpo/backends/test_verl_real.py


def test_a_missing_held_out_file_is_one_line_before_any_confirmation_run(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """verl's confirmation runs validate on ``study.confirm.test_files``: a missing one is said once, naming the key
    and the resolved path, instead of crashing every run in verl's dataset loader."""
    from hpo.backends import backend_of, load_space

    monkeypatch.setenv("HELDOUT_DIR", str(tmp_path))
    shipped = ROOT / "search_spaces" / "verl_grpo_cpu.yaml"
    space = load_space(str(shipped), overrides=["study.confirm.test_files=${oc.env:HELDOUT_DIR}/test.parquet"],
                       check=False)
    with pytest.raises(SpaceError) as err:
        backend_of(space).confirmation.check_heldout(space)
    assert str(err.value).endswith(f"study.confirm.test_files: {tmp_path / 'test.parquet'} does not exist (the "
                                   "held-out data confirmation runs validate on)")
    (tmp_path / "test.parquet").write_bytes(b"PAR1")
    backend_of(space).confirmation.check_heldout(space)  # present: nothing to say
    remote = load_space(str(shipped), overrides=["study.confirm.test_files=hdfs://data/test.parquet"], check=False)
    backend_of(remote).confirmation.check_heldout(remote)  # verl copies remote files itself
