"""Studies logged to Weights & Biases in offline mode (no network): a run directory per trial chain, grouped by
study, with the trial's parameters as config, its metrics as history and its outcome as summary, read back with
W&B's own reader of the ``.wandb`` transaction log (``wandb leet inspect --json``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState

from tests.hpo.conftest import fake_space, load, run_cli

pytest.importorskip("wandb")
WANDB = Path(sys.executable).with_name("wandb")


def records(run_dir: Path) -> list[dict[str, Any]]:
    """Every record of the run's ``.wandb`` file, as W&B's own reader prints them."""
    (wfile,) = run_dir.glob("run-*.wandb")
    out = subprocess.run([str(WANDB), "leet", "inspect", "--json", str(wfile)], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def read_run(run_dir: Path) -> dict[str, Any]:
    recs = records(run_dir)
    run = [r["run"] for r in recs if r["type"] == "run"][-1]
    config: dict[str, Any] = {}
    for r in recs:
        if r["type"] == "run":
            config.update(r["run"].get("config", {}).get("update", {}))
    summary: dict[str, Any] = {}
    for r in recs:
        if r["type"] == "summary":
            summary.update(r["summary"].get("update", {}))
    history = [(int(r["history"]["step"]["num"]), r["history"]["item"]) for r in recs if r["type"] == "history"]
    return {"run": run, "config": config, "summary": summary, "history": history,
            "exit": [r["exit"] for r in recs if r["type"] == "exit"]}


@pytest.mark.slow  # ~30-100 s on 2 busy cores: make test-slow (CI runs it)
def test_offline_runs_per_trial_grouped_by_study(tmp_path: Path, studies: Path) -> None:
    wandb_dir = tmp_path / "wb"
    space = fake_space(tmp_path, study={"n_trials": 2},
                       tracking={"wandb": {"project": "hpo-test", "mode": "offline", "dir": str(wandb_dir)}})
    res = run_cli(["search", "--space", str(space)], studies, WANDB_SILENT="true")
    assert res.returncode == 0, res.stderr
    assert "W&B project hpo-test (offline)" in res.stdout
    study = load(studies, "fake")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    key = study._storage.get_study_system_attrs(study._study_id)["hpo:tracking:key"]
    dirs = {p.name.rsplit("-", 1)[-1]: p for p in (wandb_dir / "wandb").glob(f"offline-run-*-{key}-*")}
    assert set(dirs) == {"t0", "t1", "study"}, sorted(dirs)
    for t in study.trials:
        got = read_run(dirs[f"t{t.number}"])
        run = got["run"]
        assert run["run_group"] == "fake" and run["project"] == "hpo-test"
        assert run["run_id"] == f"{key}-t{t.number}" and run["display_name"] == f"fake #{t.number}"
        assert run["job_type"] == "tune"
        assert got["config"]["x"] == pytest.approx(t.params["x"])
        assert got["config"]["verl_hpo"]["chain"] == t.number
        steps = [s for s, item in got["history"] if "eval/reward_mean" in item]
        assert steps == [0, 2, 4, 6, 8, 10]
        assert [s for s, _ in got["history"]] == list(range(11))
        assert got["history"][-1][1]["eval/reward_mean"] == pytest.approx(t.value)
        summary = got["summary"]
        assert summary["objective/eval/reward_mean"] == pytest.approx(t.value)
        assert summary["verl_hpo/outcome"] == "ok" and summary["verl_hpo/state"] == "COMPLETE"
        assert summary["peak_memory_gb"] == pytest.approx(t.user_attrs["peak_memory_gb"])
        assert summary["verl_hpo/diagnosis"] == "healthy"
        assert got["exit"] and got["exit"][-1].get("exit_code", 0) == 0
    best = study.best_trial
    study_run = read_run(dirs["study"])
    assert study_run["run"]["job_type"] == "study" and study_run["run"]["run_group"] == "fake"
    assert study_run["summary"]["best_value"] == pytest.approx(best.value)
    assert study_run["summary"]["best_trial"] == best.number
