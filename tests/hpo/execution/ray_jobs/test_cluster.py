"""What a trial asks of a Ray cluster and what the cluster has free (:mod:`hpo.execution.ray_jobs._cluster`), without
Ray: packing and admission on node views; the dashboard's replies read from a real HTTP server on 127.0.0.1 that
answers as Ray's dashboard does (its cluster status, its node summary, a 401); the auth token; one line for a cluster
that cannot be reached, from the CLI too. A real cluster: ``test_ray_study.py``."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hpo.execution.ray_jobs import (
    META_STUDY,
    JobResources,
    NodeView,
    RayClusterError,
    cluster_view,
    dashboard_url,
    fits_now,
    packs,
    stop_and_wait,
    study_jobs,
)
from hpo.execution.ray_jobs._cluster import AUTH_HINT, agent_answers, check_agent, ray_token
from tests.hpo.conftest import fake_space, run_cli

PY = sys.executable


def node(name: str, gpus: float, used: float = 0.0) -> NodeView:
    return NodeView(name, {"GPU": gpus, "CPU": 2.0, name: 1.0}, {"GPU": used})


def test_a_two_node_trial_fits_only_when_both_nodes_are_free() -> None:
    big, small = JobResources(2, {"GPU": 2.0}), JobResources(1, {"GPU": 2.0})
    nodes = [node("nodeA", 2), node("nodeB", 2)]
    assert fits_now(nodes, big, [])[0]
    assert not fits_now(nodes, big, [small])[0]  # a study's own admitted trial: not yet visible to Ray
    assert not fits_now([node("nodeA", 2, used=2), node("nodeB", 2)], big, [])[0]  # Ray sees one busy
    assert fits_now(nodes, small, [small])[0] and not fits_now(nodes, small, [small, small])[0]
    pinned = JobResources(1, {"GPU": 1.0, "node_b": 1.0})  # custom resources are taken per node too
    assert packs([{"GPU": 2, "node_b": 1}], [pinned]) and not packs([{"GPU": 2, "node_b": 1}], [pinned, pinned])
    assert not packs([{"GPU": 2, "node_b": 1}], [big])
    with pytest.raises(RayClusterError, match=r"needs 3 node\(s\) with GPU=2 each; the cluster has 2 alive"):
        fits_now(nodes, JobResources(3, {"GPU": 2.0}), [])


def test_a_ray_study_without_a_reachable_cluster_is_one_line(tmp_path: Path) -> None:
    studies = tmp_path / "studies"
    space = fake_space(tmp_path, trial={"command": [PY, "x.py"], "executor": "ray"})
    res = run_cli(["search", "--space", str(space)], studies, timeout=120, RAY_ADDRESS="")
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "no cluster is named: set trial.ray.address, --ray-address or $RAY_ADDRESS" in res.stderr
    res = run_cli(["search", "--space", str(space), "--ray-address", "http://127.0.0.1:9"], studies, timeout=120)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "Ray dashboard http://127.0.0.1:9 cannot be reached" in res.stderr.strip().splitlines()[-1]
    res = run_cli(["search", "--space", str(space), "--ray-address", "ray://head:10001"], studies, timeout=120)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "--ray-address: 'ray://head:10001': expected the dashboard's address" in res.stderr
    assert not studies.exists() or not list(studies.glob("*.db"))  # refused before any study was made


def test_a_claim_round_trips_through_its_stored_form_and_says_what_it_needs() -> None:
    claim = JobResources(2, {"GPU": 1, "node_b": 1.0})
    assert JobResources.from_claim(json.loads(json.dumps(claim.as_claim()))) == JobResources(2, {"GPU": 1.0,
                                                                                                  "node_b": 1.0})
    assert claim.describe() == "2 node(s) with GPU=1, node_b=1 each" and JobResources().describe() == \
        "1 node(s) with nothing each"
    assert NodeView("n", {"nodeB": 2.0, "GPU": 4.0}, {"GPU": 1.5}).free("node_b") == 2.0  # the dashboard's camelCase
    assert NodeView("n", {"GPU": 4.0}, {"GPU": 1.5}).free("GPU") == 2.5
    assert dashboard_url(" head:8265/ ") == "http://head:8265" and dashboard_url("https://h/") == "https://h"


class DashboardServer(HTTPServer):
    """Ray's dashboard as far as the driver reads it: ``replies`` maps a path to (status, JSON); ``auth`` records the
    Authorization header of each request."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Dashboard)
        self.replies: dict[str, tuple[int, Any]] = {}
        self.auth: list[str | None] = []


