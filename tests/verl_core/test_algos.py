"""Specification of verl_core.algos: the PPO/GRPO math, checked against plain torch, loop references and
hand-computed numbers."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence

import numpy as np
import pytest
import torch

from verl_core import algos
from verl_core.algos import (
    ADV_ESTIMATORS,
    KL_PENALTY_TYPES,
    AdaptiveKLController,
    FixedKLController,
    agg_loss,
    apply_kl_penalty,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_policy_loss,
    compute_value_loss,
    dynamic_gamma,
    entropy_from_logits,
    get_adv_estimator,
    get_kl_controller,
    kl_penalty,
    kl_threshold_mask,
    logprobs_from_logits,
    loss_normalizer,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

D = torch.float64


def _close(actual: object, expected: object, atol: float = 1e-9) -> None:
    torch.testing.assert_close(torch.as_tensor(actual, dtype=D), torch.as_tensor(expected, dtype=D),
                               atol=atol, rtol=1e-7)


def _padded_mask(lengths: Sequence[int], width: int) -> torch.Tensor:
    """(bs, width) float mask with ones on the first lengths[i] tokens of row i."""
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).to(D)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


# ------------------------------------------------------------------------------------------------------
# masked statistics
# ------------------------------------------------------------------------------------------------------


def test_masked_stats_match_plain_torch_on_unmasked_subset(gen: torch.Generator) -> None:
    values = torch.randn(4, 7, generator=gen, dtype=D)
    mask = _padded_mask([7, 3, 1, 5], 7)
    values[mask == 0] = float("nan")  # padding content must never leak in
    subset = values[mask.bool()]

    _close(masked_sum(values, mask), subset.sum())
    _close(masked_mean(values, mask), subset.mean())
    _close(masked_var(values, mask), torch.var(subset, unbiased=True))
    _close(masked_var(values, mask, unbiased=False), torch.var(subset, unbiased=False))
    rows = torch.stack([values[i, : int(mask[i].sum())].mean() for i in range(4)])
    _close(masked_mean(values, mask, dim=-1), rows)

    whitened = masked_whiten(values, mask)
    expected = (subset - subset.mean()) / torch.sqrt(torch.var(subset) + 1e-8)
    _close(whitened[mask.bool()], expected)
    _close(whitened[mask.bool()].mean(), 0.0, atol=1e-12)
    _close(masked_whiten(values, mask, shift_mean=False)[mask.bool()], expected + subset.mean())


def test_masked_stats_accept_bool_masks(gen: torch.Generator) -> None:
    values = torch.randn(3, 5, generator=gen, dtype=D)
    mask = _padded_mask([5, 2, 4], 5)
    for fn in (masked_sum, masked_mean, masked_var, masked_whiten):
        _close(fn(values, mask.bool()), fn(values, mask))


def test_all_zero_mask_gives_zero_not_nan() -> None:
    values = torch.randn(2, 3, dtype=D)
    mask = torch.zeros(2, 3, dtype=D)
    assert masked_mean(values, mask).item() == 0.0
    assert masked_var(values, mask).item() == 0.0
    assert torch.equal(masked_mean(values, mask, dim=-1), torch.zeros(2, dtype=D))
    assert torch.equal(masked_whiten(values, mask), torch.zeros(2, 3, dtype=D))
    # one valid token: no Bessel division by zero (verl raises here; we return the uncorrected 0)
    one = torch.tensor([[1.0, 0.0, 0.0]], dtype=D)
    assert masked_var(values[:1], one).item() == 0.0


# ------------------------------------------------------------------------------------------------------
# GAE
# ------------------------------------------------------------------------------------------------------


def test_gae_hand_computed_three_tokens() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=D)
    values = torch.tensor([[0.5, 0.6, 0.7]], dtype=D)
    mask = torch.ones(1, 3, dtype=D)
    # gamma = 0.9, lam = 0.8, so gamma * lam = 0.72; V after the last token is 0.
    # t=2: delta = 1 + 0.9*0   - 0.7 = 0.3    A2 = 0.3
    # t=1: delta = 0 + 0.9*0.7 - 0.6 = 0.03   A1 = 0.03 + 0.72*0.3   = 0.246
    # t=0: delta = 0 + 0.9*0.6 - 0.5 = 0.04   A0 = 0.04 + 0.72*0.246 = 0.21712
    # returns = A + V = [0.71712, 0.846, 1.0]
    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.8)
    raw = torch.tensor([0.21712, 0.246, 0.3], dtype=D)
    _close(ret[0], [0.71712, 0.846, 1.0])
    _close(adv[0], (raw - raw.mean()) / torch.sqrt(raw.var() + 1e-8))


def _gae_single(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """Unmasked textbook GAE for one sequence, (T,) -> raw advantages (T,)."""
    adv, last, next_v = torch.zeros_like(rewards), 0.0, 0.0
    for t in reversed(range(len(rewards))):
        last = float(rewards[t] + gamma * next_v - values[t]) + gamma * lam * last
        adv[t], next_v = last, float(values[t])
    return adv


def test_gae_ignores_rewards_and_values_at_masked_positions(gen: torch.Generator) -> None:
    # row 0: right padding; row 1: masked tokens in the middle (e.g. tool observations) and at the end
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 1, 0]], dtype=D)
    rewards = torch.randn(2, 6, generator=gen, dtype=D)
    values = torch.randn(2, 6, generator=gen, dtype=D)
    pad = mask == 0
    garbage_r, garbage_v = rewards.clone(), values.clone()
    garbage_r[pad] = torch.randn(int(pad.sum()), generator=gen, dtype=D) * 1e4
    garbage_v[pad] = -3e3

    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma=0.95, lam=0.9)
    adv_g, ret_g = compute_gae_advantage_return(garbage_r, garbage_v, mask, gamma=0.95, lam=0.9)
    _close(adv_g, adv)
    _close(ret_g[~pad], ret[~pad])
    assert torch.all(adv[pad] == 0)

    # masked tokens are skipped entirely: same returns as GAE on the valid tokens alone
    for i in range(2):
        keep = mask[i].bool()
        raw = _gae_single(rewards[i, keep], values[i, keep], 0.95, 0.9)
        _close(ret[i, keep], raw + values[i, keep])


def test_gae_gamma_lam_one_terminal_reward_gives_reward_as_return(gen: torch.Generator) -> None:
    lengths = [5, 2, 4]
    mask = _padded_mask(lengths, 5)
    values = torch.randn(3, 5, generator=gen, dtype=D)
    rewards = torch.zeros(3, 5, dtype=D)
    final = torch.tensor([1.0, -2.0, 0.5], dtype=D)
    for i, n in enumerate(lengths):
        rewards[i, n - 1] = final[i]
    _, ret = compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=1.0)
    for i, n in enumerate(lengths):
        _close(ret[i, :n], final[i].expand(n))


# ------------------------------------------------------------------------------------------------------
# GRPO
# ------------------------------------------------------------------------------------------------------


def _grpo_loop_reference(rewards: torch.Tensor, mask: torch.Tensor, index: Sequence[Hashable],
                         eps: float, norm_by_std: bool) -> torch.Tensor:
    """verl's original per-sample loop."""
    scores = rewards.sum(-1)
    groups: dict[Hashable, list[torch.Tensor]] = defaultdict(list)
    for i in range(len(scores)):
        groups[index[i]].append(scores[i])
    stats = {}
    for key, members in groups.items():
        if len(members) == 1:
            stats[key] = (torch.tensor(0.0, dtype=D), torch.tensor(1.0, dtype=D))
        else:
            stacked = torch.stack(members)
            stats[key] = (stacked.mean(), stacked.std())
    out = scores.clone()
    for i in range(len(scores)):
        mean, std = stats[index[i]]
        out[i] = (scores[i] - mean) / (std + eps) if norm_by_std else scores[i] - mean
    return out.unsqueeze(-1) * mask


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("index_kind", ["str_array", "int_list", "tensor"])
def test_grpo_vectorized_matches_loop_reference(
    gen: torch.Generator, norm_by_std: bool, index_kind: str
) -> None:
    bs, width = 40, 6
    mask = _padded_mask(torch.randint(1, width + 1, (bs,), generator=gen).tolist(), width)
    rewards = torch.randn(bs, width, generator=gen, dtype=D) * mask
    ids = torch.randint(0, 12, (bs,), generator=gen)
    ids[:3] = torch.tensor([100, 101, 102])  # guaranteed singleton groups
    index: Sequence[Hashable] | np.ndarray | torch.Tensor
    if index_kind == "str_array":
        index = np.array([f"uid-{k}" for k in ids.tolist()], dtype=object)
    elif index_kind == "int_list":
        index = ids.tolist()
    else:
        index = ids
    keys = ids.tolist()
    adv, ret = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm_by_std)
    _close(adv, _grpo_loop_reference(rewards, mask, keys, 1e-6, norm_by_std), atol=1e-8)
    assert torch.equal(adv, ret)
    assert torch.all(adv[mask == 0] == 0)


