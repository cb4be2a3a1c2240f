"""The stages of verl's memory estimate (``hpo/backends/verl/_memory_stages.py``), on the shipped GPU space's keys:
one estimate under way derives its sizes once (GPUs, sequences a step, expected lengths capped at the maxima, FSDP
ranks), and each part of a verl step adds its own lines to the table in order: the actor's state, its update, the
log-prob passes (the reference's only with a reference), the rollout engine beside it; a critic's micro-batch that
verl cannot size is one error naming the key. The totals and verdicts: ``test_memory_model.py``."""

from __future__ import annotations

import pytest

from hpo.backends._shapes import EstimateError, ModelShape, SequenceLengths
from hpo.backends.verl._memory_stages import Run, actor_state, actor_update, critic, log_prob_passes, rollout_engine
from hpo.backends.verl._model_config import KNOWN_HUB_CONFIGS
from tests.hpo.backends.verl.test_memory_model import AR, BASE, QWEN, GiB

SHAPE = ModelShape.from_config(KNOWN_HUB_CONFIGS[QWEN], f"{AR}.model.path")


def test_an_estimate_derives_its_sizes_once() -> None:
    run = Run({**BASE, "trainer.n_gpus_per_node": 4, "trainer.nnodes": 2, f"{AR}.rollout.n": 4}, SHAPE,
              SequenceLengths(prompt=100, response=10_000, source="a previous run"), 80 * GiB)
    assert (run.world, run.W, run.n, run.batch) == (8, 8, 4, 64 * 4)  # fsdp_size -1: every GPU of the run
    assert (run.exp_p, run.exp_r) == (100, 256)  # the expected lengths, capped at data.max_*_length
    assert run.pa == SHAPE.causal_lm_params() and run.trainable == run.pa  # no LoRA: every parameter trains
    assert Run({**BASE, f"{AR}.actor.fsdp_config.fsdp_size": 2, "trainer.n_gpus_per_node": 8}, SHAPE, None,
               None).W == 2


def test_each_stage_adds_its_lines_in_table_order() -> None:
    run = Run(dict(BASE), SHAPE, None, 80 * GiB)
    seen: list[list[str]] = []
    for stage in (actor_state, actor_update, lambda r: log_prob_passes(r, True), rollout_engine):
        before = len(run.comps)
        stage(run)
        seen.append([c.name for c in run.comps[before:]])
    assert seen[0][:2] == ["CUDA context (training workers)", "actor params"] and "actor AdamW states" in seen[0]
    assert seen[1] == ["actor activations", "actor logits"]
    assert seen[2][0] == "old-log-prob layer activations" and "reference params" in seen[2]
    assert "vllm weights + KV cache (awake)" in seen[3]
    assert {c.process for c in run.comps if c.name.startswith("vllm")} == {"vllm"}
    no_ref = Run(dict(BASE), SHAPE, None, 80 * GiB)
    log_prob_passes(no_ref, False)
    assert not any(c.name.startswith("reference") for c in no_ref.comps)
    run.add("a line of two phases", 1, ("ref", "old_log_prob"), "x")
    assert [c.phase for c in run.comps[-2:]] == ["ref", "old_log_prob"]


def test_a_critic_micro_batch_verl_cannot_size_is_one_error_naming_it() -> None:
    run = Run(dict(BASE), SHAPE, None, 80 * GiB)
    with pytest.raises(EstimateError, match="critic.ppo_micro_batch_size_per_gpu=null without dynamic batching"):
        critic(run, None)
    sized = Run({**BASE, "critic.ppo_micro_batch_size_per_gpu": 4, "critic.forward_micro_batch_size_per_gpu": 4},
                SHAPE, None, 80 * GiB)
    critic(sized, None)
    assert sized.comps and all("critic" in c.name for c in sized.comps)
