"""Storages other than the default SQLite file: PostgreSQL (RDB with heartbeats) and Redis (JournalStorage),
skipped when the server or its Python driver is not there; storage names and URLs; riding out an SQLite
database that cannot be written for a while (PostgreSQL restarts: test_retrying.py)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from hpo.experiment._space import StudySpec
from hpo.storages._storage import open_storage
from tests.hpo.conftest import PY, cli_env, fake_space, run_cli
from tests.hpo.storages.test_errors import _sqlite_error, _wrapped

PG_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/0"


def _up(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize(("url", "module", "port"), [(PG_URL, "psycopg2", 5432), (REDIS_URL, "redis", 6379)],
                         ids=["postgresql", "redis"])
def test_search_resume_best_on_a_server_storage(tmp_path: Path, url: str, module: str, port: int) -> None:
    if importlib.util.find_spec(module) is None or not _up(port):
        pytest.skip(f"{module} or the server on port {port} is not available")
    name = f"hpo-test-{uuid.uuid4().hex[:10]}"
    studies = tmp_path / "studies"
    space = fake_space(tmp_path, study={"n_trials": 1})  # one trial by search, one more by resume: both write there
    try:
        res = run_cli(["search", "--space", str(space), "--study", name, "--storage", url], studies)
        assert res.returncode == 0, res.stderr
        res = run_cli(["resume", "--study", name, "--storage", url, "--n-trials", "2"], studies)
        assert res.returncode == 0, res.stderr
        study = optuna.load_study(study_name=name, storage=open_storage(url, StudySpec()))
        assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
        assert run_cli(["best", "--study", name, "--storage", url], studies).stdout.startswith("fake.x=")
        assert not list(studies.glob("*.db"))
    finally:
        try:
            optuna.delete_study(study_name=name, storage=open_storage(url, StudySpec()))
        except Exception:  # noqa: BLE001 (best-effort cleanup of a shared server)
            pass


def test_unknown_driver_is_one_line_exit_2(tmp_path: Path) -> None:
    res = run_cli(["search", "--space", str(fake_space(tmp_path)), "--storage", "postgresql+nosuchdriver://x/y"],
                  tmp_path / "studies")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "--storage postgresql+nosuchdriver://x/y" in res.stderr


def test_unreachable_server_is_one_line_exit_1(tmp_path: Path) -> None:
    if importlib.util.find_spec("psycopg2") is None:
        pytest.skip("psycopg2 not installed")
    res = run_cli(["search", "--space", str(fake_space(tmp_path)), "--storage",
                   "postgresql+psycopg2://nobody@127.0.0.1:1/none"], tmp_path / "studies", timeout=60)
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "Traceback" not in res.stderr


_POP = """
import sys, threading, optuna
sys.path.insert(0, sys.argv[2])
from hpo.storages._storage import open_storage
optuna.logging.set_verbosity(40)
storage = open_storage(sys.argv[1])
got = []
def ask():
    study = optuna.load_study(study_name="q", storage=storage)
    for _ in range(8):
        got.append(study.ask().number)
