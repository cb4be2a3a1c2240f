"""Micro-batch gradient accumulation is exactly one full mini-batch (loss and gradients)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from verl_core.config import load_config
from verl_core.rollout import response_mask
from verl_core.workers import Actor, Critic, _token_normalizer, micro_batches


def _batch(vocab: int, eos: int, n: int = 8, p: int = 5, r: int = 4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(5, vocab, (n, p), generator=g)
    responses = torch.randint(5, vocab, (n, r), generator=g)
    responses[::3, 1] = eos  # some responses end early
    rmask = response_mask(responses, eos)
    attn = torch.cat([torch.ones(n, p, dtype=torch.long), rmask], 1)
    return {"input_ids": torch.cat([prompts, responses], 1), "attention_mask": attn,
            "position_ids": (attn.cumsum(-1) - 1).clamp(min=0), "responses": responses,
            "response_mask": rmask.float(), "pg_mask": rmask.float(),
            "old_log_probs": -torch.rand(n, r, generator=g) * 3, "advantages": torch.randn(n, r, generator=g),
            "ref_log_probs": -torch.rand(n, r, generator=g) * 3, "returns": torch.randn(n, r, generator=g),
            "values": torch.randn(n, r, generator=g) * 0.1}


def _grads(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in module.parameters() if p.grad is not None]


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_actor_micro_batches_equal_full_batch(tiny_model_dir: Path, mode: str) -> None:
    from transformers import AutoModelForCausalLM

    cfg = load_config("tiny_arith", ["actor_rollout_ref.actor.entropy_coeff=0.01",
                                     "actor_rollout_ref.actor.use_kl_loss=true",
                                     f"actor_rollout_ref.actor.loss_agg_mode={mode}"]).actor_rollout_ref.actor
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    actor = Actor(model, cfg, 1.0, contextlib.nullcontext)
    batch = _batch(model.config.vocab_size, model.config.eos_token_id)
    batch = {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}
    norm = _token_normalizer(batch["pg_mask"], mode)
    results = []
    for micro in (8, 2):
        model.zero_grad()
        total = 0.0
        for mb in micro_batches(batch, micro):
            loss, _, _ = actor.micro_loss(mb, norm)
            loss.backward()
            total += float(loss)
        results.append((total, _grads(model)))
    (full_loss, full_g), (acc_loss, acc_g) = results
    assert acc_loss == pytest.approx(full_loss, rel=1e-10)
    for a, b in zip(full_g, acc_g):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_critic_update_reduces_value_loss(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForTokenClassification

    torch.manual_seed(0)
    cfg = load_config("tiny_arith").critic
    model = AutoModelForTokenClassification.from_pretrained(tiny_model_dir, num_labels=1)
    critic = Critic(model, cfg, contextlib.nullcontext)
    batch = _batch(model.config.vocab_size, model.config.eos_token_id)
    batch["values"] = critic.compute_values(batch, 8)
    batch["returns"] = torch.ones_like(batch["values"])
    gen = torch.Generator().manual_seed(0)
    first = critic.update(batch, 8, 4, 1, gen)["critic/vf_loss"]
    for _ in range(10):
        last = critic.update(batch, 8, 4, 1, gen)["critic/vf_loss"]
    assert last < first


def test_response_mask_stops_after_first_eos() -> None:
    r = torch.tensor([[5, 6, 1, 0], [1, 0, 0, 0], [5, 6, 7, 8]])
    assert response_mask(r, eos_id=1).tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]


def test_on_policy_update_equals_update_with_recomputed_old_log_probs(tiny_model_dir: Path) -> None:
    """One epoch, one mini-batch: omitting old_log_probs gives the same step, loss and entropy as passing them."""
    from transformers import AutoModelForCausalLM

    cfg = load_config("tiny_arith", ["actor_rollout_ref.actor.use_kl_loss=true"]).actor_rollout_ref.actor
    models = [AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64) for _ in range(2)]
    actors = [Actor(m, cfg, 1.0, contextlib.nullcontext) for m in models]
    batch = _batch(models[0].config.vocab_size, models[0].config.eos_token_id)
    batch = {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}
    old, entropy = actors[0].compute_log_prob(batch, 4)
    assert entropy is not None
    with_old = actors[0].update({**batch, "old_log_probs": old}, 8, 4, 1, torch.Generator().manual_seed(0))
    without = actors[1].update({k: v for k, v in batch.items() if k != "old_log_probs"}, 8, 4, 1,
                               torch.Generator().manual_seed(0))
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/ppo_kl"):
        assert without[key] == pytest.approx(with_old[key], rel=1e-9, abs=1e-12), key
    assert without["actor/entropy"] == pytest.approx(float((entropy * batch["response_mask"]).sum()
                                                           / batch["response_mask"].sum()), rel=1e-9)
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="on-policy"):
        actors[1].update({k: v for k, v in batch.items() if k != "old_log_probs"}, 4, 4, 1,
                         torch.Generator().manual_seed(0))