def test_grpo_binary_rewards_group_stats_by_hand() -> None:
    # group "a": scores 1, 0, 0, 1 -> mean 0.5, unbiased std sqrt(1/3); group "b": all 1 -> advantage 0
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0], dtype=D)
    mask = torch.ones(6, 2, dtype=D)
    rewards = torch.stack([torch.zeros_like(scores), scores], dim=1)  # reward on the last token
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, ["a", "a", "a", "a", "b", "b"])
    z = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    _close(adv[:, 0], [z, -z, -z, z, 0.0, 0.0])


def test_grpo_group_of_one_keeps_the_score() -> None:
    rewards = torch.tensor([[0.0, 2.5], [0.0, -1.0]], dtype=D)
    mask = torch.ones(2, 2, dtype=D)
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, ["p0", "p1"])  # mean 0, std 1
    _close(adv[:, 0], [2.5 / (1 + 1e-6), -1.0 / (1 + 1e-6)])
    adv_no_std, _ = compute_grpo_outcome_advantage(rewards, mask, ["p0", "p1"], norm_adv_by_std_in_grpo=False)
    _close(adv_no_std[:, 1], [2.5, -1.0])


# ------------------------------------------------------------------------------------------------------
# policy and value losses
# ------------------------------------------------------------------------------------------------------


