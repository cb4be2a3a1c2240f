"""The PBT benchmark's schedule task (``benchmarks/pbt.py``, task ``late_noise``): ``builtin:arith`` whose training
reward is exact for the first ``CLEAN_STEPS`` (8) trainer steps and then a coin flip (each 0/1 score flipped with
probability ``FLIP`` = 0.5, so it says nothing about the answer), a reward function in verl's contract
(``custom_reward_function.path``).

Why a schedule should beat every constant here: while the reward is clean a large learning rate is what gets the
policy off the ground in a few steps; once it turns noisy (a reward model that was reliable on the initial policy's
outputs and is worthless on the trained policy's: over-optimisation taken to its end) every step follows the noise
and the policy drifts off what it learned, the faster the larger the rate. Any constant pays on one side: a large
one learns in time and then loses it, a small one never learns it in time. A schedule, large for the clean steps
and near zero after them, keeps both. Measured in ``benchmarks/RESULTS.md`` ("population-based training"). With 4
clean steps instead of 8 (the first benchmark run's choice) only a member or trial that starts in the narrow
fast-learning region learns at all (PBT's seed 0 found none and ended at 0.12); 8 leave PBT one exploit inside the
clean phase.

Validation and test rows (``extra_info.split`` other than ``train``) are scored exactly. The step comes from the
trainer's own argv (``python -m verl_core train``): the step a run resumes from (``trainer.resume_from_path=
.../global_step_<N>``) plus the training rows scored so far in this process over the rows of one step
(``data.train_batch_size`` x ``actor_rollout_ref.rollout.n``, from the same config and overrides). Flips come from
a ``random.Random`` seeded by the step, so a run (and a run resumed at step N) sees the same flips for a trainer
seed.
"""

from __future__ import annotations

import random
import re
import sys
from typing import Any

from verl_core.rewards import default_compute_score

FLIP = 0.5  # a coin: no signal left
CLEAN_STEPS = 8

_state: dict[str, Any] = {}


def _run_shape() -> tuple[int, int]:
    """(step this process started from, training rows per step), from the trainer's argv."""
    from verl_core.cli import _parser  # the trainer's own argv parser: the same config and overrides it read
    from verl_core.config import load_config

    args = _parser().parse_args(sys.argv[1:])
    cfg = load_config(args.config, args.overrides)
    start = 0
    if cfg.trainer.resume_mode == "resume_path" and cfg.trainer.resume_from_path:
        m = re.search(r"global_step_(\d+)", str(cfg.trainer.resume_from_path))
        start = int(m.group(1)) if m else 0
    return start, int(cfg.data.train_batch_size) * int(cfg.actor_rollout_ref.rollout.n)


def current_step() -> int:
    """The trainer step whose rollouts are being scored (1-based)."""
    if "shape" not in _state:
        _state["shape"], _state["rows"] = _run_shape(), 0
    start, per_step = _state["shape"]
    return start + _state["rows"] // per_step + 1


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """The exact score; on training rows after ``CLEAN_STEPS`` steps, flipped with probability ``FLIP``."""
    score = float(default_compute_score(data_source, solution_str, ground_truth, extra_info))
    if (extra_info or {}).get("split") != "train":
        return score
    step = current_step()
    _state["rows"] += 1
    if step <= CLEAN_STEPS:
        return score
    rng = _state.get("rng")
    if rng is None or _state.get("rng_step") != step:
        rng = _state["rng"] = random.Random(f"late-noise:{step}")
        _state["rng_step"] = step
    return 1.0 - score if rng.random() < FLIP else score
