"""Studies logged to a real MLflow tracking server (``mlflow server``, SQLite backend, started by the session fixture),
read back through ``MlflowClient``: one parent run per study, one nested run per trial chain with its parameters,
curves and outcome; a retried trial continues its run; a server that goes away mid-study loses nothing; the
MLflow UI lists the study's runs in the browser the dashboard tests use."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState

from hpo.tracking._spool import is_locked
from tests.hpo.conftest import PY, ROOT, cli_env, fake_space, load, run_cli
from tests.hpo.tracking.conftest import MlflowServer

mlflow = pytest.importorskip("mlflow")
EVAL_STEPS = [0, 2, 4, 6, 8, 10]
SECRET = "pw-5f1c9e"
PROBE = ("import runpy, sys\nout = sys.argv.pop()\n"
         "try:\n    runpy.run_module('hpo', run_name='__main__')\n"
         "finally:\n    open(out, 'w').write(' '.join(m for m in ('mlflow', 'wandb', 'plotly', 'sklearn')"
         " if m in sys.modules))\n")


def wait_for(what: str, cond: Callable[[], Any], timeout: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def tracked_space(tmp_path: Path, server: MlflowServer, experiment: str, flush_s: float = 120,
                  **sections: Any) -> Path:
    return fake_space(tmp_path, tracking={"mlflow": {"uri": server.uri, "experiment": experiment},
                                          "flush_s": flush_s}, **sections)


def runs(server: MlflowServer, experiment: str) -> tuple[Any, list[Any]]:
    """(the study's parent run, its trial runs by chain)."""
    client = mlflow.MlflowClient(server.uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment}"
    found = client.search_runs([exp.experiment_id], max_results=1000)
    studies = [r for r in found if r.data.tags.get("verl_hpo.kind") == "study"]
    assert len(studies) == 1, [r.info.run_name for r in found]
    trials = sorted((r for r in found if r.data.tags.get("verl_hpo.kind") == "trial"),
                    key=lambda r: int(r.data.tags["verl_hpo.chain"]))
    return studies[0], trials


def history(server: MlflowServer, run_id: str, key: str) -> list[tuple[int, float]]:
    pts = mlflow.MlflowClient(server.uri).get_metric_history(run_id, key)
    return sorted((m.step, m.value) for m in pts)


# ----------------------------------------------------------------------------- one study, several checks
@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory, mlflow_server: MlflowServer) -> dict[str, Any]:
    """A 3-trial study logged to MLflow, run by a driver that records which heavy modules it loaded."""
    tmp = tmp_path_factory.mktemp("searched")
    experiment = f"study-{uuid.uuid4().hex[:6]}"
    space = tracked_space(tmp, mlflow_server, experiment)
    studies, loaded = tmp / "studies", tmp / "loaded.txt"
    # the URI on the command line carries a password (the test server ignores basic auth): it must go nowhere
    uri = mlflow_server.uri.replace("http://", f"http://me:{SECRET}@")
    res = subprocess.run([PY, "-c", PROBE, "search", "--space", str(space), "--tracking", f"mlflow={uri}",
                          "--studies-dir", str(studies), str(loaded)], cwd=ROOT, env=cli_env(), capture_output=True,
                         text=True, timeout=600)
    return {"res": res, "experiment": experiment, "studies": studies, "loaded": loaded.read_text()}


