"""The memory estimate of real verl trials (``verl_core.memory.estimate_verl``, ``hpo._preflight.predict_verl``).

The arithmetic is checked on hand-written key values (what ``hpo/_verl_compose.py`` selects from a composed config);
the last tests compose the shipped verl space with real verl 0.9.1 (``.venv-verl``; skipped without it).
"""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import pytest

from hpo import _preflight
from hpo._preflight import predict_verl, predict_verl_corners, validate_space
from hpo._space import Space
from tests.hpo.test_verl import load_verl_space, needs_verl
from verl_core.config import ConfigError
from verl_core.memory import (
    KNOWN_HUB_CONFIGS,
    VERL_MEMORY_KEYS,
    MemoryEstimate,
    ModelConfigUnavailable,
    estimate_verl,
    read_hub_or_local_config,
)

GiB = 2**30
AR = "actor_rollout_ref"
QWEN = "Qwen/Qwen2.5-0.5B-Instruct"
# the shipped space's keys as verl composes them (verl's defaults for the rest)
BASE: dict[str, Any] = {
    "trainer.n_gpus_per_node": 1, "trainer.nnodes": 1, "data.max_prompt_length": 256,
    "data.max_response_length": 256, f"{AR}.model.path": QWEN, f"{AR}.model.enable_gradient_checkpointing": True,
    f"{AR}.actor.strategy": "fsdp", f"{AR}.actor.fsdp_config.fsdp_size": -1,
    f"{AR}.actor.fsdp_config.model_dtype": "fp32", f"{AR}.actor.ppo_micro_batch_size_per_gpu": 8,
    f"{AR}.actor.use_dynamic_bsz": False, f"{AR}.actor.ppo_max_token_len_per_gpu": 16384,
    f"{AR}.rollout.name": "vllm", f"{AR}.rollout.gpu_memory_utilization": 0.4,
    f"{AR}.rollout.free_cache_engine": True, f"{AR}.rollout.checkpoint_engine.update_weights_bucket_megabytes": 2048,
    f"{AR}.rollout.log_prob_micro_batch_size_per_gpu": 16, f"{AR}.ref.log_prob_micro_batch_size_per_gpu": 16,
    f"{AR}.rollout.log_prob_use_dynamic_bsz": False, f"{AR}.ref.log_prob_use_dynamic_bsz": False,
}
OFFLOAD = {f"{AR}.actor.fsdp_config.param_offload": True, f"{AR}.actor.fsdp_config.optimizer_offload": True}


def est(gpu_gb: float = 80, use_critic: bool = False, **changes: Any) -> MemoryEstimate:
    values = {**BASE, **{k.replace("__", "."): v for k, v in changes.items()}}
    return estimate_verl(values, use_critic=use_critic, use_ref=True, gpu_total_bytes=int(gpu_gb * GiB))


def comp(e: MemoryEstimate, name: str) -> int:
    return sum(c.bytes for c in e.components if c.name == name)


# ----------------------------------------------------------------------------- the mapping
def test_the_keys_read_are_the_ones_selected() -> None:
    assert set(BASE) <= set(VERL_MEMORY_KEYS)


def test_qwen_half_b_on_one_gpu_holds_fp32_master_params_grads_and_adamw() -> None:
    e = est()
    params = 494_032_768  # Qwen2.5-0.5B with tied embeddings
    assert comp(e, "actor params") == params * 4
    assert comp(e, "actor AdamW states") == params * 8
    assert comp(e, "actor gradients") == params * 4  # inside the update only
    assert {c.phase for c in e.components if c.name == "actor gradients"} == {"update_actor"}
    # vLLM reserves 0.4 of the 80 GiB device while generating: the rollout phase is the peak
    assert e.peak_phase == "rollout" and 38 * GiB < e.total < 41 * GiB


def test_offload_lowers_the_estimate_by_the_state_that_leaves_the_gpu_during_rollout() -> None:
    on, off = est(), est(**OFFLOAD)
    assert off.total < on.total
    assert on.total - off.total == comp(on, "actor params") + comp(on, "actor AdamW states")
    # loaded back for the passes that need them: the update still holds everything
    assert off.phase_bytes()["update_actor"] > on.phase_bytes()["update_actor"]
    assert comp(off, "actor params") == 0 and comp(off, "actor params (loaded from CPU)") > 0


