"""A real two-node Ray cluster on this host for the Ray-job tests, started once per session (Ray's start-up is
~20-40 s on 2 busy cores):

* head ``node_a``: ``ray start --head`` with 2 CPUs, 2 logical GPUs and custom resource ``node_a``, its dashboard
  (the job API) on a free port;
* ``node_b``: a second raylet joined to it (``ray start --address``) with 2 CPUs, 2 logical GPUs and ``node_b``.

Every port is a free one and the temp dir a private one, and each node's processes (raylet, agents, workers, job
entrypoints and their trainers) carry a marker in their environment: teardown (and a test that kills ``node_b``)
SIGKILLs exactly those, never another Ray on the machine (``ray stop`` would stop every Ray of this user)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.hpo.conftest import ROOT

RAY = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "ray"
MARK = "VERL_HPO_TEST_RAY_NODE"  # <temp dir>:<node name> in every process of a node
START_TIMEOUT_S = 240


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def node_processes(mark: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get(MARK) == mark:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def kill_node(mark: str) -> int:
    """SIGKILL every process of one node (as when its machine dies): those ``ray start`` started and all their
    descendants (the raylet's agents and workers, a job's entrypoint and trainer); the number killed."""
    procs = {p.pid: p for p in node_processes(mark)}
    for p in list(procs.values()):
        try:
            procs.update((c.pid, c) for c in p.children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    procs = list(procs.values())
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)
    return len(procs)


@dataclass
class RayCluster:
    """The test cluster: ``address`` is the dashboard URL trials are submitted to."""

    temp: Path
    env: dict[str, str]
    gcs_port: int = 0  # both drawn by start_head
    dashboard_port: int = 0
    marks: dict[str, str] = field(default_factory=dict)
    agent_port: int | None = None  # the dashboard agent's HTTP port (None: a free one)
    ray: Path = RAY  # the `ray` of the nodes' interpreter (what the cluster's workers and actors run in)
    cpus: int = 2  # logical CPUs and GPUs per node
    gpus: int = 2

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def _start(self, name: str, args: Callable[[], list[str]]) -> None:
        """``ray start`` for node ``name``, tried up to 5 times, every port drawn afresh each time (``args`` too: a
        port drawn once can be taken meanwhile by another test's Ray or trainer, and every try would then fail)."""
        mark = f"{self.temp}:{name}"
        self.marks[name] = mark
        for _attempt in range(5):  # `ray start` gives a raylet 30 s to register: not always enough on 2 busy cores
            ports = free_ports(7)
            if self.agent_port is not None:
                ports[2] = self.agent_port
            cmd = [str(self.ray), "start", "--num-cpus", str(self.cpus), "--num-gpus", str(self.gpus), "--resources",
                   json.dumps({name: 1}),
                   "--node-ip-address", "127.0.0.1", "--disable-usage-stats",
                   "--node-manager-port", str(ports[0]), "--object-manager-port", str(ports[1]),
                   "--dashboard-agent-listen-port", str(ports[2]), "--dashboard-agent-grpc-port", str(ports[3]),
                   "--metrics-export-port", str(ports[4]), "--runtime-env-agent-port", str(ports[5]),
                   "--min-worker-port", str(ports[6] + 1), "--max-worker-port", str(ports[6] + 60), *args()]
            res = subprocess.run(cmd, env={**self.env, MARK: mark}, capture_output=True, text=True,
                                 timeout=START_TIMEOUT_S)
            if res.returncode == 0:
                return
            kill_node(mark)
        last = (res.stderr.strip().splitlines() or ["(no stderr)"])[-1]  # the exception, first: a log may cut the rest
        raise AssertionError(f"ray start ({name}) failed 5 times, last: {last}\n{res.stdout[-3000:]}\n"
                             f"{res.stderr[-3000:]}")

    def start_head(self) -> None:
        def args() -> list[str]:
            self.gcs_port, self.dashboard_port, client_port = free_ports(3)
            return ["--head", "--port", str(self.gcs_port), "--dashboard-port", str(self.dashboard_port),
                    "--include-dashboard=true", "--dashboard-host", "127.0.0.1", "--temp-dir", str(self.temp),
                    "--ray-client-server-port", str(client_port)]

        self._start("node_a", args)

    def start_worker(self, name: str = "node_b") -> None:
        self._start(name, lambda: ["--address", f"127.0.0.1:{self.gcs_port}"])

    def alive_nodes(self) -> list[dict[str, object]]:
        from hpo.execution.ray_jobs import RayClusterError, cluster_view

        try:
            nodes, _ = cluster_view(self.address)
        except RayClusterError:
            return []
        return [dict(n.total) for n in nodes]

    def wait_nodes(self, names: set[str], timeout: float = START_TIMEOUT_S) -> None:
        """Until Ray's view (what admission reads) has exactly the nodes ``names`` (by their custom resource)."""
        from hpo.execution.ray_jobs._cluster import _camel

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = {n for n in ("node_a", "node_b") for t in self.alive_nodes() if _camel(n) in t}
            if seen == names and len(self.alive_nodes()) == len(names):
                return
            time.sleep(0.5)
        raise AssertionError(f"Ray's view never had exactly {names}: {self.alive_nodes()}")

    def kill(self, name: str) -> int:
        return kill_node(self.marks[name])

    def jobs(self, study: str) -> list[object]:
        from hpo.execution.ray_jobs import job_client, study_jobs

        return study_jobs(job_client(self.address), study)

    def stop(self) -> None:
        for mark in self.marks.values():
            kill_node(mark)


def cluster_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(":"),
           "RAY_USAGE_STATS_ENABLED": "0", "RAY_memory_monitor_refresh_ms": "0",
           # no token auth, which Ray 2.60 turns on for a head started where ~/.ray/auth_token exists (any earlier
           # Ray of this user may have written it): the drivers under test talk to the cluster without a token
           "RAY_AUTH_MODE": "disabled",
           # a dead node is declared dead after ~3 s instead of ~30 s
           "RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
           "RAY_health_check_failure_threshold": "3"}
    env.pop("RAY_ADDRESS", None)
    return env


def running_cluster(prefix: str, *, workers: int = 0, **options: Any) -> Iterator[RayCluster]:
    """A local cluster (a head ``node_a`` and ``workers`` more nodes on this host, ``options`` for
    :class:`RayCluster`), stopped and its directory removed afterwards."""
    ray = Path(options.get("ray", RAY))
    if not ray.exists():
        pytest.skip(f"Ray is not installed ({ray}): pip install -e '.[ray]'")
    temp = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # short: Ray's socket paths must stay < 108 bytes
    cluster = RayCluster(temp, cluster_env(), **options)
    try:
        cluster.start_head()
        names = {"node_a"}
        for i in range(workers):
            name = f"node_{chr(ord('b') + i)}"
            cluster.start_worker(name)
            names.add(name)
        if workers:
            cluster.wait_nodes(names)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(temp, ignore_errors=True)


@contextlib.contextmanager
def head_only(agent_port: int | None = None) -> Iterator[RayCluster]:
    """A cluster of its own (a head ``node_a`` alone), for a test that breaks or kills it."""
    yield from running_cluster("vhr", agent_port=agent_port)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    yield from running_cluster("vhr", workers=1)


def wait_for(cond: object, timeout: float = 120, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(cond) and cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5):  # noqa: S310 - the test's own cluster
            return True
    except OSError:
        return False