@pytest.mark.slow  # ~30-100 s on 2 busy cores: make test-slow (CI runs it)
def test_one_nested_run_per_trial_with_params_curves_and_outcome(searched: dict[str, Any],
                                                                  mlflow_server: MlflowServer) -> None:
    res = searched["res"]
    assert res.returncode == 0, res.stderr
    assert "tracking: MLflow http://me:***@127.0.0.1" in res.stdout and "not everything reached" not in res.stderr
    study = load(searched["studies"], "fake")
    parent, trials = runs(mlflow_server, searched["experiment"])
    assert parent.info.run_name == "fake" and parent.data.tags["verl_hpo.study"] == "fake"
    assert parent.info.status == "FINISHED"
    assert [int(r.data.tags["verl_hpo.chain"]) for r in trials] == [0, 1, 2]
    for run, t in zip(trials, study.trials, strict=True):
        tags, metrics = run.data.tags, run.data.metrics
        assert tags["mlflow.parentRunId"] == parent.info.run_id, "nested under the study's run"
        assert run.data.params == {"x": str(t.params["x"])}
        assert run.info.status == "FINISHED" and tags["verl_hpo.state"] == "COMPLETE"
        assert run.info.start_time <= run.info.end_time, "the run spans the trial, not the tracker's lag"
        assert tags["verl_hpo.outcome"] == "ok" and tags["verl_hpo.diagnosis"] == "healthy"
        assert tags["verl_hpo.job_type"] == "tune" and tags["verl_hpo.attempts"] == str(t.number)
        # every metric of the metrics file is a curve by step, each step once
        curve = history(mlflow_server, run.info.run_id, "eval/reward_mean")
        assert [s for s, _ in curve] == EVAL_STEPS
        assert [v for _, v in curve] == pytest.approx([t.intermediate_values[s] for s in EVAL_STEPS])
        assert [s for s, _ in history(mlflow_server, run.info.run_id, "critic/score/mean")] == list(range(11))
        assert metrics["objective/eval/reward_mean"] == pytest.approx(t.value)
        assert metrics["peak_memory_gb"] == pytest.approx(t.user_attrs["peak_memory_gb"])
        assert metrics["wall_time_s"] == pytest.approx(t.user_attrs["wall_time_s"])
    # the study run: best value so far, importances, the dashboard page
    assert parent.data.metrics["best_value"] == pytest.approx(study.best_value)
    assert parent.data.tags["verl_hpo.best_trial"] == str(study.best_trial.number)
    assert parent.data.metrics["importance/x"] == pytest.approx(1.0)
    best = history(mlflow_server, parent.info.run_id, "best_value")
    assert best and best[-1] == (3, pytest.approx(study.best_value))
    arts = {a.path: a.file_size for a in mlflow.MlflowClient(mlflow_server.uri).list_artifacts(parent.info.run_id)}
    assert arts.get("dashboard.html", 0) > 100_000
    # the run ids are in the study's storage, so a retry on another host finds its run
    system = study._storage.get_study_system_attrs(study._study_id)
    assert {system[f"hpo:tracking:{r.data.tags['verl_hpo.chain']}"]["mlflow"] for r in trials} == \
        {r.info.run_id for r in trials}


@pytest.mark.slow  # its fixture starts an MLflow server and runs a search (~40 s): make test-slow (CI runs it)
def test_a_password_in_the_uri_is_never_printed_or_stored(searched: dict[str, Any]) -> None:
    res = searched["res"]
    assert res.returncode == 0, res.stderr
    assert "http://me:***@127.0.0.1" in res.stdout
    assert SECRET not in res.stdout + res.stderr
    for path in searched["studies"].rglob("*"):  # the study's database, spool, tracking log and state, W&B files
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def test_the_driver_never_loads_the_trackers(searched: dict[str, Any]) -> None:
    """mlflow and wandb are imported by the tracking process alone (issue 25: the driver stays light)."""
    assert searched["res"].returncode == 0, searched["res"].stderr
    assert searched["loaded"] == ""


