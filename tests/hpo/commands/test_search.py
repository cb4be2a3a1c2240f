"""``search`` loads its experiment once (issue 55 item 2): one :func:`hpo.backends.load_space`, whose checks run once,
with ``study.speed_from``'s settings already in; the throughput study is asked only by an experiment that names one.
Nothing runs: the study run is replaced, and so is the throughput study's answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState

import hpo.reporting as reporting
import hpo.reporting._speed_from as reporting_speed_from
from hpo._cli import main
from hpo.backends import _check
from hpo.commands import _search
from hpo.commands import _speed_from as commands_speed_from
from hpo.commands._study import StudyRun
from hpo.experiment import Space
from tests.hpo.conftest import fake_space, load, run_cli

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
    monkeypatch.setattr(reporting, "speed_from", speed_from)  # what the command imports (the package's face)
    monkeypatch.setattr(commands_speed_from, "speed_url",
                        lambda space, storage, studies_dir: f"sqlite:///{tmp_path / 'speedy.db'}")
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


@pytest.mark.parametrize(("flags", "line"), [
    (["--study", "a/b"], "error: --study 'a/b': a study name is 1-100 letters, digits, '.', '_' or '-', starting "
                         "with a letter or digit"),
    (["--storage", "nosuch://x"], "error: --storage nosuch://x: not a usable database URL (Can't load plugin: "
                                  "sqlalchemy.dialects:nosuch)"),
    (["--n-trials", "0"], "error: --n-trials 0: must be positive"),
])
def test_a_bad_name_storage_or_target_is_one_line_and_nothing_is_made(tmp_path: Path, studies: Path,
                                                                      flags: list[str], line: str) -> None:
    res = run_cli(["search", "--space", str(fake_space(tmp_path)), *flags], studies)
    assert (res.returncode, res.stdout, res.stderr.strip().splitlines()) == (2, "", [line])
    assert not studies.exists()


def test_the_study_is_named_and_sized_by_the_flags_and_a_second_search_continues_it(tmp_path: Path,
                                                                                   studies: Path) -> None:
    space = fake_space(tmp_path, overrides={"trainer.total_training_steps": 4, "trainer.test_freq": 2,
                                            "fake.step_s": 0.01}, study={"n_trials": 5})
    res = run_cli(["search", "--space", str(space), "--study", "mine", "--n-trials", "1"], studies)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"study mine: 0/1 finished trials; storage sqlite:///{studies / 'mine.db'}")
    assert [t.state for t in load(studies, "mine").trials] == [TrialState.COMPLETE]
    again = run_cli(["search", "--space", str(space), "--study", "mine", "--n-trials", "2"], studies)
    assert again.returncode == 0 and again.stdout.startswith("study mine: 1/2 finished trials"), again.stdout
    assert len(load(studies, "mine").trials) == 2 and not (studies / "fake.db").exists()
