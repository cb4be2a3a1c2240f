"""The interface both trial executors offer the study loop (:mod:`hpo.execution._executor`): a local process and a
Ray job (here against the fake job client of ``ray_jobs/test_job.py``) running the same trial give the study loop the
same :class:`RunResult` (steps seen, last step, a stop decided on a metrics line, no failure), and each records when
it started the trial. Built through the executors' own tests' helpers, so a change to how one is built is made once."""

from __future__ import annotations

import sys
import typing
from pathlib import Path

import pytest

from hpo.execution import RunResult, TrialExecutor
from tests.hpo.execution.ray_jobs.test_job import FakeClient, job_log, run_job
from tests.hpo.execution.test_runner import run_argv

# a trainer that logs steps 1..3 (what job_log(3, ...) sends through the job's log), then exits 0
TRAINER = ("import json, sys\nwith open(sys.argv[1], 'w') as fh:\n    for s in range(1, 4):\n"
           "        fh.write(json.dumps({'step': s, 'data': {'score': float(s)}}) + '\\n')\n")


def _local(tmp_path: Path, **kw: typing.Any) -> RunResult:
    result, _ = run_argv(tmp_path / "local", [sys.executable, "-c", TRAINER, "{metrics}"], **kw)
    return result


def test_the_interface_is_a_run_and_the_time_the_trial_started() -> None:
    assert [m for m in vars(TrialExecutor) if not m.startswith("_")] == ["run"]
    assert typing.get_type_hints(TrialExecutor) == {"spawned_at": float | None}
    assert typing.get_type_hints(TrialExecutor.run)["return"] is RunResult


def test_a_local_process_and_a_ray_job_report_the_same_trial_alike(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "local").mkdir()
    seen: dict[str, list[tuple[int, dict[str, float]]]] = {"local": [], "ray": []}
    local = _local(tmp_path, on_metrics=lambda step, data: seen["local"].append((step, data)))
    job, ray = run_job(tmp_path, monkeypatch, FakeClient(job_log(3, {"exit": 0, "peak_kb": 1024})),
                       on_metrics=lambda step, data: seen["ray"].append((step, data)))
    assert isinstance(local, RunResult) and isinstance(ray, RunResult)
    assert seen["local"] == seen["ray"] == [(s, {"score": float(s)}) for s in (1, 2, 3)]
    for result in (local, ray):
        assert (result.exit_code, result.stop, result.last_step, result.failure) == (0, None, 3, None)
        assert result.first_metric_s is not None and result.wall_time_s >= 0
    assert job.spawned_at is not None


def test_a_stop_decided_on_a_metrics_line_is_the_result_s_stop_for_both(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "local").mkdir()
    slow = TRAINER.replace("for s in range(1, 4):", "import time\n    for s in range(1, 4):") + \
        "    fh.flush()\n    time.sleep(600)\n"  # stays alive until stopped
    local, _ = run_argv(tmp_path / "local", [sys.executable, "-c", slow, "{metrics}"],
                        on_metrics=lambda step, data: "pruned" if step == 2 else None)
    _, ray = run_job(tmp_path, monkeypatch, FakeClient(job_log(3, {"exit": -15}), done_after=10**6),
                     on_metrics=lambda step, data: "pruned" if step == 2 else None)
    assert local.stop == ray.stop == "pruned"
    assert local.exit_code is not None and local.exit_code != 0 and ray.exit_code == -15
