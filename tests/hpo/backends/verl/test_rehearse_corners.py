"""A rehearsal's corners (``hpo/backends/verl/_rehearse_corners.py``): the default point and every parameter at each
end of its range, each corner's time limit (the flag, ``trial.timeout_s``, else the default), and how many corners
run at once (one at a time on a host without the free cores for two)."""

from __future__ import annotations

import dataclasses

from hpo.backends import load_space
from hpo.backends.verl._rehearse_corners import (
    CORNER_TIMEOUT_S,
    corner_parallelism,
    corner_timeout,
    rehearsal_corners,
)
from tests.hpo.backends.verl.conftest import CPU_SPACE, SPACE_FILE

SPACE = load_space(str(CPU_SPACE), check=False)


def test_corners_are_the_default_point_and_every_parameter_at_each_end() -> None:
    space = load_space(str(SPACE_FILE))
    corners = rehearsal_corners(space)
    assert [c.name for c in corners] == ["default", "low", "high"]
    # no study.baseline: the middle of each range (geometric on a log scale), the middle choice
    assert corners[0].values == {"actor_lr": 1e-6, "kl_coef": 0.025, "temperature": 0.9, "mini_batch": 16}
    assert corners[1].values == {"actor_lr": 1e-7, "kl_coef": 0.0, "temperature": 0.6, "mini_batch": 8}
    assert corners[2].values == {"actor_lr": 1e-5, "kl_coef": 0.05, "temperature": 1.2, "mini_batch": 32}
    assert "actor_rollout_ref.actor.optim.lr=1e-05" in corners[2].overrides


def test_the_corner_limit_follows_the_experiment_and_busy_hosts_run_corners_one_at_a_time() -> None:
    assert corner_timeout(SPACE, 120.0) == (120.0, "--corner-timeout")
    timed = dataclasses.replace(SPACE, trial=dataclasses.replace(SPACE.trial, timeout_s=3600.0))
    assert corner_timeout(timed, None) == (3600.0, "trial.timeout_s")
    untimed = dataclasses.replace(SPACE, trial=dataclasses.replace(SPACE.trial, timeout_s=None))
    assert corner_timeout(untimed, None) == (CORNER_TIMEOUT_S, "the default")
    assert corner_parallelism(2, 0.1)[0] == 2  # a quiet 2-core host: two corners at once
    busy, why = corner_parallelism(2, 2.0)  # two CPU-bound processes beside it
    assert busy == 1 and why.startswith("one at a time: 0.0 of 2 cores free, two corners need 1.5"), why
    assert corner_parallelism(16, 3.0)[0] == 2
