"""One trial's live state (``hpo/study/_watch.py``), one metrics line at a time, on an asked trial of a real Optuna
study: each evaluation reported (a re-logged step once), the objective's value, and the stop each rule decides: the
pruner, the plateau rule, a small spread at a good value (converged) or a poor one (collapsed), the diagnosis; and
the trainer time a stop saved."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import optuna
import pytest

from hpo.analysis import Diagnoser
from hpo.backends import backend_of, load_space
from hpo.study._watch import Watch
from tests.hpo.conftest import fake_space

OBJ, STD = "eval/reward_mean", "eval/reward_std"


def watch_of(tmp_path: Path, of: optuna.Study | None = None, diagnoser: Diagnoser | None = None,
             **sections: Any) -> tuple[Watch, list[tuple[int, float]]]:
    """A Watch of a new trial of study ``of`` (a new maximizing one by default) for the fake experiment with
    ``sections``, and the evaluations it hands on."""
    space = load_space(str(fake_space(tmp_path, **sections)), check=False)
    study = of or optuna.create_study(direction="maximize")
    seen: list[tuple[int, float]] = []
    return Watch(study.ask(), space, 10, lambda step, value: seen.append((step, value)), diagnoser), seen


def feed(watch: Watch, lines: list[tuple[int, dict[str, Any]]]) -> list[str | None]:
    return [watch(step, data) for step, data in lines]


def test_each_evaluation_is_reported_once_and_the_value_is_the_last(tmp_path: Path) -> None:
    watch, seen = watch_of(tmp_path)
    lines = [(0, {OBJ: 0.1, STD: 0.3}), (1, {"actor/pg_loss": 0.2}), (2, {OBJ: 0.4, STD: 0.3}),
             (2, {OBJ: 0.9, STD: 0.3}), (4, {OBJ: 0.5, STD: 0.3})]  # step 2 again: a resumed trainer re-logs it
    assert feed(watch, lines) == [None] * 5
    assert seen == [(0, 0.1), (2, 0.4), (4, 0.5)]
    assert watch.value == 0.5 and watch.history == [[0.1], [0.4], [0.5]]
    assert watch.trial.study.trials[0].intermediate_values == {0: 0.1, 2: 0.4, 4: 0.5}
    watch(6, {OBJ: math.nan})
    assert math.isnan(watch.value) and watch.scored is None  # not a value to tell


def test_a_plateau_stops_the_trial_once_the_last_evaluations_beat_nothing_before_them(tmp_path: Path) -> None:
    watch, _ = watch_of(tmp_path, early_stopping={"enabled": True, "plateau_evals": 2, "plateau_min_delta": 0.01})
    decisions = feed(watch, [(0, {OBJ: 0.2}), (2, {OBJ: 0.6}), (4, {OBJ: 0.605}), (6, {OBJ: 0.58})])
    assert decisions == [None, None, None, "plateau"]  # 0.605 is within 0.01 of 0.6: no improvement that counts


@pytest.mark.parametrize(("objective", "decision"), [(0.8, "converged"), (0.2, "collapsed")])
def test_a_small_spread_is_convergence_at_a_good_value_and_a_collapse_at_a_poor_one(
        tmp_path: Path, objective: float, decision: str) -> None:
    watch, _ = watch_of(tmp_path, early_stopping={"enabled": True, "metric": STD, "threshold": 0.05, "patience": 2,
                                                  "min_value": 0.5})
    lines = [(0, {OBJ: objective, STD: 0.01}), (2, {OBJ: objective, STD: 0.2}),  # the streak starts again
             (4, {OBJ: objective, STD: 0.01}), (6, {OBJ: objective, STD: 0.02})]
    assert feed(watch, lines) == [None, None, None, decision]
    watch.step_times = [2.0, 4.0]
    assert watch.compute_saved_s(6, 100.0) == 12.0  # 4 steps left at 3 s each (the trainer's own step time)


def test_the_pruner_stops_a_trial_below_the_median_and_a_confirmation_run_is_never_pruned(tmp_path: Path) -> None:
    study = optuna.create_study(direction="maximize",
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0))
    for _ in range(2):
        done = study.ask()
        for step in (0, 2, 4):
            done.report(0.9, step)
        study.tell(done, 0.9)
    sections = {"study": {"pruner": {"type": "median", "n_startup_trials": 1, "n_warmup_evals": 1}}}
    watch, _ = watch_of(tmp_path, study, **sections)
    assert feed(watch, [(0, {OBJ: 0.1}), (2, {OBJ: 0.1})]) == [None, "pruned"]  # its first evaluation is warm-up
    confirm, _ = watch_of(tmp_path, study, **sections)
    confirm.prune = False
    assert feed(confirm, [(0, {OBJ: 0.1}), (2, {OBJ: 0.1}), (4, {OBJ: 0.1})]) == [None, None, None]


def test_the_diagnosis_stops_a_run_whose_loss_went_nan(tmp_path: Path) -> None:
    space = load_space(str(fake_space(tmp_path)), check=False)
    diagnoser = Diagnoser(space.diagnosis, OBJ, True, backend_of(space).metrics, gpu=False)
    watch, _ = watch_of(tmp_path, diagnoser=diagnoser)
    decisions = feed(watch, [(0, {OBJ: 0.3, "actor/pg_loss": 0.1}), (1, {"actor/pg_loss": math.nan})])
    assert decisions[0] is None and decisions[-1] == "collapsed:nan"
