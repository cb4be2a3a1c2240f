"""MLflow on a ``sqlite:`` database (no server): the experiment the tracker creates keeps its artifacts (the study's
dashboard page) under the studies directory, not in ``./mlruns`` of whatever directory the driver was started in
(issue 34, item 10)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.hpo.conftest import PY, cli_env, fake_space, load

mlflow = pytest.importorskip("mlflow")


@pytest.mark.slow  # the tracking process imports mlflow and migrates a fresh database: ~20-60 s on 2 busy cores
def test_a_sqlite_backend_keeps_the_artifacts_under_the_studies_dir(tmp_path: Path) -> None:
    cwd, studies, db = tmp_path / "elsewhere", tmp_path / "studies", tmp_path / "mlflow.db"
    cwd.mkdir()
    space = fake_space(tmp_path, study={"n_trials": 2}, tracking={"flush_s": 300})
    res = subprocess.run([PY, "-m", "hpo", "search", "--space", str(space), "--studies-dir", str(studies),
                          "--tracking", f"mlflow=sqlite:///{db}"], cwd=cwd, env=cli_env(), capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert len(load(studies, "fake").trials) == 2
    assert list(cwd.iterdir()) == []  # no ./mlruns where the driver was started
    client = mlflow.MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("verl-hpo")
    root = studies.resolve() / "mlflow-artifacts"
    assert exp is not None and Path(exp.artifact_location) == root
    pages = list(root.rglob("dashboard.html"))
    assert len(pages) == 1, sorted(str(p) for p in root.rglob("*"))
    log = "".join(p.read_text() for p in (studies / "fake" / "tracking").glob("spool-*.log"))
    assert f"artifacts in {root}" in log
