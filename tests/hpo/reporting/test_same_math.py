"""The same-math check of a throughput study's picks (:mod:`hpo.reporting._same_math`): strict (relative, to float
noise) where both updates saw the same samples, loose (by the control's spread) where they did not."""

from __future__ import annotations

import pytest

from hpo.reporting._same_math import LOOSE_FLOOR, NOISE_FACTOR, math_disagreements, run_noise


def test_the_control_s_run_to_run_difference_widens_the_same_math_check() -> None:
    """A trainer whose first step does not reproduce at one seed (verl's asynchronous vLLM rollout on the CPU): a
    metric may differ by max(NOISE_FACTOR x the user's own run-to-run difference, LOOSE_FLOOR) of its value, one
    that moved by more than UNCOMPARABLE is not compared, and a change of scale is still caught."""
    base = {"actor/grad_norm": 4.0, "critic/score/mean": 0.2, "actor/pg_loss": 0.01}
    control = {"actor/grad_norm": 4.8, "critic/score/mean": 0.2, "actor/pg_loss": -0.02}
    rel = run_noise(base, control)
    assert rel["actor/grad_norm"] == pytest.approx(0.2) and rel["critic/score/mean"] == 0.0
    near = {"actor/grad_norm": 4.0 * (1 + max(NOISE_FACTOR * 0.2, LOOSE_FLOOR)) - 0.01, "critic/score/mean": 0.2,
            "actor/pg_loss": 0.5}  # pg_loss moved 300% in the control: not compared
    assert math_disagreements(near, base, 0.0, rel) == []
    far = {**near, "actor/grad_norm": 4.0 * 5}  # a loss-aggregation switch: a different scale
    assert math_disagreements(far, base, 0.0, rel) == ["actor/grad_norm 20 vs 4"]
    assert math_disagreements(near, base, 0.02, {m: 0.0 for m in rel})  # reproducible: strict again


def test_the_same_math_check_names_each_metric_that_differs() -> None:
    base = {"step": 1, "actor/pg_loss": -0.0172, "actor/grad_norm": 4.9069, "critic/score/mean": 0.156}
    same = {"step": 1, "actor/pg_loss": -0.01721, "actor/grad_norm": 4.90691, "critic/score/mean": 0.156}
    assert math_disagreements(same, base, 0.02) == []
    other = {**same, "actor/grad_norm": 5.5}  # 12% off: beyond 2% of |4.9|
    assert math_disagreements(other, base, 0.02) == ["actor/grad_norm 5.5 vs 4.9069"]
    missing = {k: v for k, v in same.items() if k != "actor/pg_loss"}
    assert math_disagreements(missing, base, 0.02) == ["actor/pg_loss logged by your config only"]
    assert math_disagreements({**same, "actor/pg_loss": 0.009}, base, 0.02)  # relative: 0.026 > 2% of 0.0172


def test_a_replayed_pair_is_checked_strictly_whatever_the_control_says() -> None:
    """Both runs updated on one recorded first rollout (issue 54 item 1): each metric within 1e-3 of its value
    (absolute below 1), the policy loss included; real verl's pair of micro-batches 4 and 64 on one replayed rollout
    (pg_loss 6.25e-05 vs -8.9e-09: bf16 log-probs around a cancellation) passes, a 10% change of the gradient norm,
    the policy loss or the score does not, even where the control (sampled) moved by 30%."""
    base = {"step": 1, "actor/pg_loss": -0.0172, "actor/grad_norm": 4.9069, "critic/score/mean": 0.156,
            "actor/kl_loss": 0.0}
    noise = {"actor/grad_norm": 0.3, "actor/pg_loss": 2.0}  # a sampled control: loose for unreplayed pairs
    float_noise = {k: v * (1 + 3e-7) + 1e-8 for k, v in base.items() if k != "step"} | {"step": 1}
    assert math_disagreements(float_noise, base, 1e-3, noise, replayed=True) == []
    for metric in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean"):
        ten = {**base, metric: base[metric] * 1.1}
        assert math_disagreements(ten, base, 1e-3, noise, replayed=True) == [
            f"{metric} {ten[metric]:.6g} vs {base[metric]:.6g}"], metric
    assert math_disagreements({**base, "actor/grad_norm": 4.9069 * 1.1}, base, 1e-3, noise) == []  # loose: passes
    verl = {"step": 1, "actor/pg_loss": 6.254203617572784e-05, "actor/grad_norm": 4.215731620788574}
    assert math_disagreements({**verl, "actor/pg_loss": -8.87729e-09}, verl, 1e-3, replayed=True) == []
    assert math_disagreements({**verl, "actor/pg_loss": 2e-3}, verl, 1e-3, replayed=True)  # beyond 1e-3 absolute
