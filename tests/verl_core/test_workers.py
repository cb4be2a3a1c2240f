"""Actor and critic updates: micro-batch gradient accumulation is exactly one full mini-batch (loss, gradients
and every metric), non-finite steps are skipped, dropout stays off, the KL filter keeps the KL loss."""

from __future__ import annotations

import contextlib
import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from verl_core import algos
from verl_core.config import load_config
from verl_core.rollout import response_mask
from verl_core.workers import Actor, Critic, micro_batches


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
    norm = algos.loss_normalizer(batch["response_mask"], mode)
    results = []
    for micro in (8, 2):
        model.zero_grad()
        total = 0.0
        for mb in micro_batches(batch, micro):
            loss, _, _ = actor.micro_loss(mb, norm)
            loss.backward()
            total += float(loss.detach())
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


def _double(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}


def _actor_cfg(*overrides: str) -> Any:
    return load_config("tiny_arith", list(overrides)).actor_rollout_ref.actor


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_actor_metrics_do_not_depend_on_the_micro_batch_size(tiny_model_dir: Path, mode: str) -> None:
    """The same batch and weights at micro-batch 8 / 4 / 2 / 1 log the same numbers (were summed: 1x / 2x / 4x / 8x)."""
    from transformers import AutoModelForCausalLM

    cfg = _actor_cfg("actor_rollout_ref.actor.entropy_coeff=0.01", "actor_rollout_ref.actor.use_kl_loss=true",
                     f"actor_rollout_ref.actor.loss_agg_mode={mode}")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    batch = _double(_batch(base.config.vocab_size, base.config.eos_token_id))
    batch["old_log_probs"][::2] = -30.0  # ratios far above 1 + eps there: the dual clip acts where A < 0
    batch["pg_mask"][1, 0] = 0.0  # a KL-filtered token: metrics are over the kept tokens
    results = []
    for micro in (8, 4, 2, 1):
        actor = Actor(copy.deepcopy(base), cfg, 1.0, contextlib.nullcontext)
        results.append(actor.update(batch, 8, micro, 1, torch.Generator().manual_seed(0)))
    full = results[0]
    assert 0 < full["actor/pg_clipfrac"] <= 1 and 0 < full["actor/pg_clipfrac_lower"] <= 1
    for got in results[1:]:
        assert got.keys() == full.keys()
        for key, value in full.items():
            assert got[key] == pytest.approx(value, abs=1e-6), key
    # and the value is the mini-batch's own token fraction
    old = batch["old_log_probs"]
    new, _ = Actor(copy.deepcopy(base), cfg, 1.0, contextlib.nullcontext).compute_log_prob(batch, 8)
    _, clipfrac, ppo_kl, _ = algos.compute_policy_loss(old, new, batch["advantages"], batch["response_mask"],
                                                       token_mask=batch["pg_mask"])
    assert full["actor/pg_clipfrac"] == pytest.approx(float(clipfrac), abs=1e-9)
    assert full["actor/ppo_kl"] == pytest.approx(float(ppo_kl), abs=1e-9)


def test_critic_metrics_do_not_depend_on_the_micro_batch_size(tiny_model_dir: Path) -> None:
    """vf_clipfrac weighted by each micro-batch's share of tokens (was: of samples; rows differ in length)."""
    from transformers import AutoModelForTokenClassification

    cfg = load_config("tiny_arith", ["critic.cliprange_value=0.05"]).critic
    torch.manual_seed(0)
    base = AutoModelForTokenClassification.from_pretrained(tiny_model_dir, num_labels=1, dtype=torch.float64)
    batch = _double(_batch(base.config.vocab_size, base.config.eos_token_id))
    results = []
    for micro in (8, 4, 2, 1):
        critic = Critic(copy.deepcopy(base), cfg, contextlib.nullcontext)
        results.append(critic.update(batch, 8, micro, 1, torch.Generator().manual_seed(0)))
    assert 0 < results[0]["critic/vf_clipfrac"] < 1
    for got in results[1:]:
        for key, value in results[0].items():
            assert got[key] == pytest.approx(value, abs=1e-6), key