def test_policy_loss_ratio_one_is_minus_mean_advantage(gen: torch.Generator) -> None:
    logp = torch.randn(3, 4, generator=gen, dtype=D)
    adv = torch.randn(3, 4, generator=gen, dtype=D)
    mask = _padded_mask([4, 2, 3], 4)
    loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss(logp, logp.clone(), adv, mask)
    _close(loss, -masked_mean(adv, mask))
    assert clipfrac.item() == 0.0 and clipfrac_lower.item() == 0.0 and ppo_kl.item() == 0.0
    assert clipfrac.dim() == 0 and ppo_kl.dim() == 0


def test_policy_loss_clipping_by_hand() -> None:
    # token: A,  ratio -> max(-A*r, -A*clip(r, 0.8, 1.2))
    #   1:  +1, 1.5  -> max(-1.5, -1.2) = -1.2   clipped
    #   2:  -1, 0.5  -> max( 0.5,  0.8) =  0.8   clipped (dual bound -A*3 = 3 not reached)
    #   3:  +1, 0.5  -> max(-0.5, -0.8) = -0.5
    #   4:  +2, 1.1  -> max(-2.2, -2.4) = -2.2
    #   5: padding (garbage)
    # token-mean = (-1.2 + 0.8 - 0.5 - 2.2) / 4 = -0.775, clipfrac = 2/4
    adv = torch.tensor([[1.0, -1.0, 1.0, 2.0, 50.0]], dtype=D)
    ratio = torch.tensor([[1.5, 0.5, 0.5, 1.1, 9.0]], dtype=D)
    old = torch.zeros(1, 5, dtype=D)
    mask = torch.tensor([[1, 1, 1, 1, 0]], dtype=D)
    loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss(old, ratio.log(), adv, mask)
    _close(loss, -0.775)
    _close(clipfrac, 0.5)
    _close(clipfrac_lower, 0.0)
    _close(ppo_kl, -ratio[0, :4].log().mean())
    # clip-higher (DAPO-style asymmetric range): token 1 becomes -1.28
    loss_hi, *_ = compute_policy_loss(old, ratio.log(), adv, mask, clip_ratio_high=0.28)
    _close(loss_hi, (-1.28 + 0.8 - 0.5 - 2.2) / 4)
    # a bool mask is the same mask
    _close(compute_policy_loss(old, ratio.log(), adv, mask.bool())[0], loss)


