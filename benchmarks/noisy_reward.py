"""The PBT benchmark's task variant (``benchmarks/pbt.py``, task ``noisy``): ``builtin:arith`` with a noisy reward
on training rollouts, a reward function in verl's contract (``custom_reward_function.path``).

Each training rollout's 0/1 score is flipped with probability ``FLIP`` (a reward model that is wrong 40% of the
time, unbiased: right and wrong answers are flipped alike); validation and test rows (``extra_info.split`` other
than ``train``) are scored exactly. The expected advantage keeps its sign but shrinks to ``1 - 2 * FLIP`` = 0.2 of
the clean one, while the variance of a batch's gradient grows: a learning rate large enough to move the policy in
a few steps then holds it at a noise floor, and one small enough to average the noise out is slow. It was built as
the regime where a schedule (large first, then small) should beat every constant, but measured it is not: a small
constant with a weak KL (lr 5e-5, kl_coef 0.01: 0.627 at step 20 on trainer seed 1) beat every large-then-small
schedule tried (0.51-0.58). ``benchmarks/late_noise_reward.py`` is the variant where a schedule does win.

Flips come from one ``random.Random`` per trainer process, seeded the same way every time, so a run is
deterministic for a trainer seed.
"""

from __future__ import annotations

import random
from typing import Any

from verl_core.rewards import default_compute_score

FLIP = 0.4
_rng = random.Random(12345)


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """The exact score, flipped with probability ``FLIP`` on training rows."""
    score = float(default_compute_score(data_source, solution_str, ground_truth, extra_info))
    if (extra_info or {}).get("split") == "train" and _rng.random() < FLIP:
        return 1.0 - score
    return score
