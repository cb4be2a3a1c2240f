"""A Ray head whose job agent cannot start (another socket holds its port: what a second Ray on one host does) and a
head killed under a running trial (issue 34, item 11): one line at once, never a 500 traceback or minutes of
silence. Each test starts a head of its own (~20-40 s on 2 busy cores): slow."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpo.execution import TrialRun
from hpo.execution.ray_jobs import RayClusterError, RayJob, cluster_view
from hpo.execution.ray_jobs import _job as job_module
from tests.hpo.conftest import FAKE_TRAINER, PY, ROOT, cli_env, fake_space, load
from tests.hpo.execution.ray_jobs.conftest import RayCluster, head_only, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def agentless() -> Iterator[RayCluster]:
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    try:
        with head_only(agent_port=held.getsockname()[1]) as cluster:
            yield cluster
    finally:
        held.close()


def _space(tmp_path: Path, cluster: RayCluster, step_s: float = 0.05) -> Path:
    return fake_space(tmp_path, overrides={"trainer.total_training_steps": 10, "trainer.test_freq": 2,
                                           "fake.step_s": step_s},
                      trial={"command": [PY, str(FAKE_TRAINER), "train"], "executor": "ray",
                             "ray": {"address": cluster.address, "num_gpus": 1, "num_cpus": 1}})


def test_a_head_without_job_agent_stops_the_search_before_the_study(agentless: RayCluster, tmp_path: Path) -> None:
    studies = tmp_path / "studies"
    res = subprocess.run([PY, "-m", "hpo", "search", "--space", str(_space(tmp_path, agentless)), "--studies-dir",
                          str(studies)], cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "no job agent" in lines[0], res.stderr
    assert "--dashboard-agent-listen-port" in lines[0] and agentless.address in lines[0]
    assert not (studies / "fake.db").exists()


def test_a_submission_without_job_agent_is_retried_then_one_line(agentless: RayCluster, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the check (the agent went away since): the dashboard's HTTP 500 is tried again for a bounded
    window, said once, then RayClusterError naming the agent (the driver's one line), not RuntimeError 500."""
    monkeypatch.setattr(job_module, "AGENT_RETRY_S", 1.0)
    said: list[str] = []
    job = RayJob(TrialRun([PY, str(FAKE_TRAINER), "train"], {}, tmp_path / "t", tmp_path / "m"),
                 address=agentless.address, submission_id="verl-hpo-agentless-0", note=said.append)
    with pytest.raises(RayClusterError, match="no job agent.*--dashboard-agent-listen-port"):
        job.run()
    assert len(said) == 1 and "job agent does not answer" in said[0], said


@pytest.mark.timeout(900)  # a hang guard: a driver that neither says it nor ends
def test_a_head_killed_mid_trial_is_said_at_once(tmp_path: Path) -> None:
    """The driver says the cluster stopped answering while it still waits for it, before it gives up on it
    (DASHBOARD_GONE_S) or the trial ends: not silence until then. How soon (SILENT_S) is a constant, not timed here."""
    studies = tmp_path / "studies"
    with head_only() as cluster:
        cluster_view(cluster.address)
        proc = subprocess.Popen([PY, "-m", "hpo", "search", "--space", str(_space(tmp_path, cluster, step_s=3.0)),
                                 "--studies-dir", str(studies)], cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            metrics = studies / "fake" / "trials" / "0" / "metrics.jsonl"
            wait_for(lambda: metrics.is_file() and metrics.read_text().strip(), 240, "trial 0's first metrics")
            cluster.stop()
            assert proc.stdout is not None
            before: list[str] = []  # what the driver printed until it said so
            for line in proc.stdout:
                if "stopped answering" in line:
                    break
                before.append(line)
            else:
                raise AssertionError("the driver never said the cluster stopped answering:\n" + "".join(before[-20:]))
            assert cluster.address in line and "waiting up to" in line
            assert proc.poll() is None and not [b for b in before if "has not answered for" in b], before[-20:]
        finally:
            proc.kill()
            proc.wait()
    assert len(load(studies, "fake").trials) >= 1
