"""The trainer for real: it learns, is deterministic, resumes exactly, and its extras work."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import REPO, eval_curve, read_metrics, run_trainer

FAST = ["trainer.cpu_threads=1", "trainer.val_before_train=false", "trainer.test_freq=-1",
        "data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.ppo_epochs=1"]
VERL_METRICS = ["critic/score/mean", "critic/rewards/mean", "critic/advantages/mean", "critic/values/mean",
                "critic/vf_loss", "critic/vf_clipfrac", "actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl",
                "actor/entropy", "actor/grad_norm", "actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff",
                "response_length/mean", "perf/throughput", "perf/cpu_memory_used_gb"]
STAGES = ["gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "step"]


def _non_timing(row: dict) -> dict:
    """Everything but wall-clock measurements (stage timings, throughput, memory, latency)."""
    return {k: v for k, v in row["data"].items()
            if not k.startswith(("timing_s/", "perf/", "eval/latency_"))}


def test_default_run_learns(tiny_model_dir: Path, tmp_path: Path) -> None:
    """tiny_arith: the greedy eval reward starts low (the warm start answers a+b+1) and PPO raises it by >= 0.5
    in 20 steps (measured: 0.02 -> ~0.95)."""
    out = run_trainer(["train", "--config", "tiny_arith", "--metrics-file", "m.jsonl",
                       "trainer.total_training_steps=20", "trainer.cpu_threads=1"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = read_metrics(tmp_path / "m.jsonl")
    curve = eval_curve(rows)
    assert sorted(curve) == [0, 10, 20]
    assert curve[0] <= 0.3, curve
    assert curve[20] - curve[0] >= 0.5, curve
    step = rows[1]["data"]
    for key in VERL_METRICS + [f"timing_s/{s}" for s in STAGES]:
        assert key in step, key
    assert "eval/reward_std" in rows[0]["data"]
    assert "step:1 - " in out.stdout  # verl's console format


@pytest.mark.slow  # ~30-100 s on 2 busy cores: make test-slow (CI runs it)
def test_same_seed_same_metrics(tiny_model_dir: Path, tmp_path: Path) -> None:
    runs = []
    for name in ("a", "b"):
        out = run_trainer(["train", "--metrics-file", f"{name}.jsonl", "trainer.total_training_steps=3",
                           "trainer.test_freq=3", *FAST], tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        runs.append([_non_timing(r) for r in read_metrics(tmp_path / f"{name}.jsonl")])
    assert runs[0] == runs[1]
    other = run_trainer(["train", "--metrics-file", "c.jsonl", "trainer.total_training_steps=3",
                         "trainer.test_freq=3", "trainer.seed=2", *FAST], tmp_path)
    assert other.returncode == 0, other.stderr[-2000:]
    assert [_non_timing(r) for r in read_metrics(tmp_path / "c.jsonl")] != runs[0]


# The tiny_arith rule, gated: once the file named by $GATE exists, the next score blocks forever (after touching
# "$GATE.reached"), so the test kills the trainer at a known point whatever the machine's speed.
GATED_REWARD = """
import os, pathlib, time
from verl_core.rewards import arith_score

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    gate = os.environ.get("GATE")
    if gate and pathlib.Path(gate).is_file():
        pathlib.Path(gate + ".reached").touch()
        while True:
            time.sleep(1)
    return arith_score(data_source, solution_str, ground_truth, extra_info)
