"""PPO / GRPO math as pure tensor functions.

Everything the trainer needs to turn rollouts into losses lives here, in the spirit of verl's
``verl/trainer/ppo/core_algos.py`` (https://github.com/volcengine/verl): masked statistics, advantage
estimators (GAE, GRPO), the clipped policy and value losses, KL estimators and KL controllers.
Nothing here does I/O or reads a config object: callers pass plain tensors and numbers.

Conventions:
    * ``bs`` is the number of sequences, ``T`` the (padded) response length, ``V`` the vocabulary size.
    * A ``mask`` / ``response_mask`` has shape ``(bs, T)``; 1 (or True) marks a real response token,
      0 marks padding. Float and bool masks are both accepted.
    * Functions never produce NaN from an all-zero mask: masked means of nothing are 0.

Variants are picked by name: ``get_adv_estimator`` for advantage estimators, ``kl_penalty`` for KL
estimators, ``agg_loss`` for loss aggregation, ``get_kl_controller`` for the KL coefficient schedule.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "ADV_ESTIMATORS", "KL_CTRL_TYPES", "KL_PENALTY_TYPES", "LOSS_AGG_MODES", "AdaptiveKLController",
    "FixedKLController", "agg_loss", "apply_kl_penalty", "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage", "compute_policy_loss", "compute_value_loss", "dynamic_gamma",
    "entropy_from_logits", "get_adv_estimator", "get_kl_controller", "kl_penalty", "kl_threshold_mask",
    "logprobs_from_logits", "loss_normalizer", "masked_mean", "masked_sum", "masked_var", "masked_whiten",
]

KL_PENALTY_TYPES: tuple[str, ...] = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
LOSS_AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
KL_CTRL_TYPES: tuple[str, ...] = ("fixed", "adaptive")


# ---------------------------------------------------------------------------------------------------------
# Masked statistics (verl/utils/torch_functional.py; TRL's masked_mean / masked_whiten)
# ---------------------------------------------------------------------------------------------------------


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``sum(values * mask)`` over ``dim`` (all elements when ``dim`` is None).

    Positions where ``mask == 0`` are dropped before multiplying, so NaN/inf padding cannot leak in.
    Shapes: ``values`` and ``mask`` broadcastable, typically ``(bs, T)``.
    """
    m = mask.to(values.dtype)
    kept = torch.where(mask != 0, values, torch.zeros_like(values)) * m
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``sum(values * mask) / sum(mask)`` over ``dim``; 0 (not NaN) where ``sum(mask) == 0``.

    verl adds 1e-8 to the denominator; here the denominator is replaced by 1 when it is 0, which gives
    the same 0 for empty masks and the exact mean otherwise. Shapes: ``(bs, T)`` -> scalar or reduced.
    """
    count = mask.to(values.dtype)
    count = count.sum() if dim is None else count.sum(dim=dim)
    safe = torch.where(count > 0, count, torch.ones_like(count))
    return masked_sum(values, mask, dim) / safe


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the masked entries (a 0-dim tensor), Bessel-corrected when ``unbiased``.

    ``var = masked_mean((v - masked_mean(v))^2) * n / (n - 1)`` with ``n = sum(mask)``, as in verl.
    Where verl raises for ``n <= 1``, this returns the uncorrected value instead (0 for ``n`` in {0, 1}),
    so a batch with a single valid token cannot crash the trainer. Shapes: ``(bs, T)`` -> ``()``.
    """
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = mask.to(values.dtype).sum()
        var = var * torch.where(n > 1, n / (n - 1).clamp(min=1), torch.ones_like(n))
    return var