def test_offload_does_not_lower_the_update() -> None:
    """verl loads parameters and optimizer back for the update (train mode): that phase's total is unchanged; the
    log-prob passes (eval mode) load only the parameters."""
    small = {f"{AR}.rollout.gpu_memory_utilization": 0.05}
    on, off = est(**small), est(**OFFLOAD, **small)
    assert on.peak_phase != "rollout"
    assert on.persistent + on.phase_bytes()["update_actor"] == off.persistent + off.phase_bytes()["update_actor"]
    assert off.persistent + off.phase_bytes()["log_prob"] < on.persistent + on.phase_bytes()["log_prob"]


def test_sharding_over_eight_gpus_divides_params_grads_and_optimizer() -> None:
    one, eight = est(), est(trainer__n_gpus_per_node=8)
    for name in ("actor params", "actor gradients", "actor AdamW states"):
        assert comp(eight, name) == pytest.approx(comp(one, name) / 8, abs=1)
    # activations, logits and vLLM's fraction are per GPU: unchanged
    for name in ("actor activations", "actor logits", "vllm reservation (weights + KV cache)"):
        assert comp(eight, name) == comp(one, name)
    assert eight.total < one.total
    # fsdp_size caps the sharding group
    assert comp(est(trainer__n_gpus_per_node=8, **{f"{AR}.actor.fsdp_config.fsdp_size": 2}), "actor params") == \
        comp(one, "actor params") // 2


def test_dynamic_batching_uses_the_token_budget_not_the_micro_batch() -> None:
    fixed = est()
    dyn = est(**{f"{AR}.actor.use_dynamic_bsz": True, f"{AR}.actor.ppo_max_token_len_per_gpu": 2048})
    assert comp(dyn, "actor logits") == comp(fixed, "actor logits") * 2048 // (8 * 512)
    line = next(c for c in dyn.components if c.name == "actor logits")
    assert line.key == f"{AR}.actor.ppo_max_token_len_per_gpu" and "2048 tokens" in line.formula
    assert comp(est(**{f"{AR}.actor.use_dynamic_bsz": True, f"{AR}.actor.ppo_max_token_len_per_gpu": 4096}),
                "actor logits") == 2 * comp(dyn, "actor logits")


def test_free_cache_engine_false_keeps_the_reservation_in_every_phase() -> None:
    freed, kept = est(), est(**{f"{AR}.rollout.free_cache_engine": False})
    assert kept.total > freed.total
    line = next(c for c in kept.components if c.name.startswith("vllm reservation"))
    assert line.phase == "persistent" and line.bytes == int(0.4 * 80 * GiB)


def test_a_config_that_cannot_fit_names_the_key_that_dominates() -> None:
    e = est(**{f"{AR}.actor.ppo_micro_batch_size_per_gpu": 256, f"{AR}.rollout.gpu_memory_utilization": 0.1})
    problem = e.not_fitting(80 * GiB, 0.1)
    assert problem is not None and "does not fit" in problem
    assert f"[{AR}.actor.ppo_micro_batch_size_per_gpu]" in problem and "actor logits" in problem
    assert e.dominant_key() == f"{AR}.actor.ppo_micro_batch_size_per_gpu"
    # vLLM's share dominates a config that reserves nearly all of the device
    big = est(**{f"{AR}.rollout.gpu_memory_utilization": 0.95})
    assert big.dominant_key() == f"{AR}.rollout.gpu_memory_utilization" and big.not_fitting(80 * GiB) is not None


def test_a_critic_adds_its_own_worker() -> None:
    critic = {"critic.model.path": QWEN, "critic.ppo_micro_batch_size_per_gpu": 8,
              "critic.forward_micro_batch_size_per_gpu": 8, "critic.model.enable_gradient_checkpointing": True}
    without, with_critic = est(), est(use_critic=True, **critic)
    assert with_critic.total > without.total
    assert comp(with_critic, "critic AdamW states") > 0 and with_critic.phase_bytes()["update_critic"] > 0
    assert with_critic.allocated_peak("critic") > 0 and without.allocated_peak("critic") == 0


def test_allocated_peak_of_the_actor_excludes_cuda_context_and_vllm() -> None:
    e = est()
    actor = [c for c in e.components if c.process == "actor" and c.allocated]
    assert e.allocated_peak("actor") == sum(c.bytes for c in actor if c.phase == "persistent") + max(
        sum(c.bytes for c in actor if c.phase == p) for p in ("rollout", "log_prob", "update_actor"))
    assert e.allocated_peak("vllm") == 0 and 10 * GiB < e.allocated_peak("actor") < 20 * GiB


def test_fused_kernels_drop_the_logits() -> None:
    assert comp(est(**{f"{AR}.model.use_fused_kernels": True}), "actor logits") == 0


