"""What a trial asks of a Ray cluster and what the cluster has free: per-node resources, Ray's own view of the
nodes (the dashboard's ``/api/cluster_status``, plain HTTP: the driver needs no ``ray.init``), first-fit packing
of several trials' claims onto the nodes, and the job client (``ray.job_submission``, imported lazily: only a study
with ``trial.executor: ray`` pays for importing ray)."""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

META_STUDY = "verl_hpo_study"  # job metadata: the study a job belongs to
META_TRIAL = "verl_hpo_trial"  # and the trial number that submitted it
TERMINAL = ("STOPPED", "SUCCEEDED", "FAILED")
HTTP_TIMEOUT_S = 30.0


class RayClusterError(RuntimeError):
    """The cluster cannot be reached, or can never hold a trial: one line for the user."""


def dashboard_url(address: str) -> str:
    """``http://host:8265`` from ``host:8265`` or a URL (the Ray dashboard, which serves the job API)."""
    address = address.strip().rstrip("/")
    return address if address.startswith(("http://", "https://")) else f"http://{address}"


@dataclass(frozen=True)
class JobResources:
    """What one trial needs: ``nodes`` nodes, each with ``per_node`` free (``GPU``, ``CPU``, custom resources)."""

    nodes: int = 1
    per_node: Mapping[str, float] = field(default_factory=dict)

    def as_claim(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "per_node": dict(self.per_node)}

    @classmethod
    def from_claim(cls, claim: Mapping[str, Any]) -> JobResources:
        return cls(int(claim["nodes"]), {str(k): float(v) for k, v in dict(claim["per_node"]).items()})

    def describe(self) -> str:
        each = ", ".join(f"{k}={v:g}" for k, v in sorted(self.per_node.items())) or "nothing"
        return f"{self.nodes} node(s) with {each} each"


def _camel(name: str) -> str:
    """The dashboard camel-cases the resource names of its JSON replies (``node_a`` -> ``nodeA``)."""
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


@dataclass(frozen=True)
class NodeView:
    """One alive node as Ray's autoscaler report sees it: totals and what is in use (camel-cased names)."""

    node_id: str
    total: Mapping[str, float]
    used: Mapping[str, float]

    def free(self, name: str) -> float:
        key = _camel(name)
        return self.total.get(key, 0.0) - self.used.get(key, 0.0)

    def has(self, name: str) -> float:
        return self.total.get(_camel(name), 0.0)


AUTH_HINT = ("it asks for Ray's auth token: set RAY_AUTH_MODE=token in the driver's environment, with the token in "
             "RAY_AUTH_TOKEN or ~/.ray/auth_token (Ray 2.60 turns token auth on for a head started where that "
             "file exists)")