def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """``(v - mean) * rsqrt(var + 1e-8)`` with masked mean and (unbiased) variance; ``+ mean`` back if not
    ``shift_mean``. Every position is transformed (padding too, as in verl); an all-zero mask gives zeros.

    Shapes: ``(bs, T)`` -> ``(bs, T)``.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    has_data = mask.to(values.dtype).sum() > 0
    return torch.where(has_data, whitened, torch.zeros_like(whitened))


# ---------------------------------------------------------------------------------------------------------
# Advantage estimators
# ---------------------------------------------------------------------------------------------------------


def compute_gae_advantage_return(
    token_level_rewards: Tensor, values: Tensor, response_mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2016, https://arxiv.org/abs/1506.02438).

    Reverse recursion over tokens, with ``V_{T} = 0`` and ``A_{T} = 0``::

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}

    As in verl, masked (padding) positions are skipped: there the "next value" and "last advantage"
    carried into earlier tokens stay those of the next valid token, so rewards and values sitting at
    masked positions do not change any result at valid positions. ``returns = A + V`` (before whitening);
    the advantages are then whitened over the mask and zeroed at padding.

    Shapes: ``token_level_rewards``, ``values``, ``response_mask`` are ``(bs, T)``.
    Returns: ``(advantages, returns)``, each ``(bs, T)``.
    """
    with torch.no_grad():
        valid = response_mask != 0
        next_value = torch.zeros_like(values[:, 0])  # (bs,)
        last_gae = torch.zeros_like(values[:, 0])  # (bs,)
        reversed_adv = []
        for t in reversed(range(token_level_rewards.shape[-1])):
            delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
            gae = delta + gamma * lam * last_gae
            # padding: carry the next valid token's value and advantage through unchanged
            next_value = torch.where(valid[:, t], values[:, t], next_value)
            last_gae = torch.where(valid[:, t], gae, last_gae)
            reversed_adv.append(last_gae)
        advantages = torch.stack(reversed_adv[::-1], dim=1)  # (bs, T)
        returns = advantages + values
        advantages = masked_whiten(advantages, response_mask) * response_mask.to(advantages.dtype)
    return advantages, returns


def _group_ids(index: Sequence[Hashable] | np.ndarray | Tensor, device: torch.device) -> tuple[Tensor, int]:
    """Map group keys (prompt uids) to dense ids ``0..G-1``: ``(bs,)`` long tensor and ``G``."""
    if isinstance(index, Tensor):
        uniques, inverse = torch.unique(index.flatten(), return_inverse=True)
        return inverse.to(device), int(uniques.numel())
    keys = np.asarray(index)
    if keys.ndim != 1:  # e.g. tuples as keys: fall back to an object array of the keys themselves
        keys = np.empty(len(index), dtype=object)
        keys[:] = list(index)
    uniques_np, inverse_np = np.unique(keys, return_inverse=True)
    return torch.as_tensor(inverse_np.reshape(-1), dtype=torch.long, device=device), len(uniques_np)


