"""The ``tracking:`` section and ``--tracking``: bad input is one line naming the file (or flag), key and value, before
any study exists; a password in a URI is never printed nor stored; a tracker that cannot be used stops the study
before it starts unless ``--tracking-optional``."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from hpo.backends import load_space
from hpo.experiment._space import SpaceError
from hpo.experiment._tracking import MlflowSpec, TrackingSpec, WandbSpec, apply_flags, redact_uri
from hpo.tracking._check import tracker_problems
from tests.hpo.conftest import fake_space, load, run_cli
from tests.hpo.tracking.conftest import free_port

SECRET = "s3cr3t-pw"


def _load(tmp_path: Path, tracking: Any) -> TrackingSpec:
    return load_space(str(fake_space(tmp_path, tracking=tracking)), check=False).tracking


def test_the_section_parses_with_defaults(tmp_path: Path) -> None:
    assert _load(tmp_path, None) == TrackingSpec() and not TrackingSpec().enabled
    spec = _load(tmp_path, {"mlflow": {"uri": "http://h:5000"}, "wandb": {}})
    assert spec.mlflow == MlflowSpec(uri="http://h:5000", experiment="verl-hpo")
    assert spec.wandb == WandbSpec(project="verl-hpo", entity=None, mode="online", dir=None)
    assert spec.flush_s == 60.0


@pytest.mark.parametrize(("tracking", "where", "shown"), [
    ({"mlflow": {"uri": "ftp://h"}}, "tracking.mlflow.uri", "'ftp://h'"),
    ({"mlflow": {"uri": f"http://me:{SECRET}@h:5000"}}, "tracking.mlflow.uri", "MLFLOW_TRACKING_PASSWORD"),
    ({"mlflow": {"experiment": ""}}, "tracking.mlflow.experiment", "''"),
    ({"mlflow": {"url": "http://h"}}, "tracking.mlflow.url", "unknown field"),
    ({"wandb": {"mode": "dryrun"}}, "tracking.wandb.mode", "'dryrun'"),
    ({"wandb": {"project": "a b/c"}}, "tracking.wandb.project", "'a b/c'"),
    ({"wandb": "yes"}, "tracking.wandb", "'yes'"),
    ({"flush_s": -1}, "tracking.flush_s", "-1"),
    ({"neptune": {}}, "tracking.neptune", "unknown field"),
])
def test_bad_sections_are_one_line_naming_file_key_value(tmp_path: Path, tracking: Any, where: str,
                                                         shown: str) -> None:
    with pytest.raises(SpaceError) as info:
        _load(tmp_path, tracking)
    msg = str(info.value)
    assert msg.count("\n") == 0 and msg.startswith(str(tmp_path / "fake.yaml")) and where in msg and shown in msg
    assert SECRET not in msg


def test_flags_replace_the_section() -> None:
    base = TrackingSpec(mlflow=MlflowSpec(uri="http://a:1", experiment="e"), flush_s=5)
    spec = apply_flags(base, ["mlflow=http://u:pw@b:2", "wandb=offline"], SpaceError)
    assert spec.mlflow == MlflowSpec(uri="http://u:pw@b:2", experiment="e") and spec.wandb is not None
    assert spec.wandb.mode == "offline" and spec.flush_s == 5
    assert apply_flags(spec, ["off"], SpaceError) == TrackingSpec(flush_s=5)
    with pytest.raises(SpaceError, match="expected mlflow"):
        apply_flags(base, ["neptune"], SpaceError)
    with pytest.raises(SpaceError) as info:
        apply_flags(base, [f"mlflow=gopher://u:{SECRET}@h"], SpaceError)
    assert SECRET not in str(info.value) and "u:***@h" in str(info.value)
    assert redact_uri(f"https://u:{SECRET}@h:1/p") == "https://u:***@h:1/p"


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


def test_the_start_line_says_where_a_database_backend_s_artifacts_go(tmp_path: Path) -> None:
    from hpo.tracking import describe

    line = describe(TrackingSpec(mlflow=MlflowSpec(uri=f"sqlite:///{tmp_path}/m.db")), tmp_path / "studies")
    assert f"artifacts of a new experiment in {tmp_path / 'studies' / 'mlflow-artifacts'}" in line
    assert "artifacts" not in describe(TrackingSpec(mlflow=MlflowSpec(uri="http://h:5000")), tmp_path)
