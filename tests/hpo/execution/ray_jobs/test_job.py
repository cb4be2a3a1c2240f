"""``RayJob.run`` against a fake job client (no cluster): the job's log read for metrics, a stop decided on a metrics
line carried out (``stop_job``, then waited for), a dashboard that stops answering for a while said once each way,
and the ``RunResult`` built from the entrypoint's end record; the job's environment (:func:`job_env`)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hpo.execution.ray_jobs import RayJob, _entry, job_env
from hpo.execution.ray_jobs import _job as job_module


class FakeClient:
    """A job that runs until ``get_job_info`` has been asked ``done_after`` times (or is stopped); its status can not
    be read the first ``silent`` times."""

    def __init__(self, log: str, done_after: int = 3, silent: int = 0) -> None:
        self.log, self.done_after, self.silent = log, done_after, silent
        self.status, self.asked, self.stopped = "RUNNING", 0, 0
        self.submitted: dict[str, Any] = {}

    def submit_job(self, **kwargs: Any) -> None:
        self.submitted = kwargs

    def get_job_info(self, sid: str) -> Any:
        self.asked += 1
        if self.asked <= self.silent:
            raise ConnectionError("dashboard restarting\nsecond line")
        if self.asked >= self.done_after and self.status == "RUNNING":
            self.status = "SUCCEEDED"
        return SimpleNamespace(status=SimpleNamespace(value=self.status))

    def get_job_status(self, sid: str) -> Any:
        return SimpleNamespace(value=self.status)

    def stop_job(self, sid: str) -> None:
        self.stopped += 1
        self.status = "STOPPED"

    async def tail_job_logs(self, sid: str) -> AsyncIterator[str]:
        yield self.log

    def get_job_logs(self, sid: str) -> str:
        return self.log


def job_log(steps: int, end: dict[str, Any]) -> str:
    lines = [f"{_entry.PREFIX}{json.dumps({'step': s, 'data': {'score': float(s)}})}\n" for s in range(1, steps + 1)]
    return "starting\n" + "".join(lines) + "a traceback line\n" + f"{_entry.END}{json.dumps(end)}\n"


def run_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client: FakeClient, **kwargs: Any) -> tuple[Any, Any]:
    monkeypatch.setattr(job_module, "job_client", lambda address: client)
    monkeypatch.setattr(job_module, "STATUS_TICK_S", 0.1)
    job = RayJob(argv=["python3", "train.py"], env={}, log_dir=tmp_path / "trial", metrics_path=tmp_path / "m.jsonl",
                 address="http://head:8265", submission_id="verl-hpo-t0", **kwargs)
    return job, job.run()


def test_a_job_that_succeeds_is_read_to_its_end_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    client = FakeClient(job_log(3, {"exit": 0, "peak_kb": 2048}))
    job, res = run_job(tmp_path, monkeypatch, client, on_metrics=lambda step, data: seen.append(step))
    assert client.submitted["submission_id"] == "verl-hpo-t0" and client.stopped == 0
    assert seen == [1, 2, 3] and job.final_status == "SUCCEEDED"
    assert (res.exit_code, res.stop, res.last_step, res.failure) == (0, None, 3, None)
    assert res.peak_memory_gb == 2048 / 2**20 and res.memory_mechanism == "ray-job" and res.first_metric_s is not None
    assert (tmp_path / "trial" / "stderr.log").read_text() == "starting\na traceback line\n"
    assert len((tmp_path / "trial" / "job-metrics.jsonl").read_text().splitlines()) == 3


def test_a_stop_decided_on_a_metrics_line_stops_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient(job_log(3, {"exit": -15}), done_after=10**6)
    job, res = run_job(tmp_path, monkeypatch, client,
                       on_metrics=lambda step, data: "pruned" if step == 2 else None)
    assert client.stopped == 1 and job.final_status == "STOPPED"
    assert (res.exit_code, res.stop, res.last_step) == (-15, "pruned", 3)  # later lines are still recorded


def test_a_dashboard_that_stops_answering_is_said_once_each_way(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_module, "SILENT_S", 0.0)
    notes: list[str] = []
    client = FakeClient(job_log(1, {"exit": 0}), done_after=5, silent=2)
    _, res = run_job(tmp_path, monkeypatch, client, note=notes.append)
    assert res.exit_code == 0 and len(notes) == 2, notes
    assert "stopped answering (dashboard restarting)" in notes[0] and "answers again after" in notes[1]


def test_job_env_carries_only_the_trials_own_entries() -> None:
    base = {"PATH": "/usr/bin", "HOME": "/root", "X": "1"}
    env = {**base, "X": "2", "VERL_HPO_TRIAL": "3", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": "/fake",
           "VERL_HPO_DRIVER": "{}"}  # a driver's orphan sweep on the same host must never take a job for its orphan
    assert job_env(env, base) == {"X": "2", "VERL_HPO_TRIAL": "3", "PYTHONPATH": "/fake"}