class Dashboard(BaseHTTPRequestHandler):
    server: DashboardServer

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        status, body = self.server.replies.get(self.path.split("?")[0], (404, {}))
        self.server.auth.append(self.headers.get("Authorization"))
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def dashboard() -> Iterator[DashboardServer]:
    server = DashboardServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _address(server: HTTPServer) -> str:
    return f"127.0.0.1:{server.server_address[1]}"


def _summary(agent_port: int) -> dict[str, Any]:
    return {"data": {"summary": [{"raylet": {"isHeadNode": False, "dashboardAgentListenPort": -1}},
                                 {"raylet": {"isHeadNode": True, "dashboardAgentListenPort": agent_port}}]}}


def test_the_nodes_are_read_from_the_dashboard_s_cluster_status(dashboard: DashboardServer) -> None:
    # per node, each resource as [used, total]
    usage = {"n1": {"GPU": [1.0, 2.0], "CPU": [0.0, 8.0], "nodeA": [0.0, 1.0]}, "n2": {"GPU": [0.0, 2.0]}}
    dashboard.replies["/api/cluster_status"] = (200, {"data": {"clusterStatus": {
        "time": 1700000000.5, "loadMetricsReport": {"usageByNode": usage}}}})
    dashboard.replies["/nodes"] = (200, _summary(52365))
    nodes, when = cluster_view(_address(dashboard))
    assert when == 1700000000.5
    assert nodes == [NodeView("n1", {"GPU": 2.0, "CPU": 8.0, "nodeA": 1.0}, {"GPU": 1.0, "CPU": 0.0, "nodeA": 0.0}),
                     NodeView("n2", {"GPU": 2.0}, {"GPU": 0.0})]
    assert nodes[0].free("node_a") == 1.0 and nodes[0].free("GPU") == 1.0


def test_a_head_whose_job_agent_did_not_start_is_one_line(dashboard: DashboardServer) -> None:
    dashboard.replies["/nodes"] = (200, _summary(-1))
    assert agent_answers(_address(dashboard)) is False
    with pytest.raises(RayClusterError, match=r"has no job agent to take jobs \('No available agent'\).*"
                                              r"--dashboard-agent-listen-port"):
        check_agent(_address(dashboard), wait_s=0)
    dashboard.replies["/nodes"] = (200, {"data": {"summary": []}})
    assert agent_answers(_address(dashboard)) is True  # a Ray that does not say: taken as up


def test_a_dashboard_that_asks_for_a_token_is_sent_one_and_told_how(dashboard: DashboardServer,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    dashboard.replies["/api/cluster_status"] = (401, {})
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with pytest.raises(RayClusterError) as err:
        cluster_view(_address(dashboard))
    assert str(err.value) == f"Ray dashboard http://{_address(dashboard)} refused the request ({AUTH_HINT})"
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "tok-123")
    with pytest.raises(RayClusterError):
        cluster_view(_address(dashboard))
    assert dashboard.auth == [None, "Bearer tok-123"]


def test_the_token_is_ray_s_own_choice_of_variable_then_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-env")
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    assert ray_token() is None  # not asked for: never sent
    monkeypatch.setenv("RAY_AUTH_MODE", "TOKEN")
    assert ray_token() == "from-env"
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    (tmp_path / "tok").write_text(" from-file \n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "tok"))
    assert ray_token() == "from-file"
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "missing"))
    assert ray_token() is None


def test_an_unreachable_dashboard_is_one_line() -> None:
    with pytest.raises(RayClusterError, match=r"^Ray dashboard http://127.0.0.1:9 cannot be reached \("):
        cluster_view("127.0.0.1:9")


class Client:
    """The job client's calls the driver makes to list and stop a study's jobs."""

    def __init__(self, statuses: list[str]) -> None:
        self.statuses, self.stopped = statuses, 0

    def get_job_status(self, sid: str) -> Any:
        return SimpleNamespace(value=self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0])

    def stop_job(self, sid: str) -> None:
        self.stopped += 1

    def list_jobs(self) -> list[Any]:
        return [SimpleNamespace(metadata={META_STUDY: "s"}, submission_id="a"), SimpleNamespace(metadata=None),
                SimpleNamespace(metadata={META_STUDY: "other"})]


def test_a_study_s_jobs_and_a_stop_waited_for() -> None:
    assert [j.submission_id for j in study_jobs(Client(["RUNNING"]), "s")] == ["a"]
    done = Client(["SUCCEEDED"])
    assert stop_and_wait(done, "a", 5) == "SUCCEEDED" and done.stopped == 0  # over already: not asked
    running = Client(["RUNNING", "RUNNING", "STOPPED"])
    assert stop_and_wait(running, "a", 30) == "STOPPED" and running.stopped == 1
    stuck = Client(["RUNNING"])
    assert stop_and_wait(stuck, "a", 0) == "RUNNING"  # the status it still had
