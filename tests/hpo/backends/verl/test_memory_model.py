"""verl's memory model (``hpo/backends/verl/_memory_model.py``: peak GPU memory of ``main_ppo`` phase by phase, from
a composed config's keys; its stages: ``_memory_stages``): the arithmetic checked on hand-written key values (what
``verl/_compose.py`` selects from a composed config), the expected against the worst case, and the verdicts on what
verl's own docs and published sweeps say runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hpo.backends._shapes import EstimateError, MemoryEstimate, SequenceLengths, read_sequence_lengths
from hpo.backends.verl._memory_model import (
    LENGTH_METRICS,
    VERL_MEMORY_KEYS,
    VERL_PHASES,
    VerlMemoryVerdict,
    estimate_verl,
    judge_verl,
)
from tests import verl_configs

GiB = 2**30
AR = "actor_rollout_ref"
QWEN = "Qwen/Qwen2.5-0.5B-Instruct"
# the shipped space's keys as verl composes them (verl's defaults for the rest)
BASE: dict[str, Any] = {
    "trainer.n_gpus_per_node": 1, "trainer.nnodes": 1, "data.max_prompt_length": 256,
    "data.max_response_length": 256, "data.train_batch_size": 64, f"{AR}.rollout.n": 1,
    f"{AR}.actor.ppo_mini_batch_size": 64, f"{AR}.model.path": QWEN, f"{AR}.model.enable_gradient_checkpointing": True,
    f"{AR}.actor.strategy": "fsdp", f"{AR}.actor.fsdp_config.fsdp_size": -1,
    f"{AR}.actor.fsdp_config.model_dtype": "fp32", f"{AR}.actor.ppo_micro_batch_size_per_gpu": 8,
    f"{AR}.actor.use_dynamic_bsz": False, f"{AR}.actor.ppo_max_token_len_per_gpu": 16384,
    f"{AR}.rollout.name": "vllm", f"{AR}.rollout.gpu_memory_utilization": 0.4,
    f"{AR}.rollout.free_cache_engine": True, f"{AR}.rollout.checkpoint_engine.update_weights_bucket_megabytes": 2048,
    f"{AR}.rollout.log_prob_micro_batch_size_per_gpu": 16, f"{AR}.ref.log_prob_micro_batch_size_per_gpu": 16,
    f"{AR}.rollout.log_prob_use_dynamic_bsz": False, f"{AR}.ref.log_prob_use_dynamic_bsz": False,
}
OFFLOAD = {f"{AR}.actor.fsdp_config.param_offload": True, f"{AR}.actor.fsdp_config.optimizer_offload": True}


def est(gpu_gb: float = 80, use_critic: bool = False, lengths: SequenceLengths | None = None,
        **changes: Any) -> MemoryEstimate:
    values = {**BASE, **{k.replace("__", "."): v for k, v in changes.items()}}
    return estimate_verl(values, use_critic=use_critic, use_ref=True, gpu_total_bytes=int(gpu_gb * GiB),
                         lengths=lengths)


def comp(e: MemoryEstimate, name: str) -> int:
    return sum(c.bytes for c in e.components if c.name == name)


# ----------------------------------------------------------------------------- the mapping
def test_the_keys_read_are_the_ones_selected() -> None:
    assert set(BASE) <= set(VERL_MEMORY_KEYS)
    assert set(yaml.safe_load((Path(verl_configs.__file__).parent / "defaults.yaml").read_text())) == \
        set(VERL_MEMORY_KEYS) - {f"{AR}.model.path"}


def test_qwen_half_b_on_one_gpu_holds_fp32_master_params_grads_and_adamw() -> None:
    e = est()
    params = 494_032_768  # Qwen2.5-0.5B with tied embeddings
    assert comp(e, "actor params") == params * 4
    assert comp(e, "actor AdamW states") == params * 8
    # gradients exist inside the update and its optimizer step only (zeroed to None when the update ends)
    assert {c.phase for c in e.components if c.name == "actor gradients"} == {"update_actor", "actor_step"}
    assert e.phase_bytes()["actor_step"] >= params * 8  # gradients + AdamW's foreach temporaries
    # vLLM reserves 0.4 of the 80 GiB device while generating: the rollout phase is the peak
    assert e.peak_phase == "rollout" and 38 * GiB < e.total < 41 * GiB


def test_offload_lowers_the_estimate_by_the_state_that_leaves_the_gpu_during_rollout() -> None:
    on, off = est(), est(**OFFLOAD)
    assert off.total < on.total
    assert on.persistent - off.persistent == comp(on, "actor params") + comp(on, "actor AdamW states")
    assert {c.phase for c in off.components if c.name == "actor params (loaded from the CPU)"} == \
        {"old_log_prob", "update_actor", "actor_step", "weight_sync"}


def test_offload_does_not_lower_the_update() -> None:
    """verl loads parameters and optimizer back for the update (train mode): that phase's total is unchanged."""
    small = {f"{AR}.rollout.gpu_memory_utilization": 0.05}
    on, off = est(**small), est(**OFFLOAD, **small)
    for phase in ("update_actor", "actor_step"):
        assert on.persistent + on.phase_bytes()[phase] == off.persistent + off.phase_bytes()[phase]


