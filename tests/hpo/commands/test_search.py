"""``search`` loads its experiment once (issue 55 item 2): one :func:`hpo.backends.load_space`, whose checks run once,
with ``study.speed_from``'s settings already in; the throughput study is asked only by an experiment that names one.
Nothing runs: the study run is replaced, and so is the throughput study's answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import hpo.reporting._speed_from as reporting_speed_from
from hpo._cli import main
from hpo.backends import _check
from hpo.commands import _search
from hpo.commands import _speed_from as commands_speed_from
from hpo.commands._study import StudyRun
from hpo.experiment import Space
from tests.hpo.conftest import fake_space

INFO = {"study": "speedy", "trial": 4, "ratio": 1.5, "low": 1.2, "high": 1.8, "settings": {"fake.knob": "7"},
        "replaced": {}, "own": {}}


def _search_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, space: Path) -> tuple[list[Space], list[Space],
                                                                                          list[StudyRun]]:
    """``verl-hpo search --space SPACE``: the experiments the throughput study was asked with, those checked, and
    the study run handed on."""
    asked: list[Space] = []
    checked: list[Space] = []
    runs: list[StudyRun] = []

    def speed_from(space: Space, url: str) -> tuple[list[str], dict[str, Any]]:
        asked.append(space)
        return ["overrides.fake.knob=7"], INFO

    real_checked = _check._checked
    monkeypatch.setattr(reporting_speed_from, "speed_from", speed_from)
    monkeypatch.setattr(commands_speed_from, "speed_url", lambda space, storage, studies_dir: "sqlite:///speedy.db")
    monkeypatch.setattr(_check, "_checked", lambda s, origin: checked.append(s) or real_checked(s, origin))
    monkeypatch.setattr(_search, "run_study", lambda run, inv: runs.append(run) or 0)
    assert main(["search", "--space", str(space), "--studies-dir", str(tmp_path / "studies")]) == 0
    return asked, checked, runs


def test_a_speed_from_search_checks_its_experiment_once_with_the_settings_in(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    asked, checked, runs = _search_with(tmp_path, monkeypatch, fake_space(tmp_path, study={"speed_from": "speedy"}))
    assert len(asked) == 1 and asked[0].trial.backend  # asked once, with the trainer's defaults in
    assert "fake.knob" not in asked[0].overrides
    assert [s.overrides.get("fake.knob") for s in checked] == [7]  # checked once, the setting in
    (run,) = runs
    assert run.space is not None and run.space.overrides["fake.knob"] == 7 and run.speed_info == INFO
    assert (run.study, run.confirm, run.local_space) == ("fake", None, None)


def test_an_experiment_without_speed_from_asks_no_throughput_study(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    asked, checked, runs = _search_with(tmp_path, monkeypatch, fake_space(tmp_path))
    assert asked == [] and len(checked) == 1
    assert [(r.study, r.speed_info) for r in runs] == [("fake", None)]
