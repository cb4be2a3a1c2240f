"""Whether each tracker of an experiment is usable before a study starts (:mod:`hpo.tracking._check`): a missing
package, an unreachable server, a W&B key for online mode, a local destination that cannot be written each stop the
study before it starts, in one line naming the tracker (a password given on the command line never shown), unless
``--tracking-optional`` turns them into warnings. The section itself is parsed in
``tests/hpo/experiment/test_tracking.py``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from hpo.experiment._tracking import MlflowSpec, TrackingSpec, WandbSpec
from hpo.tracking._check import tracker_problems
from tests.hpo.conftest import fake_space, load, run_cli
from tests.hpo.tracking.conftest import free_port

SECRET = "s3cr3t-pw"


def test_missing_packages_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("mlflow", "wandb")
                        else real(name, *a))
    problems = tracker_problems(TrackingSpec(mlflow=MlflowSpec(uri="http://h:1"), wandb=WandbSpec(mode="offline")))
    assert problems == {"mlflow": "the mlflow package is not installed (pip install -e '.[tracking]')",
                        "wandb": "the wandb package is not installed (pip install -e '.[tracking]')"}


def test_w_and_b_online_needs_a_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    assert "WANDB_API_KEY" in tracker_problems(TrackingSpec(wandb=WandbSpec()))["wandb"]
    assert tracker_problems(TrackingSpec(wandb=WandbSpec(mode="offline"))) == {}


def test_an_unreachable_server_stops_the_search_before_it_starts(tmp_path: Path, studies: Path) -> None:
    """One line, exit 2, no study made; the password given on the command line is never printed."""
    uri = f"http://me:{SECRET}@127.0.0.1:{free_port()}"
    space = fake_space(tmp_path, study={"n_trials": 1})
    res = run_cli(["search", "--space", str(space), "--tracking", f"mlflow={uri}"], studies)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "tracking.mlflow" in lines[0], res.stderr
    assert "unreachable" in lines[0] and "me:***@127.0.0.1" in lines[0] and "--tracking-optional" in lines[0]
    assert SECRET not in res.stderr + res.stdout
    assert not (studies / "fake.db").exists()


def test_tracking_optional_runs_the_study_without_it(tmp_path: Path, studies: Path) -> None:
    uri = f"http://me:{SECRET}@127.0.0.1:{free_port()}"
    space = fake_space(tmp_path, study={"n_trials": 1})
    res = run_cli(["search", "--space", str(space), "--tracking", f"mlflow={uri}", "--tracking-optional"], studies)
    assert res.returncode == 0, res.stderr
    assert "warning:" in res.stderr and "runs without mlflow tracking" in res.stderr
    assert SECRET not in res.stderr + res.stdout
    assert not (studies / "fake" / "tracking").exists()
    assert len(load(studies, "fake").trials) == 1


# ----------------------------------------------------------------------------- local destinations (issue 34, item 9)
def _regular_file(tmp_path: Path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("not a directory\n")
    return path


@pytest.mark.parametrize("where", ["/proc/verl-hpo-x", "FILE", "FILE/sub"])
def test_an_unwritable_w_and_b_dir_stops_the_search_before_it_starts(tmp_path: Path, studies: Path,
                                                                     where: str) -> None:
    pytest.importorskip("wandb")
    directory = where.replace("FILE", str(_regular_file(tmp_path)))
    space = fake_space(tmp_path, study={"n_trials": 1}, tracking={"wandb": {"mode": "offline", "dir": directory}})
    res = run_cli(["search", "--space", str(space)], studies, timeout=120)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "tracking.wandb: dir" in lines[0], res.stderr
    assert directory in lines[0] and "Traceback" not in res.stderr
    assert not (studies / "fake.db").exists()


@pytest.mark.parametrize("uri", ["file:///proc/verl-hpo-x", "file://FILE", "sqlite:////proc/verl-hpo-x/m.db",
                                 "sqlite:///FILE/m.db", "sqlite:///DIR"])
def test_an_unwritable_mlflow_store_stops_the_search_before_it_starts(
        tmp_path: Path, studies: Path, uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # a file store the user opted into: still checked
    uri = uri.replace("FILE", str(_regular_file(tmp_path))).replace("DIR", str(tmp_path))
    space = fake_space(tmp_path, study={"n_trials": 1})
    res = run_cli(["search", "--space", str(space), "--tracking", f"mlflow={uri}"], studies, timeout=120)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "tracking.mlflow: MLflow store" in lines[0]
    assert uri in lines[0] and "--tracking-optional" in lines[0]
    assert not (studies / "fake.db").exists()


def test_an_mlflow_file_store_is_refused_before_the_study(tmp_path: Path, studies: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow 3 raises on its filesystem backend for new runs: said before the study, not after it ran."""
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    uri = f"file://{tmp_path / 'mlruns'}"
    space = fake_space(tmp_path, study={"n_trials": 1})
    res = run_cli(["search", "--space", str(space), "--tracking", f"mlflow={uri}"], studies, timeout=120)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "filesystem backend (maintenance mode)" in res.stderr and "MLFLOW_ALLOW_FILE_STORE" in res.stderr
    assert not studies.exists() or not (studies / "fake.db").exists()


def test_the_check_leaves_nothing_behind(tmp_path: Path) -> None:
    """A destination that does not exist yet is fine (the tracker makes it): the check makes it to try it, then
    removes what it made."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    spec = TrackingSpec(mlflow=MlflowSpec(uri=f"sqlite:///{tmp_path}/ml/store/m.db"),
                        wandb=WandbSpec(mode="offline", dir=str(tmp_path / "wb" / "runs")))
    assert tracker_problems(spec) == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_unwritable_dir_with_tracking_optional_is_a_warning(tmp_path: Path, studies: Path) -> None:
    pytest.importorskip("wandb")
    space = fake_space(tmp_path, study={"n_trials": 1}, tracking={"wandb": {"mode": "offline",
                                                                            "dir": str(_regular_file(tmp_path))}})
    res = run_cli(["search", "--space", str(space), "--tracking-optional"], studies, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "warning:" in res.stderr and "runs without wandb tracking" in res.stderr and "is not a directory" in \
        res.stderr
    assert len(load(studies, "fake").trials) == 1