"""


@pytest.mark.slow  # ~30-100 s on 2 busy cores: make test-slow (CI runs it)
def test_resume_after_kill_matches_uninterrupted_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "gated.py").write_text(GATED_REWARD)
    args = ["trainer.total_training_steps=6", "trainer.save_freq=2", "trainer.test_freq=3", *FAST,
            "custom_reward_function.path=gated.py"]
    ref = run_trainer(["train", "--metrics-file", "ref.jsonl", "trainer.default_local_dir=ck_ref", *args], tmp_path)
    assert ref.returncode == 0, ref.stderr[-2000:]
    expected = [_non_timing(r) for r in read_metrics(tmp_path / "ref.jsonl")]

    cmd = [sys.executable, "-m", "verl_core", "train", "--metrics-file", "int.jsonl",
           "trainer.default_local_dir=ck_int", *args]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # the gate opens with step 4's checkpoint: step 5's rollout is scored, blocks, and is killed there
    checkpoint = tmp_path / "ck_int" / "global_step_4" / "state.pt"
    proc = subprocess.Popen(cmd, cwd=tmp_path, env={**env, "GATE": str(checkpoint)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    reached = Path(f"{checkpoint}.reached")
    deadline = time.time() + 300
    while time.time() < deadline and not reached.is_file() and proc.poll() is None:
        time.sleep(0.05)
    assert reached.is_file(), f"the trainer never scored a rollout after step 4's checkpoint (rc {proc.poll()})"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert [r["step"] for r in read_metrics(tmp_path / "int.jsonl")] == [1, 2, 3, 4]
    resumed = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout and "global_step_4" in resumed.stdout
    metrics = tmp_path / "int.jsonl"
    got = [_non_timing(r) for r in read_metrics(metrics)]
    assert [r["step"] for r in read_metrics(metrics)] == [1, 2, 3, 4, 5, 6]
    assert got == expected
    assert (tmp_path / "ck_int" / "global_step_6" / "actor" / "huggingface" / "config.json").is_file()


@pytest.mark.slow  # ~30-100 s on 2 busy cores: make test-slow (CI runs it)
def test_a_promoted_run_continued_from_its_step_n_checkpoint_ends_as_an_uninterrupted_run(tiny_model_dir: Path,
                                                                                         tmp_path: Path) -> None:
    """A proxy search's continuation (hpo/study/_continuation.py): the promoted run trains on the confirmation seed
    with trainer.save_freq=N and no held-out split, and the driver stops it after step N's metrics line; the
    confirmation run continues its global_step_N (resume_mode=resume_path, this config's hyperparameters: the same
    ones) with the held-out split. Its steps after N log what an uninterrupted confirmation run on that seed logs,
    the held-out test included, and the stopped run's steps up to N are that run's own (saving changes nothing).
    Under the adaptive KL controller, whose coefficient moves every step: the continuation goes on from the
    checkpoint's coefficient, not the config's starting one."""
    seed, n = "trainer.seed=1000", 2
    common = ["trainer.total_training_steps=4", "trainer.test_freq=2", *FAST, seed, "algorithm.kl_ctrl.type=adaptive",
              "algorithm.kl_ctrl.target_kl=0.001", "algorithm.kl_ctrl.horizon=64"]
    held = "data.test_files=builtin:arith"
    ref = run_trainer(["train", "--metrics-file", "ref.jsonl", "trainer.default_local_dir=ck_ref", held, *common],
                      tmp_path)
    assert ref.returncode == 0, ref.stderr[-2000:]
    expected = {r["step"]: _non_timing(r) for r in read_metrics(tmp_path / "ref.jsonl")}

    # the promoted run: stopped (SIGKILL) once step N's line is written, as the driver stops it
    cmd = [sys.executable, "-m", "verl_core", "train", "--metrics-file", "promoted.jsonl",
           "trainer.default_local_dir=ck_promoted", f"trainer.save_freq={n}", *common]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics, deadline = tmp_path / "promoted.jsonl", time.time() + 300
    while time.time() < deadline and proc.poll() is None and not (
            metrics.is_file() and any(r["step"] == n for r in read_metrics(metrics))):
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    promoted = {r["step"]: _non_timing(r) for r in read_metrics(metrics)}
    assert all(promoted[s] == expected[s] for s in range(1, n + 1))  # the save and no held-out split change nothing
    checkpoint = tmp_path / "ck_promoted" / f"global_step_{n}"
    assert (checkpoint / "state.pt").is_file()  # whole before the line that stopped it

    out = run_trainer(["train", "--metrics-file", "continued.jsonl", "trainer.default_local_dir=ck_continued", held,
                       "trainer.resume_mode=resume_path", f"trainer.resume_from_path={checkpoint}", *common], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    continued = {r["step"]: _non_timing(r) for r in read_metrics(tmp_path / "continued.jsonl")}
    assert sorted(continued) == [3, 4]
    for step, row in continued.items():
        assert row.keys() == expected[step].keys()
        assert row == pytest.approx(expected[step], rel=1e-6, abs=1e-9), step
    assert "test/reward_mean" in continued[4]
    coefs = [expected[s]["actor/reward_kl_penalty_coeff"] for s in (1, 3, 4)]
    assert len(set(coefs)) == 3  # the adaptive controller moved: the continuation matched a moving coefficient


def test_grpo_with_kl_loss_and_filter(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = run_trainer(["train", "--metrics-file", "m.jsonl", "trainer.total_training_steps=3", *FAST,
                       "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4",
                       "algorithm.use_kl_in_reward=false", "actor_rollout_ref.actor.use_kl_loss=true",
                       "actor_rollout_ref.actor.kl_threshold=1e-6"],
                      tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = read_metrics(tmp_path / "m.jsonl")
    assert all("critic/values/mean" not in r["data"] for r in rows)  # no critic in GRPO
    assert all("actor/kl_loss" in r["data"] for r in rows)
    # step 1: actor == reference, nothing filtered; afterwards the tiny threshold filters tokens out
    assert rows[0]["data"]["actor/kl_filtered_frac"] == 0.0
    assert rows[-1]["data"]["actor/kl_filtered_frac"] > 0.0
    assert rows[-1]["data"]["actor/kl_loss"] > 0.0  # the filtered tokens keep their KL loss


def test_the_test_split_is_evaluated_once_at_the_last_step(tiny_model_dir: Path, tmp_path: Path) -> None:
    """data.test_files: the held-out split is validated once, at the last step, as test/* beside eval/*; the
    validation metrics are the run's own."""
    out = run_trainer(["train", "--metrics-file", "m.jsonl", *FAST, "trainer.total_training_steps=2",
                       "trainer.test_freq=1", "data.test_files=builtin:arith"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = read_metrics(tmp_path / "m.jsonl")
    assert sorted(eval_curve(rows)) == [1, 2] and sorted(eval_curve(rows, "test/reward_mean")) == [2]
    last = rows[-1]["data"]
    assert last["test-core/synthetic/arith/reward/mean@1"] == last["test/reward_mean"]
    assert 0.0 <= last["test/reward_mean"] <= 1.0 and "timing_s/testing_heldout" in last


def test_dynamic_gamma(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = run_trainer(["train", "--metrics-file", "m.jsonl", "trainer.total_training_steps=2", *FAST,
                       "algorithm.dynamic_gamma.enable=true", "algorithm.dynamic_gamma.var_threshold=0.001",
                       "algorithm.dynamic_gamma.min_gamma=0.5"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = read_metrics(tmp_path / "m.jsonl")
    # binary rewards near p~0.3 have variance >> 2 * 0.001, so gamma sits at its floor
    assert rows[-1]["data"]["algorithm/gamma"] == pytest.approx(0.5)
    assert rows[-1]["data"]["actor/grad_norm_nonfinite_steps"] == 0.0
    assert rows[-1]["data"]["critic/grad_norm_nonfinite_steps"] == 0.0


@pytest.mark.slow  # ~30-100 s on 2 busy cores: make test-slow (CI runs it)
def test_on_policy_grpo_skips_the_old_log_prob_pass(tiny_model_dir: Path, tmp_path: Path) -> None:
    """One epoch x one mini-batch, no KL in reward: the update's forward supplies old log-probs and entropy."""
    on_policy = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4", "algorithm.use_kl_in_reward=false",
                 "actor_rollout_ref.actor.ppo_mini_batch_size=16"]
    out = run_trainer(["train", "--metrics-file", "m.jsonl", "trainer.total_training_steps=2", *FAST, *on_policy],
                      tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = read_metrics(tmp_path / "m.jsonl")
    for r in rows:
        assert "timing_s/old_log_prob" not in r["data"]
        assert r["data"]["actor/entropy"] > 0
        assert r["data"]["actor/ppo_kl"] == 0.0 and r["data"]["actor/pg_clipfrac"] == 0.0  # ratio exactly 1
    # two mini-batches: the second is off-policy, so the pass runs again
    out = run_trainer(["train", "--metrics-file", "m2.jsonl", "trainer.total_training_steps=1", *FAST,
                       *on_policy[:-1]], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "timing_s/old_log_prob" in read_metrics(tmp_path / "m2.jsonl")[0]["data"]


def test_reuse_log_probs_takes_old_log_probs_from_the_rollout(tiny_model_dir: Path, tmp_path: Path) -> None:
    """PPO with KL in reward needs old log-probs before the update; reuse_log_probs takes them from decoding."""
    out = run_trainer(["train", "--metrics-file", "m.jsonl", "trainer.total_training_steps=2", *FAST,
                       "actor_rollout_ref.actor.ppo_mini_batch_size=16",
                       "actor_rollout_ref.rollout.reuse_log_probs=true"],
                      tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    for r in read_metrics(tmp_path / "m.jsonl"):
        assert "timing_s/old_log_prob" not in r["data"]
        assert r["data"]["actor/entropy"] > 0 and "actor/reward_kl_penalty" in r["data"]
        assert abs(r["data"]["actor/ppo_kl"]) < 1e-5  # on-policy: the reused log-probs are the actor's


def test_critic_has_no_dropout(tiny_model_dir: Path) -> None:
    """verl's critic sets classifier_dropout=0: in train mode two value passes agree exactly."""
    from verl_core.config import load_config
    from verl_core.trainer import PPOTrainer

    trainer = PPOTrainer(load_config("tiny_arith", ["trainer.total_training_steps=1"]))
    assert trainer.critic is not None
    model = trainer.critic.model.train()
    ids = torch.randint(5, 100, (4, 12))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits)


def test_a_run_that_builds_the_cached_model_trains_like_later_runs(tiny_model_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The first run on a machine builds the builtin model in-process while resolving its path (an SFT run drawing
    from the global RNG); the trainer seeds after every path is resolved, so that run's randomly initialised
    weights (the critic's value head) and rollouts are those of every later run with the same seed."""
    import verl_core.trainer as trainer_mod
    from verl_core.config import load_config

    def heads() -> list[torch.Tensor]:
        t = trainer_mod.PPOTrainer(load_config("tiny_arith", ["trainer.total_training_steps=1"]))
        assert t.critic is not None
        return [p.detach().clone() for n, p in t.critic.model.named_parameters() if "score" in n]

    cached = heads()
    real = trainer_mod.resolve_model_path

    def building(path: str, key: str) -> str:
        torch.rand(1000)  # what a build in this process draws
        return real(path, key)

    monkeypatch.setattr(trainer_mod, "resolve_model_path", building)
    built = heads()
    assert cached and all(torch.equal(a, b) for a, b in zip(cached, built))


def test_custom_reward_function_and_reward_temperature(tiny_model_dir: Path, tmp_path: Path) -> None:
    fn = tmp_path / "my_reward.py"
    fn.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                  "    return {'score': 0.5, 'acc': False}\n")
    out = run_trainer(["train", "--metrics-file", "m.jsonl", "trainer.total_training_steps=2", *FAST,
                       f"custom_reward_function.path={fn}", "reward_model.temperature=2.0",
                       "trainer.test_freq=2"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = read_metrics(tmp_path / "m.jsonl")
    assert rows[-1]["data"]["critic/score/mean"] == pytest.approx(0.25)  # scaled by 1/temperature
    assert rows[-1]["data"]["eval/reward_mean"] == pytest.approx(0.5)  # validation reports raw scores


def test_hf_reward_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rm = Qwen2ForSequenceClassification(Qwen2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=1,
        num_key_value_heads=1, head_dim=64, num_labels=1, pad_token_id=tok.pad_token_id))
    rm.save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    out = run_trainer(["train", "--metrics-file", "m.jsonl", "trainer.total_training_steps=1", *FAST,
                       "reward_model.enable=true", f"reward_model.model.path={tmp_path / 'rm'}"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    score = read_metrics(tmp_path / "m.jsonl")[0]["data"]
    assert score["critic/score/max"] != score["critic/score/min"]  # real, varying model scores
    assert score["critic/score/mean"] not in (0.0, 1.0)


@pytest.mark.parametrize("override, needle", [
    ("actor_rollout_ref.model.path=/nonexistent/model", "not a local Hugging Face model directory"),
    ("data.train_files=/nonexistent.parquet", "data.train_files='/nonexistent.parquet': no such file"),
    ("data.val_files=corrupt.parquet", "not a readable parquet file"),
])
def test_bad_paths_are_one_line_errors(tmp_path: Path, override: str, needle: str) -> None:
    (tmp_path / "corrupt.parquet").write_bytes(b"not parquet at all")
    out = run_trainer(["train", "--metrics-file", "m.jsonl", override], tmp_path)
    assert out.returncode == 2
    assert needle in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_rollout_without_vllm_is_a_one_line_install_hint(tmp_path: Path) -> None:
    out = run_trainer(["train", "--metrics-file", "m.jsonl", "actor_rollout_ref.rollout.name=vllm",
                       "trainer.total_training_steps=1"], tmp_path)
    assert out.returncode == 2
    assert "make install-vllm" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def _trainer(*overrides: str) -> Any:
    """An in-process trainer on tiny_arith, without the toxicity and latency evaluators."""
    from verl_core.config import load_config
    from verl_core.trainer import PPOTrainer

    return PPOTrainer(load_config("tiny_arith", ["evaluation.toxicity.enable=false", "evaluation.latency.enable=false",
                                                 "trainer.total_training_steps=1", *overrides]))


def _no_timing(m: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in m.items() if not k.startswith("timing_s/")}


def test_greedy_validation_at_temperature_zero_equals_generate(tiny_model_dir: Path) -> None:
    """verl's validation default (do_sample=false, temperature=0): the fast decoder's greedy answers are scored
    exactly as transformers generate(do_sample=False)'s (the decode loop divided the logits by 0 before)."""
    trainer = _trainer("actor_rollout_ref.rollout.val_kwargs.do_sample=false",
                       "actor_rollout_ref.rollout.val_kwargs.temperature=0")
    fast = trainer.validate(0)
    assert trainer.rollout.backend == "fast"
    trainer.rollout.fast_decode = False
    generate = trainer.validate(0)
    assert trainer.rollout.backend == "generate"
    assert _no_timing(fast) == _no_timing(generate)
    assert fast["eval/reward_mean"] < 0.3  # the warm-started model is mostly wrong greedily (answers a+b+1)
    assert fast["val-core/synthetic/arith/reward/mean@1"] == fast["eval/reward_mean"]
    assert not [k for k in fast if k.startswith("val-aux/")]  # one sample per prompt: no spread


def test_validation_metrics_as_verl() -> None:
    """verl's process_validation_metrics: per-prompt mean and std (ddof 0) over its n samples, averaged over
    the prompts of each data source; std only when n > 1."""
    from verl_core.validation import validation_metrics

    scores = np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
    m = validation_metrics(scores, ["a", "a", "b"])
    assert m == {"val-core/a/reward/mean@4": 0.75, "val-aux/a/reward/std@4": 0.25,
                 "val-core/b/reward/mean@4": 0.25, "val-aux/b/reward/std@4": pytest.approx(0.4330127, abs=1e-7)}
    assert validation_metrics(np.array([[1.0], [0.0]]), ["a", "a"]) == {"val-core/a/reward/mean@1": 0.5}


def test_sampled_validation_logs_the_per_prompt_spread(tiny_model_dir: Path) -> None:
    trainer = _trainer("actor_rollout_ref.rollout.val_kwargs.n=4", "data.val_max_samples=24",
                       "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
                       "actor_rollout_ref.rollout.val_kwargs.temperature=1.0")
    m = trainer.validate(0)
    mean, std = m["val-core/synthetic/arith/reward/mean@4"], m["val-aux/synthetic/arith/reward/std@4"]
    assert mean == pytest.approx(m["eval/reward_mean"], abs=1e-12)
    assert 0 < std <= m["eval/reward_std"]  # within-prompt spread <= spread over all samples


def test_checkpoint_loads_onto_any_device(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The checkpoint is read onto the CPU (RNG states must stay CPU byte tensors) whatever the trainer's device:
    a trainer claiming the 'meta' device stands in for CUDA here (loading with map_location=<device> failed)."""
    from verl_core.checkpoint import load_checkpoint, save_checkpoint

    trainer = _trainer()
    trainer.global_step = 3
    torch.manual_seed(123)
    saved_rng = torch.get_rng_state()
    weights = {k: v.clone() for k, v in trainer.actor.model.state_dict().items()}
    path = save_checkpoint(trainer, tmp_path / "ck", 3)
    torch.manual_seed(7)
    with torch.no_grad():
        for p in trainer.actor.model.parameters():
            p.add_(1.0)
    trainer.device = torch.device("meta")
    assert load_checkpoint(trainer, path) == 3
    assert torch.equal(torch.get_rng_state(), saved_rng)
    for k, v in trainer.actor.model.state_dict().items():
        assert v.device.type == "cpu" and torch.equal(v, weights[k]), k


def test_resume_from_path_with_new_hyperparameters(tiny_model_dir: Path, tmp_path: Path) -> None:
    """resume_mode=resume_path: another run's checkpoint, the step numbering continued, and this run's learning
    rates and KL coefficient used (``actor/lr``, ``critic/lr`` and the KL penalty coefficient of the next steps),
    not the restored optimizer's; the weights are the checkpoint's (its step-3 validation is reproduced)."""
    src = run_trainer(["train", "--metrics-file", "a.jsonl", "trainer.default_local_dir=ck_a",
                       "trainer.total_training_steps=2", "trainer.save_freq=2", "trainer.test_freq=2", *FAST,
                       "actor_rollout_ref.actor.optim.lr=1e-5", "algorithm.kl_ctrl.kl_coef=0.05"], tmp_path)
    assert src.returncode == 0, src.stderr[-2000:]
    ckpt = tmp_path / "ck_a" / "global_step_2"
    out = run_trainer(["train", "--metrics-file", "b.jsonl", "trainer.default_local_dir=ck_b",
                       "trainer.total_training_steps=4", "trainer.save_freq=4", "trainer.test_freq=2", *FAST,
                       "trainer.resume_mode=resume_path", f"trainer.resume_from_path={ckpt}",
                       "actor_rollout_ref.actor.optim.lr=3e-4", "critic.optim.lr=2e-3",
                       "algorithm.kl_ctrl.kl_coef=0.2"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = read_metrics(tmp_path / "b.jsonl")
    assert [r["step"] for r in rows] == [3, 4]
    for r in rows:
        assert r["data"]["actor/lr"] == pytest.approx(3e-4)
        assert r["data"]["critic/lr"] == pytest.approx(2e-3)
        assert r["data"]["actor/reward_kl_penalty_coeff"] == pytest.approx(0.2)
    first = read_metrics(tmp_path / "a.jsonl")
    assert all(r["data"]["actor/lr"] == pytest.approx(1e-5) for r in first)
    assert (tmp_path / "ck_b" / "global_step_4" / "state.pt").is_file()
    assert not (tmp_path / "ck_b" / "global_step_2").exists()


def test_resume_path_needs_a_path(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = run_trainer(["train", "--metrics-file", "m.jsonl", "trainer.resume_mode=resume_path", *FAST], tmp_path)
    assert out.returncode != 0
    assert "trainer.resume_from_path" in out.stderr