def test_policy_loss_dual_clip_bounds_negative_advantage() -> None:
    # A = -1, ratio = 10: max(10, 0.8) = 10, dual clip -> min(10, -A * 3) = 3
    adv = torch.tensor([[-1.0]], dtype=D)
    logp = torch.tensor([[math.log(10.0)]], dtype=D)
    old, mask = torch.zeros(1, 1, dtype=D), torch.ones(1, 1, dtype=D)
    loss, _, _, clipfrac_lower = compute_policy_loss(old, logp, adv, mask, clip_ratio_c=3.0)
    _close(loss, 3.0)
    _close(clipfrac_lower, 1.0)
    with pytest.raises(AssertionError, match="clip_ratio_c"):
        compute_policy_loss(old, logp, adv, mask, clip_ratio_c=1.0)


def test_policy_loss_log_ratio_clamped_at_20() -> None:
    # log-ratio 100 would overflow float32 (exp(100) = 2.7e43); clamped to 20 the loss is exp(20)
    adv = torch.tensor([[-1.0]])
    old, logp, mask = torch.zeros(1, 1), torch.full((1, 1), 100.0, requires_grad=True), torch.ones(1, 1)
    loss, _, ppo_kl, _ = compute_policy_loss(old, logp, adv, mask, clip_ratio_c=1e12)
    assert torch.isfinite(loss)
    torch.testing.assert_close(loss, torch.tensor(math.exp(20.0)))
    assert ppo_kl.item() == -20.0
    loss.backward()
    assert logp.grad is not None and torch.isfinite(logp.grad).all()


def test_value_loss_clipping_by_hand() -> None:
    # token 1: clip(1.0, 0-0.5, 0+0.5) = 0.5; (1-2)^2 = 1 vs (0.5-2)^2 = 2.25 -> 2.25 (clipped)
    # token 2: clip(2.0, 1.5, 2.5) = 2.0;     (2-1)^2 = 1 vs 1 -> 1 (not clipped)
    # vf_loss = 0.5 * (2.25 + 1) / 2 = 0.8125, clipfrac = 0.5
    vpreds = torch.tensor([[1.0, 2.0, 7.0]], dtype=D)
    values = torch.tensor([[0.0, 2.0, -7.0]], dtype=D)
    returns = torch.tensor([[2.0, 1.0, 70.0]], dtype=D)
    mask = torch.tensor([[1, 1, 0]], dtype=D)
    vf_loss, vf_clipfrac = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.5)
    _close(vf_loss, 0.8125)
    _close(vf_clipfrac, 0.5)


def test_entropy_and_logprobs_match_categorical(gen: torch.Generator) -> None:
    logits = torch.randn(2, 3, 11, generator=gen, dtype=D) * 3
    labels = torch.randint(0, 11, (2, 3), generator=gen)
    dist = torch.distributions.Categorical(logits=logits)
    _close(entropy_from_logits(logits), dist.entropy())
    _close(logprobs_from_logits(logits, labels), dist.log_prob(labels))


# ------------------------------------------------------------------------------------------------------
# agg_loss and micro-batching
# ------------------------------------------------------------------------------------------------------