threads = [threading.Thread(target=ask) for _ in range(3)]
[t.start() for t in threads]
[t.join() for t in threads]
print(" ".join(map(str, got)))
"""


def test_queued_trials_are_claimed_once_on_sqlite(tmp_path: Path) -> None:
    """Optuna claims a queued trial with SELECT ... FOR UPDATE, which SQLite ignores; the driver's SQLite
    storage serializes transactions so that 3 processes x 3 threads asking at once never get the same queued
    trial twice (without it, 4 threads on 40 queued trials got duplicates in every run)."""
    import subprocess
    import sys

    from tests.hpo.conftest import ROOT

    url = f"sqlite:///{tmp_path / 'q.db'}"
    study = optuna.create_study(study_name="q", storage=open_storage(url))
    for i in range(72):
        study.enqueue_trial({"x": float(i)})
    procs = [subprocess.Popen([sys.executable, "-c", _POP, url, str(ROOT)], stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    got = [int(n) for p in procs for n in p.communicate(timeout=120)[0].split()]
    assert all(p.returncode == 0 for p in procs)
    assert len(got) == 72 and len(set(got)) == 72
    study = optuna.load_study(study_name="q", storage=open_storage(url))
    assert {t.state for t in study.trials} == {TrialState.RUNNING}
    assert sorted(t.system_attrs["fixed_params"]["x"] for t in study.trials) == [float(i) for i in range(72)]


# ----------------------------------------------------------------------------- names and URLs
def test_a_study_name_is_matched_whole() -> None:
    from hpo.experiment._space import SpaceError
    from hpo.storages._storage import check_study_name

    assert check_study_name("abc-1.x_y") == "abc-1.x_y"
    for bad in ("abc\n", "abc\r", "\nabc", "a/b", ".hidden", "-x", "a" * 101, ""):
        with pytest.raises(SpaceError):
            check_study_name(bad)


def test_a_study_name_with_a_trailing_newline_is_one_line_exit_2(tmp_path: Path) -> None:
    studies = tmp_path / "studies"
    res = run_cli(["search", "--space", str(fake_space(tmp_path)), "--study", "fake\n"], studies)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not studies.exists() or not list(studies.iterdir())


def test_an_sqlite_path_that_is_another_file_is_refused_and_nothing_is_made_beside_it(tmp_path: Path) -> None:
    """``--storage sqlite:////etc/passwd``: the lock (``<db>.lock``) is created only beside an SQLite file (its
    16-byte header) or where there is no file yet (an empty file counts as none)."""
    from hpo.experiment._space import SpaceError

    passwd = tmp_path / "etc" / "passwd"
    passwd.parent.mkdir()
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\n")
    before = sorted(p.name for p in passwd.parent.iterdir())
    url = f"sqlite:///{passwd}"
    res = run_cli(["search", "--space", str(fake_space(tmp_path)), "--storage", url], tmp_path / "studies")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "not an SQLite database" in res.stderr
    with pytest.raises(SpaceError, match="not an SQLite database"):
        open_storage(url)
    with pytest.raises(SpaceError, match="not a file"):
        open_storage(f"sqlite:///{passwd.parent}")
    assert sorted(p.name for p in passwd.parent.iterdir()) == before  # no passwd.lock
    assert passwd.read_text() == "root:x:0:0:root:/root:/bin/bash\n"
    empty = tmp_path / "empty.db"
    empty.touch()
    optuna.create_study(study_name="e", storage=open_storage(f"sqlite:///{empty}"))  # SQLite makes it a database
    assert empty.read_bytes()[:16] == b"SQLite format 3\x00"
    open_storage(f"sqlite:///{empty}")  # and a real SQLite file is accepted


@pytest.mark.parametrize("url", ["sqlite:///file:/etc/passwd?uri=true", "sqlite+pysqlite:///file:s.db?mode=rwc&uri=1",
                                 "sqlite:///file:s.db?uri=false&uri=true"])
def test_sqlite_uri_mode_is_refused_and_nothing_is_created(tmp_path: Path, url: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite's URI mode names no path (``file:/etc/passwd`` opens /etc/passwd, while the checks and the
    ``<db>.lock`` would look at ``./file:/etc/passwd`` in the working directory): one line, exit 2, and nothing is
    created in the working directory or the studies directory."""
    from hpo.experiment._space import SpaceError
    from hpo.storages._storage import check_storage_url

    cwd, studies = tmp_path / "cwd", tmp_path / "studies"
    cwd.mkdir()
    space = fake_space(tmp_path)
    res = subprocess.run([PY, "-m", "hpo", "search", "--space", str(space), "--storage", url,
                          "--studies-dir", str(studies)], cwd=cwd, env=cli_env(), capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "URI" in res.stderr and "sqlite:///path/to/study.db" in res.stderr, res.stderr
    monkeypatch.chdir(cwd)
    with pytest.raises(SpaceError, match="URI filenames"):
        check_storage_url(url)
    with pytest.raises(SpaceError, match="URI filenames"):
        open_storage(url)
    assert list(cwd.iterdir()) == [] and (not studies.exists() or list(studies.iterdir()) == [])
    check_storage_url(f"sqlite:///{tmp_path / 's.db'}?uri=false")  # a plain path with URI mode off is a path


@pytest.mark.parametrize("url", ["sqlite:///:memory:", "sqlite://", "sqlite:///file::memory:?uri=true",
                                 "sqlite+pysqlite:///:memory:"])
def test_an_in_memory_sqlite_storage_is_refused(tmp_path: Path, url: str) -> None:
    """A study in memory dies with its driver: it could never be resumed."""
    from hpo.experiment._space import SpaceError
    from hpo.storages._storage import check_storage_url

    with pytest.raises(SpaceError, match="in-memory SQLite"):
        check_storage_url(url)
    if url == "sqlite:///:memory:":
        res = run_cli(["search", "--space", str(fake_space(tmp_path)), "--storage", url], tmp_path / "studies")
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert "in-memory SQLite" in res.stderr


# ----------------------------------------------------------------------------- riding out an outage (SQLite)
@contextmanager
def unwritable(directory: Path) -> Iterator[None]:
    """No file can be created in ``directory`` (so SQLite cannot begin a write: its journal goes there), even for
    root: ``chattr +i`` (root ignores permissions), else ``chmod 555``. What a read-only remount looks like."""
    if os.geteuid() == 0:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(directory)],
                                                            capture_output=True).returncode:
            pytest.skip("running as root and chattr +i does not work on this file system")
        undo: Callable[[], Any] = lambda: subprocess.run(["chattr", "-i", str(directory)], check=True)  # noqa: E731
    else:
        directory.chmod(0o555)
        undo = lambda: directory.chmod(0o755)  # noqa: E731
    try:
        yield
    finally:
        undo()


