"""The memory pre-flight of ``verl_core`` trials (``hpo/backends/verl_core/_memory.py``): the trainer's own estimate of
a config (arithmetic on the config, no torch, no weights) against the trial's budget (on the CPU the available memory
lowered to ``trial.memory_limit_gb``), each corner of the space estimated, and ``validate``'s verdict: 0 when every
corner fits, else 2 with one line naming the first that does not."""

from __future__ import annotations

import dataclasses
import io

import pytest

from hpo.backends import load_space
from hpo.backends.verl_core._memory import corner_predictions, predict, validate_corners
from hpo.experiment import Space, SpaceError

GiB = 2**30


def capped(space: Space, gb: float) -> Space:
    return dataclasses.replace(space, trial=dataclasses.replace(space.trial, memory_limit_gb=gb))


def test_a_config_s_estimate_against_the_trial_s_budget() -> None:
    space = load_space("kl_lr")  # trial.memory_limit_gb: 3.0, CPU trials
    pred = predict(space, space.trainer_overrides({"kl_coef": 0.1, "actor_lr": 1e-5}))
    assert pred.fits and pred.device == "cpu" and 0 < pred.total < pred.budget <= 3 * GiB
    assert pred.budget_source == "trial.memory_limit_gb=3.0" and "TOTAL (peak)" in pred.table
    tight = predict(capped(space, 0.05), space.trainer_overrides({}))
    assert not tight.fits and tight.budget == int(0.05 * GiB) and tight.problem
    with pytest.raises(SpaceError, match=r"memory estimate: .*data.train_batch_size=7"):
        predict(space, ["data.train_batch_size=7"])


def test_validate_gives_every_corner_and_fails_on_one_that_does_not_fit() -> None:
    space = load_space("kl_lr")
    corners = corner_predictions(space, [])
    assert len(corners) == 4 and all(pred.fits for _, pred in corners)
    assert {(c["kl_coef"], c["actor_lr"]) for c, _ in corners} == {(0.01, 1e-07), (0.01, 0.003), (2.0, 1e-07),
                                                                   (2.0, 0.003)}  # each end of each range
    out = io.StringIO()
    assert validate_corners(space, [], out) == 0
    lines = out.getvalue().splitlines()
    assert sum(line.startswith("corner ") and line.endswith(": fits") for line in lines) == 4
    assert lines[-1] == "All checks passed"
    out = io.StringIO()
    assert validate_corners(capped(space, 0.05), [], out) == 2
    assert sum(line.endswith("DOES NOT FIT") for line in out.getvalue().splitlines()) == 4
