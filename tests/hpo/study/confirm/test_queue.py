"""Queueing confirmation runs (``hpo/study/_confirm/_queue.py``) on real Optuna studies: a run per top trial and fresh
seed (the baseline's on the same seeds) as tagged WAITING trials, only what is missing when queued again (an
interrupted confirmation resumes where it stopped), what is still pending, and what ``study.budget`` keeps for the
confirmation while the search runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from hpo.backends import load_space
from hpo.experiment import Space
from hpo.record import ATTR_BASELINE, ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED
from hpo.study._confirm import confirm_reserve, pending, queue_confirmations
from tests.hpo.conftest import fake_space

optuna.logging.set_verbosity(optuna.logging.WARNING)


def space_of(tmp_path: Path, **study: Any) -> Space:
    return load_space(str(fake_space(tmp_path, overrides={"trainer.total_training_steps": 10, "trainer.seed": 1001},
                                     study=study)), check=False)


def searched(values: list[float]) -> optuna.Study:
    """A maximizing study of finished search trials with these values (x = value / 10)."""
    study = optuna.create_study(direction="maximize")
    for v in values:
        study.add_trial(create_trial(value=v, params={"x": v / 10}, distributions={"x": FloatDistribution(0, 1)}))
    return study


def test_the_top_trials_and_the_baseline_are_queued_on_fresh_seeds_once(tmp_path: Path) -> None:
    space = space_of(tmp_path, baseline={"fake.x": 0.95})
    study = searched([0.2, 0.9, 0.5, 0.7])
    queued = queue_confirmations(study, space, top_k=2, n_seeds=2)
    assert queued == [(1, 1000), (1, 1002), (3, 1000), (3, 1002), (-1, 1000), (-1, 1002)]  # 1001: the tuning seed
    runs = study.trials[4:]
    assert all(t.state == TrialState.WAITING for t in runs) and pending(study) == 6
    assert [(t.system_attrs[ATTR_CONFIRM_OF], t.system_attrs[ATTR_CONFIRM_SEED]) for t in runs] == queued
    assert runs[0].params == study.trials[1].params and runs[2].params == study.trials[3].params
    assert runs[4].params == {} and runs[4].system_attrs[ATTR_BASELINE] is True
    assert queue_confirmations(study, space, top_k=2, n_seeds=2) == []  # nothing missing
    assert queue_confirmations(study, space, top_k=3, n_seeds=2) == [(2, 1000), (2, 1002)]  # a third setting
    assert pending(study) == 8


def test_the_budget_keeps_the_confirmation_s_least_runs(tmp_path: Path) -> None:
    assert confirm_reserve(space_of(tmp_path, confirm={"top_k": 2, "seeds": 3})) == 6
    assert confirm_reserve(space_of(tmp_path, confirm={"top_k": 2, "seeds": 3}, baseline={"fake.x": 0.9})) == 9
    racing = space_of(tmp_path, confirm={"top_k": 3, "seeds": 5, "race": True, "min_seeds": 2})
    assert confirm_reserve(racing) == 6  # the least a race runs: every candidate on its first min_seeds seeds


def test_a_proxy_search_keeps_its_field_and_the_continued_first_seed(tmp_path: Path) -> None:
    """A racing proxy search keeps confirm_top settings on min_seeds seeds, the first seed of each continuing its
    promoted run (here 50 of 60 steps) where the trainer continues runs (verl_core), plus the baseline; after a
    failed check, the usual top_k; a trainer that cannot continue runs pays the first seed in full."""
    import yaml

    from hpo.experiment import read_space

    def space(command: bool = False) -> Space:
        path = tmp_path / "proxy.yaml"
        path.write_text(yaml.safe_dump({
            "config": "tiny_arith", "overrides": {"trainer.seed": 1001},
            "params": {"x": {"key": "fake.x", "type": "float", "low": 0.0, "high": 1.0}},
            "study": {"n_trials": 4, "baseline": {"fake.x": 0.9},
                      "confirm": {"race": True, "top_k": 2, "min_seeds": 2, "seeds": 3},
                      "fidelity": {"proxy": {"overrides": {"m": "small"}, "promote": 3, "promote_steps": 10}}},
            **({"trial": {"command": ["python", "train.py"]}} if command else {})}))
        return read_space(str(path))[0]

    ran = [create_trial(value=0.5, params={}, distributions={}, user_attrs={"total_steps": 60})]
    assert confirm_reserve(space(), None, ran) == pytest.approx(1 * (1 + 50 / 60) + 2)
    assert confirm_reserve(space(), None, ran, {"holds": True}) == pytest.approx(1 + 50 / 60 + 2)
    assert confirm_reserve(space(), None, ran, {"holds": False}) == 2 * 2 + 2  # the fallback: top_k, from scratch
    assert confirm_reserve(space(), None, []) == 1 * 2 + 2  # no full run's length yet: the first seed in full
    assert confirm_reserve(space(command=True), None, ran) == 1 * 2 + 2  # a custom command cannot continue