def wait_for(pred: Callable[[], bool], timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_an_unwritable_sqlite_database_is_ridden_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three threads write while the database cannot be written: one outage, every write lands once it can."""
    from hpo.storages._retrying import storage_downtime, storage_outages

    (tmp_path / "db").mkdir()
    storage = open_storage(f"sqlite:///{tmp_path / 'db' / 's.db'}", StudySpec(storage_retry_s=120))
    study = optuna.create_study(study_name="s", storage=storage)
    trials = [study.ask() for _ in range(3)]
    errors: list[BaseException] = []

    def tell(t: optuna.Trial) -> None:
        try:
            study.tell(t, 0.5)
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=tell, args=(t,)) for t in trials]
    with unwritable(tmp_path / "db"):
        for th in threads:
            th.start()
        wait_for(lambda: storage_outages(storage) == 1, what="the outage to be noticed")
        assert all(th.is_alive() for th in threads) and not errors
    for th in threads:
        th.join(timeout=60)
    assert not errors, errors
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
    assert storage_outages(storage) == 1 and storage_downtime(storage) > 0
    err = capsys.readouterr().err
    assert "unreachable" in err and "reachable again after" in err and "invalid data" not in err


def test_a_finish_whose_acknowledgement_was_lost_is_not_an_error(tmp_path: Path) -> None:
    """The commit of a trial's state went through, its answer was lost (the connection dropped): the retry
    finds the trial finished as asked and returns True; finished otherwise (by someone else), it still raises."""
    from optuna.exceptions import UpdateFinishedTrialError
    from sqlalchemy.exc import OperationalError

    from hpo.storages._retrying import storage_outages

    storage = open_storage(f"sqlite:///{tmp_path / 's.db'}", StudySpec(storage_retry_s=30))
    study = optuna.create_study(study_name="s", storage=storage)
    mine, theirs = study.ask(), study.ask()
    real = storage.inner.set_trial_state_values
    dropped = []

    def commit_then_drop(trial_id: int, state: TrialState, values: Any = None) -> bool:
        ok = real(trial_id, state, values)
        if not dropped:
            dropped.append(trial_id)
            raise OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"))
        return ok

    storage.inner.set_trial_state_values = commit_then_drop  # type: ignore[method-assign]
    assert storage.set_trial_state_values(mine._trial_id, TrialState.COMPLETE, [0.25]) is True
    assert study.trials[mine.number].state == TrialState.COMPLETE and study.trials[mine.number].values == [0.25]
    assert storage_outages(storage) == 1
    real(theirs._trial_id, TrialState.FAIL, None)  # someone else finished it
    with pytest.raises(UpdateFinishedTrialError):
        storage.set_trial_state_values(theirs._trial_id, TrialState.COMPLETE, [0.5])


def test_a_permanent_error_is_raised_at_once(tmp_path: Path) -> None:
    from hpo.storages._retrying import storage_outages

    storage = open_storage(f"sqlite:///{tmp_path / 's.db'}", StudySpec(storage_retry_s=60))
    study = optuna.create_study(study_name="s", storage=storage)

    calls = []

    def broken(*_a: Any, **_k: Any) -> None:
        calls.append(1)
        raise _wrapped(_sqlite_error("no such table: trial_user_attributes"))

    storage.inner.set_trial_user_attr = broken  # type: ignore[method-assign]
    with pytest.raises(optuna.exceptions.StorageInternalError):
        study.ask().set_user_attr("k", 1)
    assert len(calls) == 1 and storage_outages(storage) == 0  # tried once: no retry, no outage


def test_an_unwritable_storage_past_the_window_is_one_line_exit_1_and_resume_recovers(tmp_path: Path) -> None:
    """The database cannot be written for longer than ``study.storage_retry_s``: the driver exits 1 with one
    error line (no traceback, no Optuna "invalid data in the commit"); nothing is lost, resume finishes."""
    import subprocess as sp

    from tests.hpo.conftest import PY, ROOT, cli_env

    studies, db_dir = tmp_path / "studies", tmp_path / "db"
    db_dir.mkdir()
    url = f"sqlite:///{db_dir / 'fake.db'}"
    space = fake_space(tmp_path, overrides={"trainer.total_training_steps": 60, "fake.step_s": 0.1},
                       study={"n_trials": 1, "storage_retry_s": 2})
    driver = sp.Popen([PY, "-m", "hpo", "search", "--space", str(space), "--storage", url, "--studies-dir",
                       str(studies)], cwd=ROOT, env=cli_env(), stdout=sp.PIPE, stderr=sp.PIPE, text=True)
    metrics = studies / "fake" / "trials" / "0" / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and metrics.stat().st_size > 0 or driver.poll() is not None, 120,
             "trial 0 to report")
    assert driver.poll() is None, driver.communicate()
    with unwritable(db_dir):
        out, err = driver.communicate(timeout=120)
    assert driver.returncode == 1, (out, err)
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and "invalid data" not in err, err
    assert last.startswith("error: ") and "unreachable for" in last and "storage_retry_s=2" in last, err
    study = optuna.load_study(study_name="fake", storage=url)
    assert [t.state for t in study.trials] == [TrialState.RUNNING]  # left to recovery, as if the driver died
    res = run_cli(["resume", "--study", "fake", "--storage", url], studies)
    assert res.returncode == 0, res.stderr
    trials = optuna.load_study(study_name="fake", storage=url).trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert trials[1].params == trials[0].params and trials[1].user_attrs["last_step"] == 60


@pytest.mark.parametrize("db", ["/proc/self/mem", "/sys/kernel/notes.db", "/dev/null"])
def test_an_sqlite_path_on_a_pseudo_filesystem_is_a_bad_storage_exit_2(tmp_path: Path, db: str) -> None:
    """A storage the user typed that can never hold a database is their input's error (exit 2), not an outage."""
    from hpo.experiment._space import SpaceError
    from hpo.storages._storage import check_storage_url

    with pytest.raises(SpaceError, match="pseudo-filesystem|is not a file"):
        check_storage_url(f"sqlite:///{db}")
    res = run_cli(["search", "--space", str(fake_space(tmp_path)), "--storage", f"sqlite:///{db}"],
                  tmp_path / "studies")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / "studies").exists()