def compute_grpo_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: Sequence[Hashable] | np.ndarray | Tensor,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[Tensor, Tensor]:
    """GRPO outcome advantage (DeepSeekMath, https://arxiv.org/abs/2402.03300), vectorized over groups.

    With ``s_i = sum_t r_{i,t}`` and group ``g`` = the responses sharing ``index[i]`` (the prompt uid)::

        A_i = (s_i - mean_g) / (std_g + epsilon)    if norm_adv_by_std_in_grpo
        A_i =  s_i - mean_g                         otherwise (Dr. GRPO, https://arxiv.org/abs/2503.20783)

    ``std_g`` is unbiased (as ``torch.std``); a group of size 1 uses ``mean = 0, std = 1`` like verl.
    ``A_i`` is broadcast over the tokens of response ``i`` and multiplied by the mask.

    Shapes: ``token_level_rewards``, ``response_mask`` ``(bs, T)``; ``index`` has ``bs`` keys.
    Returns: ``(advantages, returns)``, both ``(bs, T)`` and equal.
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)  # (bs,)
        assert len(index) == scores.shape[0], f"index has {len(index)} keys for {scores.shape[0]} sequences"
        gid, n_groups = _group_ids(index, scores.device)  # (bs,), G
        counts = torch.bincount(gid, minlength=n_groups).to(scores.dtype)  # (G,)
        mean = scores.new_zeros(n_groups).index_add_(0, gid, scores) / counts  # (G,)
        sq_dev = scores.new_zeros(n_groups).index_add_(0, gid, (scores - mean[gid]) ** 2)
        std = torch.sqrt(sq_dev / (counts - 1).clamp(min=1))  # unbiased, (G,)
        single = counts == 1
        mean = torch.where(single, torch.zeros_like(mean), mean)
        std = torch.where(single, torch.ones_like(std), std)
        adv = scores - mean[gid]
        if norm_adv_by_std_in_grpo:
            adv = adv / (std[gid] + epsilon)
        advantages = adv.unsqueeze(-1) * response_mask.to(adv.dtype)  # (bs, T)
    return advantages, advantages


ADV_ESTIMATORS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "gae": compute_gae_advantage_return,
    "grpo": compute_grpo_outcome_advantage,
}


def get_adv_estimator(name: str) -> Callable[..., tuple[Tensor, Tensor]]:
    """Advantage estimator registered under ``name`` (see ``ADV_ESTIMATORS``)."""
    if name not in ADV_ESTIMATORS:
        raise ValueError(f"Unknown advantage estimator {name!r}; valid names: {sorted(ADV_ESTIMATORS)}.")
    return ADV_ESTIMATORS[name]


# ---------------------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------------------


def agg_loss(
    loss_mat: Tensor, loss_mask: Tensor, loss_agg_mode: str = "token-mean", normalizer: float | None = None
) -> Tensor:
    """Reduce a per-token loss ``(bs, T)`` to a scalar.

    * ``"token-mean"``: ``sum(l * m) / sum(m)``; with ``normalizer``: ``sum(l * m) / normalizer``.
    * ``"seq-mean-token-sum"``: per sequence ``sum_t(l * m)``, then mean over the sequences that have at
      least one token in the mask (or sum / normalizer).
    * ``"seq-mean-token-mean"``: per sequence ``sum_t(l * m) / sum_t(m)``, then mean over the same
      sequences (or sum / normalizer).

    Fully masked rows are left out of the ``seq-mean-*`` denominators, as in verl: padding rows do not
    dilute the loss. ``normalizer`` lets micro-batch losses add up to the mini-batch loss: pass the
    mini-batch's ``loss_normalizer``. Modes as in verl's ``agg_loss``.
    """
    if normalizer is not None and not normalizer > 0:
        raise ValueError(f"normalizer must be positive, but got {normalizer=}.")
    if loss_agg_mode == "token-mean":
        if normalizer is None:
            return masked_mean(loss_mat, loss_mask)
        return masked_sum(loss_mat, loss_mask) / normalizer
    if loss_agg_mode == "seq-mean-token-sum":
        seq_losses = masked_sum(loss_mat, loss_mask, dim=-1)  # (bs,)
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_losses = masked_mean(loss_mat, loss_mask, dim=-1)  # (bs,)
    else:
        raise ValueError(f"Invalid loss_agg_mode {loss_agg_mode!r}; valid modes: {LOSS_AGG_MODES}.")
    if normalizer is None:
        return masked_mean(seq_losses, (loss_mask != 0).any(dim=-1))  # fully masked rows: 0 and not counted
    return seq_losses.sum() / normalizer


def loss_normalizer(loss_mask: Tensor, loss_agg_mode: str = "token-mean") -> float:
    """The denominator ``agg_loss`` divides a whole (mini-)batch by, to pass as ``normalizer`` for its parts.

    ``token-mean``: ``sum(mask)``; ``seq-mean-*``: the number of rows with at least one token in the mask.
    At least 1, so an empty batch gives a zero loss. Shapes: ``(bs, T)`` -> float.
    """
    if loss_agg_mode == "token-mean":
        count = (loss_mask != 0).sum()
    elif loss_agg_mode in LOSS_AGG_MODES:
        count = (loss_mask != 0).any(dim=-1).sum()
    else:
        raise ValueError(f"Invalid loss_agg_mode {loss_agg_mode!r}; valid modes: {LOSS_AGG_MODES}.")
    return float(max(int(count), 1))


def compute_policy_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    normalizer: float | None = None,
    token_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Clipped PPO surrogate (https://arxiv.org/abs/1707.06347) with dual clip
    (https://arxiv.org/abs/1912.09729), as verl's vanilla policy loss::

        ratio = exp(clamp(logp - old_logp, -20, 20))
        L     = max(-A * ratio, -A * clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high))
        L     = min(L, -A * clip_ratio_c)      where A < 0 (dual clip)
        pg_loss = agg_loss(L * token_mask, response_mask)

    ``token_mask`` (default ``response_mask``) is the subset of response tokens that enter the loss, e.g.
    after the KL-threshold filter: the others add 0 to the sum but still count in the denominator, so the
    loss is normalized the same way with or without a filter and the kept tokens are not up-weighted.

    Shapes: all inputs ``(bs, T)``. Returns 0-dim tensors ``(pg_loss, pg_clipfrac, ppo_kl,
    pg_clipfrac_lower)``: ``pg_clipfrac`` is the fraction of ``token_mask`` tokens where the ratio clip was
    active, ``pg_clipfrac_lower`` where the dual clip was active; ``ppo_kl`` is the mean over ``token_mask`` of
    ``old_logp - logp`` (k1 estimate of KL(old || new)).
    """
    assert clip_ratio_c > 1.0, f"clip_ratio_c (dual-clip bound) must be > 1.0, but got {clip_ratio_c=}."
    mask = response_mask.to(log_prob.dtype)
    keep = mask if token_mask is None else token_mask.to(log_prob.dtype)
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)  # for stability
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = masked_mean(-negative_approx_kl, keep)

    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clipped_losses = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).to(mask.dtype), keep)

    pg_losses3 = -advantages * clip_ratio_c
    negative_adv = advantages < 0
    dual_clipped = torch.gt(clipped_losses, pg_losses3) & negative_adv
    pg_clipfrac_lower = masked_mean(dual_clipped.to(mask.dtype), keep)
    pg_losses = torch.where(negative_adv, torch.minimum(clipped_losses, pg_losses3), clipped_losses)

    kept_losses = torch.where(keep != 0, pg_losses, torch.zeros_like(pg_losses))  # filtered tokens: 0
    pg_loss = agg_loss(kept_losses, mask, loss_agg_mode, normalizer)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