def test_agg_loss_modes_by_hand() -> None:
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=D)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=D)
    _close(agg_loss(loss, mask, "token-mean"), 7 / 3)  # (1 + 2 + 4) / 3
    _close(agg_loss(loss, mask, "seq-mean-token-sum"), 3.5)  # (3 + 4) / 2
    _close(agg_loss(loss, mask, "seq-mean-token-mean"), 2.75)  # (1.5 + 4) / 2
    _close(agg_loss(loss, mask, "token-mean", normalizer=10.0), 0.7)
    with pytest.raises(ValueError, match="seq-sum"):
        agg_loss(loss, mask, "seq-sum")
    with pytest.raises(ValueError, match="normalizer"):
        agg_loss(loss, mask, "token-mean", normalizer=0.0)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_micro_batches_with_normalizer_add_up_to_full_batch(gen: torch.Generator, mode: str) -> None:
    bs, width = 8, 6
    x = torch.randn(bs, width, generator=gen, dtype=D)
    mask = _padded_mask([6, 1, 3, 5, 2, 6, 4, 1], width)
    w = torch.tensor([0.7, -1.3], dtype=D, requires_grad=True)

    def loss_mat(rows: slice) -> torch.Tensor:
        return (w[0] * x[rows] + w[1]) ** 2

    full = agg_loss(loss_mat(slice(None)), mask, mode)
    (full_grad,) = torch.autograd.grad(full, w)

    normalizer = loss_normalizer(mask, mode)
    assert normalizer == (float(mask.sum()) if mode == "token-mean" else float(bs))
    chunks = [slice(0, 3), slice(3, 5), slice(5, 8)]
    micro = sum(agg_loss(loss_mat(c), mask[c], mode, normalizer=normalizer) for c in chunks)
    assert isinstance(micro, torch.Tensor)
    (micro_grad,) = torch.autograd.grad(micro, w)
    _close(micro, full)
    _close(micro_grad, full_grad)

    # the plain average of micro-batch means is a different (length-biased) number
    naive = sum(agg_loss(loss_mat(c), mask[c], mode) for c in chunks) / len(chunks)
    assert not torch.isclose(torch.as_tensor(naive), full)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_fully_masked_rows_do_not_count(gen: torch.Generator, mode: str) -> None:
    """A row with no token in the mask changes neither the loss nor the normalizer (verl's seq-mean modes)."""
    loss = torch.randn(3, 4, generator=gen, dtype=D)
    mask = _padded_mask([4, 2, 3], 4)
    with_empty = torch.cat([loss, torch.full((1, 4), 7.0, dtype=D)])
    empty_mask = torch.cat([mask, torch.zeros(1, 4, dtype=D)])
    _close(agg_loss(with_empty, empty_mask, mode), agg_loss(loss, mask, mode))
    assert loss_normalizer(empty_mask, mode) == loss_normalizer(mask, mode)
    assert loss_normalizer(mask, mode) == (9.0 if mode == "token-mean" else 3.0)
    _close(agg_loss(with_empty, empty_mask, mode, loss_normalizer(empty_mask, mode)), agg_loss(loss, mask, mode))
    # nothing at all: 0 (not NaN), normalizer 1
    _close(agg_loss(loss, torch.zeros_like(mask), mode), 0.0)
    assert loss_normalizer(torch.zeros_like(mask), mode) == 1.0
    with pytest.raises(ValueError, match="seq-sum"):
        loss_normalizer(mask, "seq-sum")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_policy_loss_token_mask_drops_tokens_without_reweighting(gen: torch.Generator, mode: str) -> None:
    """``token_mask`` (the KL-threshold filter): filtered tokens add 0 and still count in the denominator, so a
    filter over tokens with zero advantage changes nothing; metrics are over the kept tokens."""
    old = torch.randn(3, 5, generator=gen, dtype=D)
    logp = old + 0.5 * torch.randn(3, 5, generator=gen, dtype=D)
    adv = torch.randn(3, 5, generator=gen, dtype=D)
    mask = _padded_mask([5, 3, 4], 5)
    keep = mask.clone()
    keep[0, 1] = keep[2, 3] = keep[1, 0] = 0.0
    loss, clipfrac, ppo_kl, _ = compute_policy_loss(old, logp, adv, mask, loss_agg_mode=mode, token_mask=keep)
    full, *_ = compute_policy_loss(old, logp, adv * keep, mask, loss_agg_mode=mode)
    _close(loss, full)
    ratio = (logp - old).exp()
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    _close(loss, agg_loss(per_token * keep, mask, mode))
    _close(clipfrac, masked_mean((-adv * ratio.clamp(0.8, 1.2) > -adv * ratio).to(D), keep))
    _close(ppo_kl, masked_mean(old - logp, keep))
    # no token_mask: the response mask
    _close(compute_policy_loss(old, logp, adv, mask, loss_agg_mode=mode, token_mask=mask)[0],
           compute_policy_loss(old, logp, adv, mask, loss_agg_mode=mode)[0])