def test_nonfinite_gradient_skips_the_step_and_never_reaches_the_weights(tiny_model_dir: Path) -> None:
    """Mini-batch 1 has a NaN advantage: no step from it; the result equals updating on mini-batch 2 alone."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    batch = _double(_batch(base.config.vocab_size, base.config.eos_token_id))
    bad = {k: v.clone() for k, v in batch.items()}
    bad["advantages"][0, 0] = float("nan")
    cfg = _actor_cfg("actor_rollout_ref.actor.shuffle=false")
    actors = [Actor(copy.deepcopy(base), cfg, 1.0, contextlib.nullcontext) for _ in range(2)]
    out = actors[0].update(bad, 4, 2, 1, torch.Generator().manual_seed(0))  # no shuffle: rows 0-3, then 4-7
    ref = actors[1].update({k: v[4:] for k, v in batch.items()}, 4, 2, 1, torch.Generator().manual_seed(0))
    assert out["actor/grad_norm_nonfinite_steps"] == 1.0 and ref["actor/grad_norm_nonfinite_steps"] == 0.0
    assert out["actor/grad_norm"] == pytest.approx(ref["actor/grad_norm"], rel=1e-12)  # finite steps only
    for a, b in zip(actors[0].model.parameters(), actors[1].model.parameters()):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=0, atol=0)

    torch.manual_seed(0)
    vbase = AutoModelForTokenClassification.from_pretrained(tiny_model_dir, num_labels=1, dtype=torch.float64)
    critic = Critic(vbase, load_config("tiny_arith").critic, contextlib.nullcontext)
    bad["returns"][:] = float("nan")
    before = [p.detach().clone() for p in vbase.parameters()]
    out = critic.update(bad, 4, 4, 2, torch.Generator().manual_seed(0))
    assert out["critic/grad_norm_nonfinite_steps"] == 4.0 and "critic/grad_norm" not in out
    assert all(torch.equal(a, b) for a, b in zip(before, vbase.parameters()))
    assert not critic.optimizer.state  # Adam moments untouched too


def test_lr_metric_is_the_rate_the_update_used(tiny_model_dir: Path) -> None:
    """With a 4-step warm-up the first update runs at lr/4 and says so (was: the next step's lr/2)."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    overrides = ["actor_rollout_ref.actor.optim.lr_warmup_steps=4", "critic.optim.lr_warmup_steps=4"]
    cfg = load_config("tiny_arith", overrides)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    batch = _batch(model.config.vocab_size, model.config.eos_token_id)
    actor = Actor(model, cfg.actor_rollout_ref.actor, 1.0, contextlib.nullcontext)
    lr = cfg.actor_rollout_ref.actor.optim.lr
    for k in (1, 2):
        assert actor.update(batch, 8, 8, 1, torch.Generator())["actor/lr"] == pytest.approx(lr * k / 4)
    critic = Critic(AutoModelForTokenClassification.from_pretrained(tiny_model_dir, num_labels=1), cfg.critic,
                    contextlib.nullcontext)
    assert critic.update(batch, 8, 8, 1, torch.Generator())["critic/lr"] == pytest.approx(cfg.critic.optim.lr / 4)


def _dropout_model() -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, attention_dropout=0.5, pad_token_id=0, eos_token_id=1)
    return Qwen2ForCausalLM(cfg).double().eval()


def test_dropout_stays_off_during_updates() -> None:
    """A model whose config has attention_dropout=0.5: in the update's train mode the log-probs do not change
    between passes, and an update with lr=0 sees a PPO ratio of exactly 1 against eval-mode old log-probs."""
    model = _dropout_model()
    actor = Actor(model, _actor_cfg("actor_rollout_ref.actor.optim.lr=0"), 1.0, contextlib.nullcontext)
    batch = _double(_batch(50, 1))
    old, _ = actor.compute_log_prob(batch, 8)
    model.train()  # the mode Actor.update runs in (gradient checkpointing needs it)
    with torch.no_grad():
        first, _ = actor.forward(batch, with_entropy=False)
        second, _ = actor.forward(batch, with_entropy=False)
    model.eval()
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    out = actor.update({**batch, "old_log_probs": old}, 8, 4, 1, torch.Generator().manual_seed(0))
    assert out["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-12) and out["actor/pg_clipfrac"] == 0.0
    from transformers import Qwen2ForTokenClassification

    critic_model = Qwen2ForTokenClassification(model.config).double().train()
    Critic(critic_model, load_config("tiny_arith").critic, contextlib.nullcontext)
    with torch.no_grad():
        ids = batch["input_ids"]
        assert torch.equal(critic_model(input_ids=ids).logits, critic_model(input_ids=ids).logits)


def test_kl_filter_keeps_the_kl_loss_and_the_loss_normalization(tiny_model_dir: Path) -> None:
    """Filtered tokens leave the policy loss (adding 0, still counted in its denominator), not the KL loss."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    batch = _double(_batch(model.config.vocab_size, model.config.eos_token_id))
    filtered = batch["response_mask"].clone()
    filtered[0, 0] = filtered[3, 2] = filtered[5, 1] = 0.0
    batch["advantages"] = batch["advantages"] * filtered  # the filtered tokens would add 0 anyway
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        actor = Actor(model, _actor_cfg("actor_rollout_ref.actor.use_kl_loss=true",
                                        f"actor_rollout_ref.actor.loss_agg_mode={mode}"), 1.0, contextlib.nullcontext)
        norm = algos.loss_normalizer(batch["response_mask"], mode)
        with torch.no_grad():
            _, unfiltered, _ = actor.micro_loss(batch, norm)
            _, with_filter, _ = actor.micro_loss({**batch, "pg_mask": filtered}, norm)
        assert with_filter["actor/kl_loss"] == pytest.approx(unfiltered["actor/kl_loss"], rel=1e-12), mode
        assert with_filter["actor/pg_loss"] == pytest.approx(unfiltered["actor/pg_loss"], rel=1e-12), mode
        assert with_filter["actor/kl_loss"] > 0


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum"])
def test_on_policy_entropy_metric_follows_loss_agg_mode(tiny_model_dir: Path, mode: str) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    actor = Actor(model, _actor_cfg(f"actor_rollout_ref.actor.loss_agg_mode={mode}"), 1.0, contextlib.nullcontext)
    batch = _double(_batch(model.config.vocab_size, model.config.eos_token_id))
    _, entropy = actor.compute_log_prob(batch, 8)
    assert entropy is not None
    want = float(algos.agg_loss(entropy, batch["response_mask"], mode))
    out = actor.update({k: v for k, v in batch.items() if k != "old_log_probs"}, 8, 2, 1, torch.Generator())
    assert out["actor/entropy"] == pytest.approx(want, rel=1e-9)
    assert math.isfinite(out["actor/entropy"])