def test_sharding_over_eight_gpus_divides_params_grads_and_optimizer() -> None:
    one, eight = est(), est(trainer__n_gpus_per_node=8)
    for name in ("actor params", "actor gradients", "actor AdamW states"):
        assert comp(eight, name) == pytest.approx(comp(one, name) / 8, abs=2)
    for name in ("actor activations", "actor logits", "vllm weights + KV cache (awake)"):
        assert comp(eight, name) == comp(one, name)
    assert eight.total < one.total and comp(eight, "NCCL communicators (training workers)") > 0
    assert comp(est(trainer__n_gpus_per_node=8, **{f"{AR}.actor.fsdp_config.fsdp_size": 2}), "actor params") == \
        comp(one, "actor params") // 2


def test_logits_are_bf16_per_packed_token_not_fp32_per_padded_position() -> None:
    e = est()
    # micro 8 x (256 + 256) tokens x vocab x 2 B: the bf16 LM-head output, flash-attn's cross-entropy in place
    assert comp(e, "actor logits") == 8 * 512 * 151936 * 2
    # the compiled entropy adds 4 B with grad (entropy_coeff), eager adds 6
    assert comp(est(**{f"{AR}.actor.entropy_coeff": 0.001}), "actor logits") == 8 * 512 * 151936 * 6
    assert comp(est(**{f"{AR}.actor.entropy_coeff": 0.001, f"{AR}.actor.fsdp_config.use_torch_compile": False}),
                "actor logits") == 8 * 512 * 151936 * 8
    # a temperature other than 1 adds the scaled copy
    assert comp(est(**{f"{AR}.rollout.temperature": 0.7}), "actor logits") == 8 * 512 * 151936 * 4


def test_dynamic_batching_uses_the_token_budget_capped_at_the_gpus_share() -> None:
    fixed = est()
    dyn = est(**{f"{AR}.actor.use_dynamic_bsz": True, f"{AR}.actor.ppo_max_token_len_per_gpu": 2048})
    assert comp(dyn, "actor logits") == comp(fixed, "actor logits") * 2048 // (8 * 512)
    line = next(c for c in dyn.components if c.name == "actor logits")
    assert line.key == f"{AR}.actor.ppo_max_token_len_per_gpu" and "2048 tokens" in line.formula
    # one GPU's share of a mini-batch (16 prompts x n 1 over 8 GPUs = 2 sequences of 512) caps a large budget
    capped = est(trainer__n_gpus_per_node=8, **{f"{AR}.actor.use_dynamic_bsz": True,
                                                f"{AR}.actor.ppo_max_token_len_per_gpu": 65536,
                                                f"{AR}.actor.ppo_mini_batch_size": 16})
    assert comp(capped, "actor logits") == 2 * 512 * 151936 * 2