# ------------------------------------------------------------------------------------------------------
# KL estimators, controllers, reward penalty
# ------------------------------------------------------------------------------------------------------


def test_kl_estimators_known_values() -> None:
    # p = 0.5, p_ref = 0.25: log-ratio log(p / p_ref) = log 2; k3 uses r = p_ref / p = 0.5
    logp, ref = torch.tensor([[math.log(0.5)]], dtype=D), torch.tensor([[math.log(0.25)]], dtype=D)
    ln2 = math.log(2.0)
    expected = {"kl": ln2, "k1": ln2, "abs": ln2, "mse": 0.5 * ln2**2, "k2": 0.5 * ln2**2,
                "low_var_kl": 0.5 - math.log(0.5) - 1, "k3": 0.5 - math.log(0.5) - 1}
    assert set(expected) == set(KL_PENALTY_TYPES)
    for name, value in expected.items():
        _close(kl_penalty(logp, ref, name), [[value]])
    # swapped: log-ratio -log 2, r = 2 -> k3 = 2 - log 2 - 1
    _close(kl_penalty(ref, logp, "k1"), [[-ln2]])
    _close(kl_penalty(ref, logp, "abs"), [[ln2]])
    _close(kl_penalty(ref, logp, "k3"), [[1 - ln2]])


def test_k3_is_nonnegative_and_clamped(gen: torch.Generator) -> None:
    logp = torch.randn(50, 20, generator=gen) * 5
    ref = torch.randn(50, 20, generator=gen) * 5
    assert torch.all(kl_penalty(logp, ref, "low_var_kl") >= 0)
    # ref - logp = 5: exp(5) - 6 = 142.4 -> clamped to 10; ref - logp = 1000 stays finite
    big = kl_penalty(torch.zeros(1, 2), torch.tensor([[5.0, 1000.0]]), "k3")
    assert torch.equal(big, torch.full((1, 2), 10.0))


def test_kl_penalty_rejects_full_and_unknown_names() -> None:
    x = torch.zeros(1, 1)
    for bad in ("full", "k4"):
        with pytest.raises(ValueError, match="low_var_kl"):
            kl_penalty(x, x, bad)


def test_adaptive_kl_controller_moves_beta_within_bound() -> None:
    # err = clip(kl / 0.1 - 1, -0.2, 0.2); beta *= 1 + err * n_steps / horizon
    above = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=100)
    above.update(current_kl=0.5, n_steps=10)  # err clipped to +0.2 -> * 1.02
    assert above.value == pytest.approx(0.102)
    below = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=100)
    below.update(current_kl=0.0, n_steps=10)  # err -1 clipped to -0.2 -> * 0.98
    assert below.value == pytest.approx(0.098)
    near = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=100)
    near.update(current_kl=0.11, n_steps=10)  # err 0.1 -> * 1.01
    assert near.value == pytest.approx(0.101)
    with pytest.raises(ValueError, match="horizon=0"):
        AdaptiveKLController(0.1, 0.1, horizon=0)
    with pytest.raises(ValueError, match="target_kl=0"):
        AdaptiveKLController(0.1, target_kl=0.0, horizon=10)


