"""Admission of a Ray trial against Ray's autoscaler report (the cluster's view is given, the study is real)."""

from __future__ import annotations

import threading
from typing import Any

import optuna
import pytest

from hpo.execution.ray_jobs import NodeView, RayClusterError
from hpo.experiment._ray_spec import RaySpec
from hpo.experiment._space import TrialSpec
from hpo.study import _ray_trials


def _spec(gpus: float) -> TrialSpec:
    return TrialSpec(executor="ray", ray=RaySpec(address="http://127.0.0.1:1", num_gpus=gpus, num_cpus=1))


def _views(monkeypatch: pytest.MonkeyPatch, views: list[list[NodeView]]) -> list[int]:
    asked: list[int] = []

    def view(address: str) -> tuple[list[NodeView], float]:
        asked.append(1)
        return views[min(len(asked), len(views)) - 1], 0.0
    monkeypatch.setattr(_ray_trials, "cluster_view", view)
    monkeypatch.setattr(_ray_trials, "POLL_S", 0.01)
    monkeypatch.setattr(_ray_trials, "_FITTED", set())
    return asked


def test_a_head_whose_report_lists_no_node_yet_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """A head just started has no node in its first report: the trial waits (said once), then is admitted."""
    node = NodeView("n", {"GPU": 2.0, "CPU": 2.0}, {})
    asked = _views(monkeypatch, [[], [], [node]])
    study = optuna.create_study()
    said: list[str] = []
    assert _ray_trials.admit(study, study.ask(), _spec(1), threading.Event(), note=said.append)
    assert len(asked) == 3
    assert len(said) == 1 and "no alive node yet" in said[0], said


def test_a_trial_no_listed_node_can_hold_is_refused_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    node = NodeView("n", {"GPU": 2.0, "CPU": 2.0}, {})
    _views(monkeypatch, [[node]])
    study = optuna.create_study()
    with pytest.raises(RayClusterError, match="1 alive node"):
        _ray_trials.admit(study, study.ask(), _spec(4), threading.Event())


def test_waiting_ends_when_the_driver_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    _views(monkeypatch, [[]])
    stop = threading.Event()
    study = optuna.create_study()
    threading.Timer(0.2, stop.set).start()
    said: list[Any] = []
    assert not _ray_trials.admit(study, study.ask(), _spec(1), stop, note=said.append)