def compute_value_loss(
    vpreds: Tensor,
    returns: Tensor,
    values: Tensor,
    response_mask: Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    normalizer: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Clipped value loss (PPO2 / TRL, as verl)::

        vpred_clipped = clip(vpreds, values - cliprange_value, values + cliprange_value)
        vf_loss       = 0.5 * agg(max((vpreds - R)^2, (vpred_clipped - R)^2))

    Shapes: all inputs ``(bs, T)``. Returns 0-dim ``(vf_loss, vf_clipfrac)``; ``vf_clipfrac`` is the masked
    fraction of tokens where the clipped term was larger.
    """
    mask = response_mask.to(vpreds.dtype)
    vpred_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    vf_losses1 = (vpreds - returns) ** 2
    vf_losses2 = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(vf_losses1, vf_losses2), mask, loss_agg_mode, normalizer)
    vf_clipfrac = masked_mean(torch.gt(vf_losses2, vf_losses1).to(mask.dtype), mask)
    return vf_loss, vf_clipfrac


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the categorical ``softmax(logits)``: ``logsumexp(l) - sum(softmax(l) * l)``.

    Shapes: ``(bs, T, V)`` -> ``(bs, T)``.
    """
    probs = F.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(probs * logits, dim=-1)


def logprobs_from_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """``log_softmax(logits)[..., labels]``: log-probability of each label token.

    Shapes: ``logits (bs, T, V)``, ``labels (bs, T)`` long -> ``(bs, T)``.
    """
    logp = F.log_softmax(logits, dim=-1)
    return logp.gather(dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)


# ---------------------------------------------------------------------------------------------------------
# KL: estimators, controllers, reward penalty
# ---------------------------------------------------------------------------------------------------------


def kl_penalty(logprob: Tensor, ref_logprob: Tensor, kl_penalty: str) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled-token log-probs
    (J. Schulman, "Approximating KL divergence", http://joschu.net/blog/kl-approx.html)::

        "kl"  / "k1":          logp - ref
        "abs":                 |logp - ref|
        "mse" / "k2":          0.5 * (logp - ref)^2
        "low_var_kl" / "k3":   d = clamp(ref - logp, -20, 20);  clamp(exp(d) - d - 1, -10, 10)

    Shapes: ``(bs, T)`` -> ``(bs, T)``. "full" (needs whole distributions) and unknown names raise.
    """
    diff = logprob - ref_logprob
    if kl_penalty in ("kl", "k1"):
        return diff
    if kl_penalty == "abs":
        return diff.abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * diff.square()
    if kl_penalty in ("low_var_kl", "k3"):
        log_ratio = torch.clamp(-diff, min=-20.0, max=20.0)  # log(ref / p), clamped for stability
        return torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, min=-10.0, max=10.0)
    raise ValueError(f"Unsupported kl_penalty {kl_penalty!r}; valid names: {KL_PENALTY_TYPES}.")


class FixedKLController:
    """Constant KL coefficient: ``value`` never changes."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (same interface as ``AdaptiveKLController.update``)."""


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, https://arxiv.org/abs/1909.08593)::

        err   = clip(current_kl / target_kl - 1, -0.2, 0.2)
        beta *= 1 + err * n_steps / horizon
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if not target_kl > 0:
            raise ValueError(f"target_kl must be positive, but got {target_kl=}.")
        if not horizon > 0:
            raise ValueError(f"horizon must be positive, but got {horizon=}.")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move ``value`` towards keeping ``current_kl`` at the target; ``n_steps`` = samples this batch."""
        err = float(np.clip(current_kl / self.target - 1.0, -0.2, 0.2))
        self.value *= 1.0 + err * n_steps / self.horizon


def get_kl_controller(
    kl_ctrl_type: str, kl_coef: float, target_kl: float, horizon: int
) -> FixedKLController | AdaptiveKLController:
    """Build the KL controller named ``kl_ctrl_type`` (one of ``KL_CTRL_TYPES``)."""
    if kl_ctrl_type == "fixed":
        return FixedKLController(kl_coef)
    if kl_ctrl_type == "adaptive":
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"Unknown kl_ctrl_type {kl_ctrl_type!r}; valid types: {KL_CTRL_TYPES}.")


def apply_kl_penalty(
    token_level_scores: Tensor,
    old_log_prob: Tensor,
    ref_log_prob: Tensor,
    response_mask: Tensor,
    kl_ctrl: FixedKLController | AdaptiveKLController,
    kl_penalty_type: str = "kl",
) -> tuple[Tensor, dict[str, float]]:
    """KL-in-reward (verl ``ray_trainer.apply_kl_penalty``)::

        rewards_t = scores_t - beta * kl_t * mask_t

    ``beta = kl_ctrl.value`` before this call; ``current_kl`` = mean over sequences of the per-sequence
    masked mean KL, then ``kl_ctrl.update(current_kl, n_steps=bs)``.

    Shapes: all tensors ``(bs, T)``. Returns ``(token_level_rewards, metrics)`` with metrics
    ``actor/reward_kl_penalty`` (current_kl) and ``actor/reward_kl_penalty_coeff`` (beta used).
    """
    mask = response_mask.to(old_log_prob.dtype)
    kld = kl_penalty(old_log_prob, ref_log_prob, kl_penalty_type) * mask  # (bs, T)
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = float(masked_mean(kld, mask, dim=-1).mean().item())
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    return token_level_rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


def kl_threshold_mask(kl: Tensor, response_mask: Tensor, threshold: float | None) -> Tensor:
    """Drop tokens whose per-token KL exceeds ``threshold``: ``mask * (kl <= threshold)``.

    Shapes: ``(bs, T)`` -> ``(bs, T)`` with the dtype of ``response_mask``; ``threshold=None`` -> unchanged.
    """
    if threshold is None:
        return response_mask
    return torch.where(kl > threshold, torch.zeros_like(response_mask), response_mask)


def dynamic_gamma(gamma: float, min_gamma: float, reward_var: float, var_threshold: float) -> float:
    """Discount that shrinks as the rolling reward variance grows::

        reward_var <= var_threshold:  gamma
        otherwise:                    gamma - (gamma - min_gamma) * min(1, (reward_var - thr) / thr)

    so the discount reaches ``min_gamma`` at twice the threshold and stays there.
    """
    if not min_gamma <= gamma:
        raise ValueError(f"min_gamma must be <= gamma, but got {min_gamma=} and {gamma=}.")
    if not var_threshold > 0:
        raise ValueError(f"var_threshold must be positive, but got {var_threshold=}.")
    if reward_var <= var_threshold:
        return gamma
    frac = min(1.0, (reward_var - var_threshold) / var_threshold)
    return gamma - (gamma - min_gamma) * frac