def test_no_micro_batch_and_no_dynamic_batching_is_an_error() -> None:
    with pytest.raises(ConfigError, match="ppo_micro_batch_size_per_gpu=null"):
        est(**{f"{AR}.actor.ppo_micro_batch_size_per_gpu": None})


# ----------------------------------------------------------------------------- the model's config.json
def test_model_config_from_a_local_dir_the_hub_cache_or_the_known_list(tmp_path: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert read_hub_or_local_config(QWEN, "k")["vocab_size"] == KNOWN_HUB_CONFIGS[QWEN]["vocab_size"]
    snap = tmp_path / "hub" / "models--org--m" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text('{"vocab_size": 7, "hidden_size": 8, "num_hidden_layers": 1, '
                                      '"num_attention_heads": 2}')
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert read_hub_or_local_config("org/m", "k")["vocab_size"] == 7
    assert read_hub_or_local_config(str(snap), "k")["hidden_size"] == 8
    with pytest.raises(ModelConfigUnavailable, match="org/unknown"):
        read_hub_or_local_config("org/unknown", "k")


# ----------------------------------------------------------------------------- the pre-flight on verl spaces
def _fake_inputs(values: dict[str, Any]) -> Any:
    def fake(space: Space, corners: Any, n_gpus: int, python: str | None = None) -> Any:
        return [({"use_critic": False, "use_reference_policy": True},
                 {**values, "trainer.n_gpus_per_node": n_gpus}) for _ in corners]
    return fake


def test_predict_verl_budget_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_preflight, "verl_memory_inputs", _fake_inputs(BASE))
    monkeypatch.setattr("verl_core.memory.gpu_memory", lambda: [])
    space = load_verl_space()
    pred = predict_verl(space, [])
    assert pred.fits and pred.budget == 80 * GiB and "assumed" in pred.budget_source and pred.device == "cuda"
    capped = dataclasses.replace(space, trial=dataclasses.replace(space.trial, memory_limit_gb=20.0))
    small = predict_verl(capped, [])
    assert not small.fits and "trial.memory_limit_gb=20.0" in small.budget_source
    assert f"[{AR}.rollout.gpu_memory_utilization]" in (small.problem or "")


def test_validate_prints_every_corner_and_fails_when_one_does_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_preflight, "verl_memory_inputs",
                        _fake_inputs({**BASE, f"{AR}.rollout.gpu_memory_utilization": 0.99}))
    monkeypatch.setattr("verl_core.memory.gpu_memory", lambda: [])
    out = io.StringIO()
    assert validate_space(load_verl_space(), [], out) == 2
    text = out.getvalue()
    assert text.count("DOES NOT FIT") == len(_preflight.corners(load_verl_space()))
    assert "vllm reservation" in text and "TOTAL (peak)" in text


def test_validate_skips_the_estimate_for_an_unknown_hub_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_preflight, "verl_memory_inputs", _fake_inputs({**BASE, f"{AR}.model.path": "org/nothing"}))
    out = io.StringIO()
    assert validate_space(load_verl_space(), [], out) == 0
    assert "memory estimate skipped" in out.getvalue() and "All checks passed" in out.getvalue()


# ----------------------------------------------------------------------------- real verl composes the configs
@pytest.mark.slow  # one verl subprocess: ~40 s on 2 cores
@needs_verl
def test_real_composed_configs_offload_and_sharding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("verl_core.memory.gpu_memory", lambda: [])
    space = load_verl_space()
    fixed = space.trainer_overrides({"actor_lr": 1e-6, "kl_coef": 0.01, "temperature": 1.0, "mini_batch": 16})
    off = [f"{AR}.actor.fsdp_config.param_offload=true", f"{AR}.actor.fsdp_config.optimizer_offload=true"]
    dyn = [f"{AR}.actor.use_dynamic_bsz=true", f"{AR}.actor.ppo_max_token_len_per_gpu=2048"]
    base, offload, dynamic = predict_verl_corners(space, [fixed, [*fixed, *off], [*fixed, *dyn]])
    eight = predict_verl(space, fixed, devices=[str(i) for i in range(8)], gpu_total_bytes=80 * GiB)
    assert base.fits and base.budget == 80 * GiB
    assert offload.total < base.total and eight.total < base.total
    assert "micro 8 x 512 tokens" in base.table and "/ 8 GPU(s)" in eight.table
    assert "2048 tokens (ppo_max_token_len_per_gpu, use_dynamic_bsz)" in dynamic.table