def test_fixed_kl_controller_never_changes() -> None:
    ctrl = FixedKLController(kl_coef=0.05)
    for kl in (0.0, 1.0, 1e6):
        ctrl.update(current_kl=kl, n_steps=1000)
    assert ctrl.value == 0.05


def test_get_kl_controller() -> None:
    assert isinstance(get_kl_controller("fixed", 0.1, 0.1, 10), FixedKLController)
    adaptive = get_kl_controller("adaptive", 0.2, 0.1, 10)
    assert isinstance(adaptive, AdaptiveKLController) and adaptive.value == 0.2
    with pytest.raises(ValueError, match="'pid'.*adaptive"):
        get_kl_controller("pid", 0.1, 0.1, 10)


def test_apply_kl_penalty_subtracts_beta_times_kl(gen: torch.Generator) -> None:
    scores = torch.randn(3, 4, generator=gen, dtype=D)
    old = torch.randn(3, 4, generator=gen, dtype=D)
    ref = torch.randn(3, 4, generator=gen, dtype=D)
    mask = _padded_mask([4, 2, 3], 4)
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.01, horizon=100)
    rewards, metrics = apply_kl_penalty(scores, old, ref, mask, ctrl, kl_penalty_type="kl")
    kl = (old - ref) * mask
    _close(rewards, scores - 0.1 * kl)
    per_seq = torch.stack([kl[i, :n].mean() for i, n in enumerate([4, 2, 3])])
    assert set(metrics) == {"actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff"}
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(per_seq.mean().item())
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1  # the beta used, before the update
    err = float(np.clip(per_seq.mean().item() / 0.01 - 1, -0.2, 0.2))
    assert ctrl.value == pytest.approx(0.1 * (1 + err * 3 / 100))


# ------------------------------------------------------------------------------------------------------
# filters, schedules, registry
# ------------------------------------------------------------------------------------------------------


def test_kl_threshold_mask() -> None:
    kl = torch.tensor([[0.1, 0.5, 2.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    out = kl_threshold_mask(kl, mask, threshold=0.5)
    assert torch.equal(out, torch.tensor([[1.0, 1.0, 0.0, 0.0]])) and out.dtype == mask.dtype
    out_bool = kl_threshold_mask(kl, mask.bool(), threshold=0.5)
    assert out_bool.dtype == torch.bool and out_bool.tolist() == [[True, True, False, False]]
    assert torch.equal(kl_threshold_mask(kl, mask, threshold=None), mask)


def test_dynamic_gamma_boundaries() -> None:
    assert dynamic_gamma(0.99, 0.9, reward_var=0.5, var_threshold=1.0) == 0.99
    assert dynamic_gamma(0.99, 0.9, reward_var=1.0, var_threshold=1.0) == 0.99
    assert dynamic_gamma(0.99, 0.9, reward_var=1.5, var_threshold=1.0) == pytest.approx(0.945)
    assert dynamic_gamma(0.99, 0.9, reward_var=2.0, var_threshold=1.0) == pytest.approx(0.9)
    assert dynamic_gamma(0.99, 0.9, reward_var=50.0, var_threshold=1.0) == pytest.approx(0.9)
    with pytest.raises(ValueError, match="min_gamma"):
        dynamic_gamma(0.9, 0.95, reward_var=1.0, var_threshold=1.0)
    with pytest.raises(ValueError, match="var_threshold=0"):
        dynamic_gamma(0.99, 0.9, reward_var=1.0, var_threshold=0.0)


def test_adv_estimator_registry() -> None:
    assert set(ADV_ESTIMATORS) == {"gae", "grpo"}
    assert get_adv_estimator("gae") is compute_gae_advantage_return
    assert get_adv_estimator("grpo") is compute_grpo_outcome_advantage
    with pytest.raises(ValueError, match="'rloo'.*gae.*grpo"):
        get_adv_estimator("rloo")


def test_public_names_are_exported() -> None:
    assert all(hasattr(algos, name) for name in algos.__all__)