def test_free_cache_engine_false_keeps_the_reservation_in_every_phase() -> None:
    freed, kept = est(), est(**{f"{AR}.rollout.free_cache_engine": False})
    assert kept.total > freed.total
    line = next(c for c in kept.components if c.name == "vllm weights + KV cache")
    assert line.phase == "persistent" and line.bytes == int(0.4 * 80 * GiB)


def test_weight_sync_on_one_gpu_clones_every_parameter_beside_vllms_weights() -> None:
    e = est()
    params = 494_032_768
    assert comp(e, "actor state dict (weight sync)") == params * 4  # FSDP1 FULL_STATE_DICT
    assert comp(e, "vllm weights (woken for the sync)") == params * 2  # bf16, KV cache still asleep
    assert comp(e, "weight-sync bucket") == 2048 * 2**20
    assert comp(est(trainer__n_gpus_per_node=4), "actor state dict (weight sync)") == params  # sharded clones
    assert comp(est(**{f"{AR}.actor.strategy": "fsdp2"}), "actor state dict (weight sync)") == 0


def test_a_config_that_cannot_fit_names_the_key_that_dominates() -> None:
    e = est(**{f"{AR}.actor.ppo_micro_batch_size_per_gpu": 1024, f"{AR}.actor.ppo_mini_batch_size": 1024,
               f"{AR}.rollout.gpu_memory_utilization": 0.1})
    problem = e.not_fitting(80 * GiB, 0.1)
    assert problem is not None and "does not fit" in problem
    assert e.dominant_key() == f"{AR}.actor.ppo_micro_batch_size_per_gpu"
    big = est(**{f"{AR}.rollout.gpu_memory_utilization": 0.99})
    assert big.dominant_key() == f"{AR}.rollout.gpu_memory_utilization" and big.not_fitting(80 * GiB) is not None


def test_a_critic_shares_the_training_process() -> None:
    critic = {"critic.model.path": QWEN, "critic.ppo_micro_batch_size_per_gpu": 8,
              "critic.forward_micro_batch_size_per_gpu": 8, "critic.model.enable_gradient_checkpointing": True}
    without, with_critic = est(), est(use_critic=True, **critic)
    assert with_critic.persistent > without.persistent
    assert comp(with_critic, "critic AdamW states") > 0 and with_critic.phase_bytes()["update_critic"] > 0
    assert [c.name for c in with_critic.components if "CUDA context" in c.name and c.process == "actor"] == \
        ["CUDA context (training workers)"]


def test_allocated_peak_of_the_actor_excludes_cuda_contexts_and_vllm() -> None:
    e = est()
    actor = [c for c in e.components if c.process == "actor" and c.allocated]
    assert e.allocated_peak("actor") == sum(c.bytes for c in actor if c.phase == "persistent") + max(
        sum(c.bytes for c in actor if c.phase == p) for p in VERL_PHASES)
    assert e.allocated_peak("vllm") == 0 and 5 * GiB < e.allocated_peak("actor") < 15 * GiB


def test_fused_kernels_drop_the_logits() -> None:
    assert comp(est(**{f"{AR}.model.use_fused_kernels": True}), "actor logits") == 0


def test_no_micro_batch_and_no_dynamic_batching_is_an_error() -> None:
    with pytest.raises(EstimateError, match="ppo_micro_batch_size_per_gpu=null"):
        est(**{f"{AR}.actor.ppo_micro_batch_size_per_gpu": None})


