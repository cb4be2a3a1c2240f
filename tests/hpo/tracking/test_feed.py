"""The driver's side of tracking (:mod:`hpo.tracking._feed`): the start line naming the trackers (never a password),
the tracking process's environment carrying the secrets (never its argv), trial start / finish told through the spool,
and real tracking processes started by a driver and by ``verl-hpo track`` (no tracker configured: what is tested is
the process's life, its exit code and what it leaves beside the spool)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest

from hpo.execution._identity import driver_identity
from hpo.experiment._tracking import MlflowSpec, TrackingSpec, WandbSpec
from hpo.tracking import TrackingFeed, catch_up, describe
from hpo.tracking._feed import ENV_SPEC, ENV_STORAGE, EXIT_BUSY, _TrackedProgress, tracker_env, tracker_process
from hpo.tracking._spool import SpoolReader, SpoolWriter, sidecar, spool_lock, spool_path, tracking_dir


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


def _fates(out: str) -> list[str]:
    """``track``'s lines but its summary (the last)."""
    return out.splitlines()[:-1]


@pytest.mark.timeout(180)
def test_track_says_each_spool_s_fate_on_a_line_of_its_own(study_db: tuple[Path, str],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A dead driver's spool is logged; one a tracking process already works on (a dead driver's, still flushing)
    is skipped, and said so; one that cannot be read is not logged, and said so on stderr."""
    studies, url = study_db
    directory = tracking_dir(studies, "s")
    dead, busy, unreadable = (directory / f"spool-h-{pid}-0.jsonl" for pid in (1, 2, 3))
    for path in (dead, busy):
        SpoolWriter(path).close()  # a driver that wrote nothing and died (no end line)
    unreadable.mkdir()  # not a file: its tracking process fails to read it
    with spool_lock(busy, wait=False) as got:  # another tracking process holds this one
        assert got
        assert catch_up(TrackingSpec(), "s", url, studies) == 1
    out, err = capsys.readouterr()
    assert _fates(out) == ["spool-h-1-0.jsonl: fully logged",
                           "spool-h-2-0.jsonl: skipped: another tracking process works on it"]
    assert out.splitlines()[-1] == "tracking: 1 of 3 spool(s) of study s fully logged to ; 1 skipped; " \
                                           "1 not logged"
    [line] = err.strip().splitlines()
    assert re.match(r"error: spool-h-3-0\.jsonl: not logged: \d\d:\d\d:\d\d IsADirectoryError: ", line), line
    assert "everything logged" in sidecar(dead, ".log").read_text()
    assert "another tracking process works on" in sidecar(busy, ".log").read_text()


@pytest.mark.timeout(180)
def test_a_tracking_process_refused_its_spool_says_so_in_its_exit_code(study_db: tuple[Path, str]) -> None:
    """The spool's lock taken by another tracking process (between ``track``'s look and its tracking process's
    start, or by another ``track``): the process logs nothing, and exits EXIT_BUSY, not 0 (everything logged)."""
    studies, url = study_db
    spool = tracking_dir(studies, "s") / "spool-h-1-0.jsonl"
    SpoolWriter(spool).close()
    with spool_lock(spool, wait=False) as got:
        assert got
        proc = tracker_process(spool, TrackingSpec(), url, studies, "s", None)
        assert proc.wait(120) == EXIT_BUSY
    assert "another tracking process works on" in sidecar(spool, ".log").read_text()
    assert not sidecar(spool, ".state.json").exists()


@pytest.mark.timeout(180)
def test_a_spool_whose_driver_still_runs_is_skipped_until_the_driver_has_ended(
        study_db: tuple[Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    """A live driver's spool is left to it: skipped while its tracking process runs (exit 0: it is being logged)
    and, that process gone, skipped with a word to run ``track`` again later (exit 1: nobody logs it now; logging
    it as a dead driver's would end the study's run while the driver goes on). Once the driver has ended, logged."""
    studies, url = study_db
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        started = psutil.Process(driver.pid).create_time()
        identity = {"host": socket.gethostname(), "pid": driver.pid, "started": started}
        spool = spool_path(tracking_dir(studies, "s"), identity)
        SpoolWriter(spool).close()  # as the driver writes it: no trial started yet
        with spool_lock(spool, wait=False) as got:  # its tracking process
            assert got
            assert catch_up(TrackingSpec(), "s", url, studies) == 0
        assert _fates(capsys.readouterr().out) == [
            f"{spool.name}: skipped: its driver (pid {driver.pid}) and its tracking process are still running"]
        assert catch_up(TrackingSpec(), "s", url, studies) == 1  # its tracking process died, its driver did not
        out = capsys.readouterr().out
        assert _fates(out) == [f"{spool.name}: skipped: its driver (pid {driver.pid}) is still running and its "
                               "tracking process is not; run verl-hpo track again once the driver has ended"]
        assert out.splitlines()[-1] == "tracking: 0 of 1 spool(s) of study s fully logged to ; 1 skipped"
        assert not sidecar(spool, ".state.json").exists() and not sidecar(spool, ".log").exists()
    finally:
        driver.kill()
        driver.wait()
    assert catch_up(TrackingSpec(), "s", url, studies) == 0
    out = capsys.readouterr().out
    assert _fates(out) == [f"{spool.name}: fully logged"]
    assert out.splitlines()[-1] == "tracking: 1 of 1 spool(s) of study s fully logged to "
    assert "everything logged" in sidecar(spool, ".log").read_text()