# ----------------------------------------------------------------------------- retries
@pytest.mark.slow
def test_a_retried_trial_continues_its_run(tmp_path: Path, studies: Path, mlflow_server: MlflowServer) -> None:
    """The driver dies (SIGKILL) mid-trial; ``resume`` retries the trial as a new trial number, which continues the
    same MLflow run from the step the first attempt reached: one run, every step logged once."""
    experiment = f"retry-{uuid.uuid4().hex[:6]}"
    gate = tmp_path / "gate"
    gate.touch()  # the first attempt waits at step 5 until the driver is dead; the retry passes
    space = tracked_space(tmp_path, mlflow_server, experiment, study={"n_trials": 1},
                          overrides={"trainer.total_training_steps": 10, "trainer.test_freq": 2, "fake.step_s": 0.02,
                                     "fake.gate_at": 5, "fake.gate_file": str(gate)})
    proc = subprocess.Popen([PY, "-m", "hpo", "search", "--space", str(space), "--studies-dir", str(studies)],
                            cwd=ROOT, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    client = mlflow.MlflowClient(mlflow_server.uri)

    def logged_to_step_4() -> bool:
        exp = client.get_experiment_by_name(experiment)
        found = [] if exp is None else client.search_runs([exp.experiment_id], "tags.`verl_hpo.kind` = 'trial'")
        return bool(found) and int(found[0].data.tags.get("verl_hpo.last_step", -1)) >= 4

    try:
        wait_for("the first attempt's steps in MLflow", logged_to_step_4, timeout=300)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its trial; its tracking process has its own session
        proc.wait()
        gate.unlink()
    spool = next((studies / "fake" / "tracking").glob("spool-*.jsonl"))
    wait_for("the dead driver's tracking process to log what its trial wrote", lambda: not is_locked(spool))
    first = runs(mlflow_server, experiment)[1][0]
    res = run_cli(["resume", "--study", "fake"], studies, timeout=600)
    assert res.returncode == 0, res.stderr
    study = load(studies, "fake")
    retry = next(t for t in study.trials if t.state == TrialState.COMPLETE)
    assert retry.number == 1 and retry.system_attrs["retry_history"] == [0]
    _, trials = runs(mlflow_server, experiment)
    assert len(trials) == 1, "a retry continues its chain's run, never a second one"
    run = trials[0]
    assert run.info.run_id == first.info.run_id and run.info.status == "FINISHED"
    assert run.data.tags["verl_hpo.attempts"] == "0,1" and run.data.tags["verl_hpo.trial"] == "1"
    assert [s for s, _ in history(mlflow_server, run.info.run_id, "eval/reward_mean")] == EVAL_STEPS
    assert [s for s, _ in history(mlflow_server, run.info.run_id, "critic/score/mean")] == list(range(11))


# ----------------------------------------------------------------------------- a server outage
def search_until_logging(tmp_path: Path, studies: Path, mlflow_server: MlflowServer, experiment: str, flush_s: float,
                         n_trials: int, step_s: float) -> tuple[subprocess.Popen[str], Path]:
    """Start a search whose trial 0 waits at step 5 while ``<tmp>/gate`` exists; return it (and the gate) once that
    trial's first steps are in MLflow."""
    gate = tmp_path / "gate"
    gate.touch()
    space = tracked_space(tmp_path, mlflow_server, experiment, flush_s=flush_s, study={"n_trials": n_trials},
                          overrides={"trainer.total_training_steps": 10, "trainer.test_freq": 2, "fake.step_s": step_s,
                                     "fake.gate_at": 5, "fake.gate_file": str(gate)})
    proc = subprocess.Popen([PY, "-m", "hpo", "search", "--space", str(space), "--studies-dir", str(studies)],
                            cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    client = mlflow.MlflowClient(mlflow_server.uri)

    def first_run_logging() -> bool:
        exp = client.get_experiment_by_name(experiment)
        found = [] if exp is None else client.search_runs([exp.experiment_id], "tags.`verl_hpo.kind` = 'trial'")
        return bool(found) and int(found[0].data.tags.get("verl_hpo.last_step", -1)) >= 4

    try:
        wait_for("the first trial's steps in MLflow", first_run_logging, timeout=300)
    except BaseException:
        proc.kill()
        raise
    return proc, gate


@pytest.mark.slow
def test_a_server_outage_mid_study_loses_nothing(tmp_path: Path, studies: Path, mlflow_server: MlflowServer) -> None:
    """The server stops while trials run and comes back (same port, same database) after trials finished without
    it: the study never waits, and every trial's run, curve and outcome reach MLflow once, none twice."""
    experiment = f"outage-{uuid.uuid4().hex[:6]}"
    # trial 0 waits at step 5 until the server is gone; flush_s: a slow restart
    proc, gate = search_until_logging(tmp_path, studies, mlflow_server, experiment, 900, 4, 0.1)
    try:
        mlflow_server.stop()
        stopped = time.monotonic()
        gate.unlink()
        db = studies / "fake.db"
        wait_for("two trials finished while the server is down", lambda: sum(
            t.state == TrialState.COMPLETE for t in load(studies, "fake").trials) >= 2 if db.exists() else False)
        down_s = time.monotonic() - stopped
        mlflow_server.start()
        out, err = proc.communicate(timeout=1200)
    finally:
        if proc.poll() is None:
            proc.kill()
        if not mlflow_server.healthy():
            mlflow_server.start()
    assert proc.returncode == 0, err
    assert "not everything reached" not in err
    log = next((studies / "fake" / "tracking").glob("spool-*.log")).read_text()
    assert "unreachable" in log and "back after" in log, log
    study = load(studies, "fake")
    parent, trials = runs(mlflow_server, experiment)
    assert len(trials) == 4 and parent.info.status == "FINISHED"
    for run, t in zip(trials, study.trials, strict=True):
        assert run.info.status == "FINISHED" and run.data.tags["verl_hpo.outcome"] == "ok"
        curve = history(mlflow_server, run.info.run_id, "eval/reward_mean")
        assert [s for s, _ in curve] == EVAL_STEPS, f"trial {t.number}: {curve}"
        assert [s for s, _ in history(mlflow_server, run.info.run_id, "critic/score/mean")] == list(range(11))
        assert run.data.metrics["objective/eval/reward_mean"] == pytest.approx(t.value)
    assert parent.data.metrics["best_value"] == pytest.approx(study.best_value)
    print(json.dumps({"server_down_s": round(down_s, 1)}))


# 272 s on CI's machine of stop 64 (a real server stopped past flush_s, started again): make test-extended, not CI;
# CI runs `track` on real spools and tracking processes (tests/hpo/tracking/test_feed.py, test_sync.py) and a server
# outage mid-study against this server (above)
@pytest.mark.slow
@pytest.mark.extended
def test_track_logs_later_what_a_driver_could_not(tmp_path: Path, studies: Path, mlflow_server: MlflowServer) -> None:
    """The server is gone past ``tracking.flush_s``: the driver does not wait longer, says so in one line, and
    ``verl-hpo track`` logs the rest once the server is back, continuing the runs it had begun (no step twice)."""
    experiment = f"track-{uuid.uuid4().hex[:6]}"
    proc, gate = search_until_logging(tmp_path, studies, mlflow_server, experiment, 2, 2, 0.02)
    try:
        mlflow_server.stop()
        gate.unlink()
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
        mlflow_server.start()
    assert proc.returncode == 0, err
    left = [line for line in err.splitlines() if "not everything reached" in line]
    assert len(left) == 1 and "verl-hpo track --study fake" in left[0], err
    res = run_cli(["track", "--study", "fake"], studies, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "1 of 1 spool(s) of study fake fully logged" in res.stdout
    study = load(studies, "fake")
    parent, trials = runs(mlflow_server, experiment)
    assert len(trials) == 2 and parent.info.status == "FINISHED"
    for run, t in zip(trials, study.trials, strict=True):
        assert run.info.status == "FINISHED" and run.data.tags["verl_hpo.outcome"] == "ok"
        assert run.data.params == {"x": str(t.params["x"])}
        assert [s for s, _ in history(mlflow_server, run.info.run_id, "eval/reward_mean")] == EVAL_STEPS
        assert [s for s, _ in history(mlflow_server, run.info.run_id, "critic/score/mean")] == list(range(11))
    assert parent.data.metrics["best_value"] == pytest.approx(study.best_value)


# ----------------------------------------------------------------------------- the MLflow UI
@pytest.mark.slow
def test_the_mlflow_ui_lists_the_study_s_runs(searched: dict[str, Any], mlflow_server: MlflowServer) -> None:
    """Open the experiment in MLflow's own UI (real Chromium): the study's parent run and, expanded, its trial
    runs are listed (the UI is served by the test's server on 127.0.0.1; every other host is unresolvable)."""
    from tests.hpo.reporting.test_dashboard import ARTIFACTS, CHROME_ARGS, _need_browser

    assert searched["res"].returncode == 0, searched["res"].stderr
    sync_playwright, exe = _need_browser()
    parent, trials = runs(mlflow_server, searched["experiment"])
    url = f"{mlflow_server.uri}/#/experiments/{parent.info.experiment_id}/runs"
    with sync_playwright() as pw:
        args = [a for a in CHROME_ARGS if not a.startswith("--host-resolver-rules")]  # the server is on 127.0.0.1
        browser = pw.chromium.launch(executable_path=exe, headless=True,
                                     args=[*args, "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"])
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(url, wait_until="load", timeout=120_000)
            study_row = page.get_by_text("fake", exact=True).first
            study_row.wait_for(timeout=120_000)
            # the trial runs are nested under the study's run: expand it (the button in its run-name cell)
            cell = study_row.locator("xpath=ancestor::div[@role='gridcell']")
            cell.locator("button[data-component-id*='runnamecellrenderer']").click()
            for r in trials:
                page.get_by_text(r.info.run_name, exact=True).first.wait_for(timeout=60_000)
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "mlflow_ui_study_runs.png"), full_page=True)
        finally:
            browser.close()