# ----------------------------------------------------------------------------- expected vs worst case
def test_expected_lengths_lower_every_micro_batch_but_not_vllms_share() -> None:
    worst = est()
    short = est(lengths=SequenceLengths(prompt=100, response=150))
    assert comp(short, "actor logits") == 8 * 250 * 151936 * 2
    assert comp(short, "vllm weights + KV cache (awake)") == comp(worst, "vllm weights + KV cache (awake)")
    # lengths above the maxima are capped at them
    assert est(lengths=SequenceLengths(prompt=10_000, response=10_000)).total == worst.total
    with pytest.raises(EstimateError, match="response=-1"):
        SequenceLengths(response=-1)


def test_the_verdict_refuses_only_when_the_expected_peak_does_not_fit() -> None:
    values = {**BASE, f"{AR}.actor.ppo_micro_batch_size_per_gpu": 256, f"{AR}.actor.ppo_mini_batch_size": 256,
              f"{AR}.rollout.gpu_memory_utilization": 0.1}
    v = judge_verl(values, use_critic=False, use_ref=True, lengths=SequenceLengths(60, 60, "a test"),
                   gpu_total_bytes=80 * GiB)
    assert v.expected.total < v.worst.total
    between = (v.expected.total + v.worst.total) // 2
    assert v.verdict(v.worst.total + GiB) == "fits" and v.warning(v.worst.total + GiB) is None
    assert v.verdict(between) == "worst_case_does_not_fit"
    assert "expected lengths (mean prompt 60, response 60 tokens (a test)" in (v.warning(between) or "")
    assert v.verdict(v.expected.total - GiB) == "does_not_fit"
    # without expected lengths the worst case decides
    unknown = judge_verl(values, use_critic=False, use_ref=True, gpu_total_bytes=80 * GiB)
    assert unknown.expected is unknown.worst and unknown.verdict(between) == "does_not_fit"


def test_lengths_from_a_previous_runs_metrics_file(tmp_path: Path) -> None:
    f = tmp_path / "run.jsonl"
    f.write_text('{"step": 1, "data": {"response_length/mean": 200.5, "prompt_length/mean": 90}}\n'
                 '{"step": 2, "data": {"response_length/mean": 240.0, "prompt_length/mean": null}}\nnot json\n')
    got = read_sequence_lengths(f, *LENGTH_METRICS)
    assert (got.prompt, got.response) == (90, 240.0) and "run.jsonl" in got.source
    (tmp_path / "empty.jsonl").write_text('{"step": 1, "data": {"critic/score/mean": 1}}\n')
    with pytest.raises(EstimateError, match="no prompt_length/mean"):
        read_sequence_lengths(tmp_path / "empty.jsonl", *LENGTH_METRICS)


# ----------------------------------------------------------------------------- published configs
def _verdict(case: verl_configs.Case) -> VerlMemoryVerdict:
    return judge_verl(case.values, use_critic=case.use_critic, use_ref=case.use_ref, lengths=case.lengths,
                      gpu_total_bytes=case.gpu_total)


@pytest.mark.parametrize("case", verl_configs.reference_cases(), ids=lambda c: c.name)
def test_what_verls_docs_say_runs_is_judged_to_fit(case: verl_configs.Case) -> None:
    v = _verdict(case)
    assert v.verdict(case.gpu_total) != "does_not_fit", v.expected.render(case.gpu_total)


def test_published_lora_sweeps_are_judged_right_mostly_and_never_refused_when_they_ran() -> None:
    cases = verl_configs.independent_cases()
    judged = [(c, _verdict(c).verdict(c.gpu_total) != "does_not_fit") for c in cases]
    assert all(fits for c, fits in judged if c.outcome == "fits")  # no run that worked is refused
    right = sum(fits == (c.outcome == "fits") for c, fits in judged)
    assert len(cases) == 31 and right >= 18, f"{right}/{len(cases)}"
    far = [c for c, fits in judged if c.outcome == "oom" and "7B" in c.name and c.name.endswith(("112 per GPU",
                                                                                                 "128 per GPU"))]
    assert len(far) == 2 and all(_verdict(c).verdict(c.gpu_total) == "does_not_fit" for c in far)