def ray_token() -> str | None:
    """The Ray auth token to send, as Ray's own clients do: only with ``RAY_AUTH_MODE=token``, from
    ``$RAY_AUTH_TOKEN``, the file ``$RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        return None
    token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if token:
        return token
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    try:
        return path.read_text().strip()[:4096] or None
    except OSError:
        return None


def _get_json(url: str) -> Any:
    base = url.split("/api/")[0].split("/nodes?")[0]
    req = urllib.request.Request(url)
    token = ray_token()
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:  # noqa: S310 - the user's cluster URL
            return json.loads(resp.read())
    except urllib.error.HTTPError as err:
        why = AUTH_HINT if err.code == 401 else f"HTTP {err.code}"
        raise RayClusterError(f"Ray dashboard {base} refused the request ({why})") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or err
        raise RayClusterError(f"Ray dashboard {base} cannot be reached ({reason})") from None


def cluster_view(address: str) -> tuple[list[NodeView], float]:
    """The alive nodes with their totals and usage, and the time of the report (Ray's autoscaler monitor writes
    it every few seconds). The first call for a dashboard also checks its head's job agent (:func:`check_agent`).
    Raises :class:`RayClusterError`."""
    reply = _get_json(f"{dashboard_url(address)}/api/cluster_status?format=0")
    check_agent(address)
    status = ((reply.get("data") or {}).get("clusterStatus") or {}) if isinstance(reply, dict) else {}
    load = status.get("loadMetricsReport") or {}
    nodes = []
    for node_id, usage in (load.get("usageByNode") or {}).items():
        total = {k: float(v[1]) for k, v in usage.items()}
        used = {k: float(v[0]) for k, v in usage.items()}
        nodes.append(NodeView(node_id, total, used))
    return nodes, float(status.get("time") or time.time())


# ----------------------------------------------------------------------------- the head's job agent
AGENT_WAIT_S = 10.0  # a head just started may take seconds to register its job agent
NO_AGENT = "No available agent"  # the dashboard's HTTP 500 when the head's job agent is not there
_AGENT_SEEN: set[str] = set()  # dashboards whose job agent answered once in this process


def agent_down(address: str) -> str:
    return (f"the Ray cluster at {dashboard_url(address)} has no job agent to take jobs ('{NO_AGENT}'): the head's "
            "dashboard agent did not start, often because another Ray on that host holds its port (ray start "
            "--dashboard-agent-listen-port, default 52365); see dashboard_agent.log in the head's session logs "
            "and restart the head with a free port")


def agent_answers(address: str) -> bool:
    """Whether the head's job agent is up: the head node's ``dashboardAgentListenPort`` in the dashboard's node
    summary (-1 when the agent could not start). True when the summary does not say (another Ray version)."""
    reply = _get_json(f"{dashboard_url(address)}/nodes?view=summary")
    summary = ((reply.get("data") or {}).get("summary") or []) if isinstance(reply, dict) else []
    for node in summary:
        raylet = node.get("raylet") if isinstance(node, dict) else None
        if isinstance(raylet, dict) and raylet.get("isHeadNode"):
            port = raylet.get("dashboardAgentListenPort")
            return not isinstance(port, int) or port > 0
    return True


def check_agent(address: str, wait_s: float = AGENT_WAIT_S) -> None:
    """RayClusterError (:func:`agent_down`) unless the head's job agent is up within ``wait_s``; asked once per
    dashboard and process (the first :func:`cluster_view`, which is the check before a study starts)."""
    if address in _AGENT_SEEN:
        return
    deadline = time.monotonic() + wait_s
    while not agent_answers(address):
        if time.monotonic() > deadline:
            raise RayClusterError(agent_down(address))
        time.sleep(1.0)
    _AGENT_SEEN.add(address)


def _place(capacity: list[dict[str, float]], need: JobResources) -> bool:
    """Take ``need`` from ``capacity`` (per node, in place): its nodes on distinct nodes, the fullest-fitting
    first; False (capacity untouched) when it does not fit."""
    fitting = [i for i, cap in enumerate(capacity)
               if all(cap.get(k, 0.0) + 1e-9 >= v for k, v in need.per_node.items())]
    if len(fitting) < need.nodes:
        return False
    fitting.sort(key=lambda i: sum(capacity[i].get(k, 0.0) for k in need.per_node))  # best fit: least left over
    for i in fitting[:need.nodes]:
        for k, v in need.per_node.items():
            capacity[i][k] = capacity[i].get(k, 0.0) - v
    return True


def packs(capacity: Sequence[Mapping[str, float]], needs: Iterable[JobResources]) -> bool:
    """Whether every claim in ``needs`` fits on the nodes of ``capacity`` together (first-fit, largest first)."""
    left = [dict(c) for c in capacity]
    for need in sorted(needs, key=lambda n: -n.nodes * sum(n.per_node.values())):
        if not _place(left, need):
            return False
    return True


def fits_now(nodes: Sequence[NodeView], need: JobResources, others: Iterable[JobResources]) -> tuple[bool, str]:
    """Admission: (1) ``need`` and the study's other claims (``others``: admitted trials, whether or not Ray
    already sees them use anything) pack into the nodes' totals, and (2) ``need`` fits into what Ray sees free
    now (other users' jobs, and ours once they hold resources). Also the reason it does not, for the user."""
    names = set(need.per_node)
    for o in others:
        names |= set(o.per_node)
    totals = [{k: n.has(k) for k in names} for n in nodes]
    if not packs(totals, [need]):
        raise RayClusterError(f"a trial needs {need.describe()}; the cluster has {len(nodes)} alive node(s), "
                              f"{sum(packs([t], [JobResources(1, need.per_node)]) for t in totals)} of them with "
                              "that much")
    others = list(others)
    if not packs(totals, [*others, need]):
        return False, f"{len(others)} running trial(s) of the study hold the rest"
    free = [{k: n.free(k) for k in need.per_node} for n in nodes]
    if not packs(free, [need]):
        return False, "Ray sees too little free"
    return True, ""


# ----------------------------------------------------------------------------- the job client
def job_client(address: str) -> Any:
    """A ``ray.job_submission.JobSubmissionClient`` (imports ray: ~1 s, only for Ray-executor studies)."""
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError:
        raise RayClusterError("trial.executor: ray needs Ray's job client: pip install -e '.[ray]'") from None
    logging.getLogger("ray").setLevel(logging.WARNING)  # not a line per uploaded package or closed log stream
    try:
        return JobSubmissionClient(dashboard_url(address))
    except (ConnectionError, RuntimeError, ValueError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise RayClusterError(f"Ray cluster at {dashboard_url(address)}: {first}") from None
    except Exception as err:  # ray.exceptions.AuthenticationError (not a RuntimeError)
        if type(err).__name__ != "AuthenticationError":
            raise
        raise RayClusterError(f"Ray cluster at {dashboard_url(address)}: {AUTH_HINT}") from None


def study_jobs(client: Any, study: str) -> list[Any]:
    """The jobs a study submitted (``JobDetails``, tagged with :data:`META_STUDY`), any status."""
    return [j for j in client.list_jobs() if (j.metadata or {}).get(META_STUDY) == study]


def stop_and_wait(client: Any, submission_id: str, timeout_s: float) -> str:
    """Ask Ray to stop a job and wait until it is terminal (``stop_job`` only asks): its final status, or the
    status it still had at ``timeout_s``."""
    status = str(client.get_job_status(submission_id).value)
    if status in TERMINAL:
        return status
    try:
        client.stop_job(submission_id)
    except RuntimeError:
        pass  # it ended in between
    deadline = time.monotonic() + timeout_s
    while True:
        status = str(client.get_job_status(submission_id).value)
        if status in TERMINAL or time.monotonic() > deadline:
            return status
        time.sleep(0.2)
