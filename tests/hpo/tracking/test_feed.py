"""The driver's side of tracking (:mod:`hpo.tracking._feed`): the start line naming the trackers (never a password),
the tracking process's environment carrying the secrets (never its argv), trial start / finish told through the spool,
and real tracking processes started by a driver and by ``verl-hpo track`` (no tracker configured: what is tested is
the process's life, its exit code and what it leaves beside the spool)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import optuna
import pytest

from hpo.execution._identity import driver_identity
from hpo.experiment._tracking import MlflowSpec, TrackingSpec, WandbSpec
from hpo.tracking import TrackingFeed, catch_up, describe
from hpo.tracking._feed import ENV_SPEC, ENV_STORAGE, _TrackedProgress, tracker_env
from hpo.tracking._spool import SpoolReader, SpoolWriter, sidecar, spool_lock, tracking_dir


def test_the_start_line_says_where_a_database_backend_s_artifacts_go(tmp_path: Path) -> None:
    line = describe(TrackingSpec(mlflow=MlflowSpec(uri=f"sqlite:///{tmp_path}/m.db")), tmp_path / "studies")
    assert f"artifacts of a new experiment in {tmp_path / 'studies' / 'mlflow-artifacts'}" in line
    assert "artifacts" not in describe(TrackingSpec(mlflow=MlflowSpec(uri="http://h:5000")), tmp_path)


def test_the_start_line_names_each_tracker_and_never_a_password() -> None:
    spec = TrackingSpec(mlflow=MlflowSpec(uri="https://me:pw-123@h:5000", experiment="exp"),
                        wandb=WandbSpec(project="proj", mode="offline"))
    assert describe(spec) == "MLflow https://me:***@h:5000 (experiment exp), W&B project proj (offline)"
    assert describe(TrackingSpec()) == ""


def test_the_tracking_process_gets_its_secrets_in_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    spec = TrackingSpec(mlflow=MlflowSpec(uri="http://u:pw@h:1"), flush_s=5)
    env = tracker_env(spec, "postgresql://u:dbpw@h/db")
    assert env[ENV_STORAGE] == "postgresql://u:dbpw@h/db"
    assert TrackingSpec.from_json(json.loads(env[ENV_SPEC])) == spec
    root = str(Path(__file__).resolve().parents[3])  # the directory holding this checkout's hpo package
    assert env["PYTHONPATH"].split(os.pathsep) == [root, "/elsewhere"]


class Quiet:
    """The console reporter's stand-in: records what reaches it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def note(self, text: str) -> None:
        self.seen.append(("note", text))

    def trial_started(self, number: int, params: dict[str, Any], retry_of: int | None) -> None:
        self.seen.append(("started", number))

    def trial_eval(self, number: int, step: int, total: int | None, value: float, mem_gb: float) -> None:
        self.seen.append(("eval", step))

    def trial_tick(self, number: int, step: int | None, total: int | None, mem_gb: float) -> None:
        self.seen.append(("tick", step))

    def trial_finished(self, study: optuna.Study, trial: Any, finished: int) -> None:
        self.seen.append(("finished", trial.number))

    def header(self) -> str:
        return "the reporter's own"


def test_trial_starts_and_finishes_reach_the_spool_and_the_reporter_alike(tmp_path: Path) -> None:
    spool = tmp_path / "spool.jsonl"
    inner = Quiet()
    progress = _TrackedProgress(inner, SpoolWriter(spool))  # type: ignore[arg-type]
    study = optuna.create_study()
    trial = study.ask()
    study.tell(trial, 1.0)
    progress.trial_started(0, {"x": 1}, None)
    progress.trial_eval(0, 3, 10, 0.5, 1.0)
    progress.trial_tick(0, 4, 10, 1.0)
    progress.trial_finished(study, study.trials[0], 1)
    progress.note("hello")
    assert progress.header() == "the reporter's own"
    assert inner.seen == [("started", 0), ("eval", 3), ("tick", 4), ("finished", 0), ("note", "hello")]
    assert [(e["ev"], e["trial"]) for e in SpoolReader(spool).read()] == [("start", 0), ("finish", 0)]


@pytest.fixture
def study_db(tmp_path: Path) -> tuple[Path, str]:
    studies = tmp_path / "studies"
    studies.mkdir()
    url = f"sqlite:///{studies / 's.db'}"
    optuna.create_study(study_name="s", storage=url)
    return studies, url


@pytest.mark.timeout(120)
def test_a_driver_s_tracking_process_ends_when_told_and_leaves_its_state(study_db: tuple[Path, str]) -> None:
    studies, url = study_db
    feed = TrackingFeed(TrackingSpec(flush_s=60), "s", url, studies, driver_identity())
    assert feed.spool.parent == tracking_dir(studies, "s") and feed.proc.poll() is None
    assert feed.close() is None  # the end line, then exit 0 (nothing was left to log)
    assert feed.proc.returncode == 0
    assert "everything logged" in feed.log_path.read_text()
    assert json.loads(sidecar(feed.spool, ".state.json").read_text()) == {"trackers": {}}


@pytest.mark.timeout(120)
def test_track_finishes_a_dead_driver_s_spool_and_skips_one_still_worked_on(study_db: tuple[Path, str],
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    studies, url = study_db
    directory = tracking_dir(studies, "s")
    dead, live = directory / "spool-h-1-0.jsonl", directory / "spool-h-2-0.jsonl"
    for path in (dead, live):
        SpoolWriter(path).close()  # a driver that wrote nothing and died (no end line)
    with spool_lock(live, wait=False) as got:  # a live driver's tracking process holds this one
        assert got
        assert catch_up(TrackingSpec(), "s", url, studies) == 0
    out = capsys.readouterr().out
    assert "spool-h-2-0.jsonl: its tracking process is still running; skipped" in out
    summary = out.strip().splitlines()[-1]  # the skipped one is counted as skipped, not as logged
    assert summary.startswith("tracking: 1 of 2 spool(s) of study s fully logged to "), summary
    assert summary.endswith("; 1 skipped (still being logged by a running driver)"), summary
    assert "everything logged" in sidecar(dead, ".log").read_text()
    assert not sidecar(live, ".log").exists()
