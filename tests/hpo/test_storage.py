"""Storages other than the default SQLite file: PostgreSQL (RDB with heartbeats) and Redis (JournalStorage).
Skipped when the server or its Python driver is not there."""

from __future__ import annotations

import importlib.util
import socket
import uuid
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from hpo._space import StudySpec
from hpo._storage import open_storage
from tests.hpo.conftest import fake_space, run_cli

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
    space = fake_space(tmp_path, study={"n_trials": 2})
    try:
        res = run_cli(["search", "--space", str(space), "--study", name, "--storage", url], studies)
        assert res.returncode == 0, res.stderr
        res = run_cli(["resume", "--study", name, "--storage", url, "--n-trials", "3"], studies)
        assert res.returncode == 0, res.stderr
        study = optuna.load_study(study_name=name, storage=open_storage(url, StudySpec()))
        assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
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
from hpo._storage import open_storage
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
