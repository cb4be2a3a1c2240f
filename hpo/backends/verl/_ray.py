"""Real verl on the user's Ray cluster (``trial.executor: ray``, docs/ray.md): where a job's checkpoints live, and
what is checked on the cluster's nodes before a study is created.

verl's ``main_ppo`` joins the cluster the job runs on (Ray's job supervisor sets ``RAY_ADDRESS``, verl calls
``ray.init()`` with no address), builds its placement groups there and its actors run in the cluster's own
interpreter (the one ``ray start`` ran), not the job's. So what a local trial checks in ``trial.python`` is asked of
every node instead, by one probe job (:func:`check_cluster`): verl, vLLM and, on a cluster of logical GPUs
(``trial.ray.device: cpu``), the CPU platform plugin importable in the nodes' interpreter, torch with CUDA on a
cluster of real GPUs, and the checkpoint directory (``trial.ray.shared_dir``, else the studies directory) the same
on every node as on the driver's host, which a trial of several nodes needs (its ranks save into one directory) and
a retry on another node resumes from.
"""

from __future__ import annotations

import json
import secrets
import shlex
import time
from pathlib import Path
from typing import Any

from hpo.backends._attempt import Attempt
from hpo.backends.verl._cpu import PLUGIN_MODULE
from hpo.execution.ray_jobs import TERMINAL, RayClusterError, job_client, stop_and_wait
from hpo.experiment import RaySpec
from hpo.record import TRIAL_MARKER

PROBE_TIMEOUT_S = 180.0  # the probe job: Ray starts a worker per node (~5-20 s on a busy host)
PROBE_PREFIX = "@@verl-hpo-probe@@ "
TOKEN_FILE = ".verl-hpo-shared-check"
TENSOR_MODULE = "torch"  # imported by the probe on the nodes, never here

# Run in the job with trial.python; its task runs on each node in the cluster's own interpreter (standard library
# and ray only). Prints one line: PROBE_PREFIX + [{node, python, missing, cuda, gpus, shared}, ...].
_PROBE = r'''
import importlib, importlib.util, json, sys
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
args = json.loads(sys.argv[1])
ray.init(logging_level="ERROR")

@ray.remote(num_cpus=0)
def probe(args):
    out = {"python": sys.executable, "missing": [m for m in args["modules"] if importlib.util.find_spec(m) is None]}
    if args["cuda"]:  # the trainer's tensor library, named by the driver (which never imports it)
        try:
            out["cuda"] = bool(importlib.import_module(args["cuda"]).cuda.is_available())
        except Exception:
            out["cuda"] = False
    try:
        with open(args["token_path"]) as f:
            out["shared"] = f.read() == args["token"]
    except OSError:
        out["shared"] = False
    return out

nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) > 0]
refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(args)
        for n in nodes]
found = ray.get(refs, timeout=args["timeout"])
for n, f in zip(nodes, found):
    f["node"] = n.get("NodeManagerAddress", "?") + " " + n["NodeID"][:8]
    f["gpus"] = n.get("Resources", {}).get("GPU", 0)
print(args["prefix"] + json.dumps(found), flush=True)
'''


class ClusterMismatch(ValueError):
    """The cluster answers but cannot run the study's trials as configured (a bad input: exit 2)."""


def checkpoint_root(ray: RaySpec, study: str, trials_dir: Path | None) -> Path | None:
    """Where a study's trials keep their checkpoints: ``<trial.ray.shared_dir>/<study>``, else the trials directory
    (the studies directory's ``<study>/trials``; None: not known)."""
    return Path(ray.shared_dir).expanduser() / study if ray.shared_dir else trials_dir


def job_checkpoints(ray: RaySpec, ctx: Attempt) -> Path | None:
    """The checkpoint directory of one Ray-job attempt with ``trial.ray.shared_dir`` set:
    ``<shared_dir>/<study>/<trial number>/checkpoints``, and ``<trial dir>/checkpoints`` made a link to it (what a
    retry's resume point reads on the driver's host, which sees the shared directory too); None without it (the
    trial directory's own, :func:`~hpo.backends.verl._launch.verl_argv`)."""
    if not ray.shared_dir:
        return None
    target = Path(ray.shared_dir).expanduser() / ctx.study / str(ctx.number) / "checkpoints"
    target.mkdir(parents=True, exist_ok=True)
    (target.parent / TRIAL_MARKER).write_text(json.dumps({"trial_dir": str(ctx.trial_dir)}) + "\n")  # deletable
    link = ctx.trial_dir / "checkpoints"
    if not link.is_symlink() and not link.exists():
        link.symlink_to(target, target_is_directory=True)
    return target


def _problems(found: list[dict[str, Any]], ray: RaySpec, where: Path | None) -> list[str]:
    out = []
    for node in found:
        name = f"node {node.get('node', '?')} (its interpreter {node.get('python', '?')})"
        if node.get("missing"):
            need = "the CPU platform plugin and vLLM's CPU build" if ray.device == "cpu" else "verl[vllm]"
            out.append(f"{name} cannot import {', '.join(map(str, node['missing']))}: verl's actors run in the "
                       f"interpreter `ray start` ran, so install {need} there (`make install-verl` builds such a "
                       f"venv; start the node with its `ray`)")
        if ray.device == "cuda" and node.get("cuda") is False:
            out.append(f"{name} has no CUDA torch, so trial.ray.device: cuda trials cannot run there (a cluster of "
                       "logical GPUs on CPU machines: trial.ray.device: cpu)")
    unshared = [str(n.get("node", "?")) for n in found if not n.get("shared")] if where else []
    if unshared and ray.nodes > 1:
        out.append(f"the checkpoint directory {where} is not the same on node(s) {', '.join(unshared)} as on this "
                   f"host, and a trial of {ray.nodes} nodes saves there from every node: set trial.ray.shared_dir to "
                   "a directory every node and this host share (NFS), or put the studies directory on one")
    return out


def _existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (the check writes nothing that stays)."""
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def check_cluster(ray: RaySpec, address: str, python: str, checkpoints: Path | None,
                  timeout_s: float = PROBE_TIMEOUT_S) -> list[str]:
    """Ask every node of the cluster with GPUs (logical or real) what a verl trial needs of it (module docstring);
    the notes for the user (a node that does not see the checkpoint directory while trials have one node each:
    their retries there start afresh). Raises :class:`ClusterMismatch` (one line) when the nodes cannot run the
    trials, :class:`RayClusterError` when the check itself could not run.
    ``checkpoints``: where trials keep them (None: not known, not checked)."""
    token = secrets.token_hex(16)
    token_path = None if checkpoints is None else _existing(checkpoints) / f"{TOKEN_FILE}-{token[:8]}"
    if token_path is not None:
        token_path.write_text(token)
    modules = ["verl", "vllm", *([PLUGIN_MODULE] if ray.device == "cpu" else [])]
    args = {"modules": modules, "cuda": TENSOR_MODULE if ray.device == "cuda" else "",
            "token_path": str(token_path or ""), "token": token, "prefix": PROBE_PREFIX, "timeout": timeout_s}
    client = job_client(address)
    sid = f"verl-hpo-probe-{secrets.token_hex(4)}"
    entry = shlex.join([python, "-c", _PROBE, json.dumps(args)])
    try:
        client.submit_job(entrypoint=entry, submission_id=sid, runtime_env={},
                          metadata={"verl_hpo_probe": "1"})
        deadline, status = time.monotonic() + timeout_s, ""
        while time.monotonic() < deadline:
            status = str(client.get_job_status(sid).value)
            if status in TERMINAL:
                break
            time.sleep(0.5)
        logs = client.get_job_logs(sid)
    except (RuntimeError, ConnectionError, OSError) as err:
        raise RayClusterError(f"Ray cluster at {address}: the check of its nodes could not run: "
                              f"{(str(err).strip().splitlines() or [type(err).__name__])[0]}") from None
    finally:
        if token_path is not None:
            token_path.unlink(missing_ok=True)
    if status not in TERMINAL:
        stop_and_wait(client, sid, 30.0)
        raise RayClusterError(f"Ray cluster at {address}: the check of its nodes did not finish in {timeout_s:.0f} s "
                              "(a node that cannot start a worker?)")
    line = next((ln for ln in logs.splitlines() if ln.startswith(PROBE_PREFIX)), None)
    if line is None:
        last = [ln for ln in logs.splitlines() if ln.strip()][-1:] or ["no output"]
        raise RayClusterError(f"Ray cluster at {address}: trial.python {python} could not check the nodes there "
                              f"(does it exist on the cluster, with ray installed?): {last[0][:300]}")
    found = json.loads(line[len(PROBE_PREFIX):])
    if not found:
        raise ClusterMismatch(f"the Ray cluster at {address} has no node with GPUs (ray start --num-gpus N; on "
                              "machines without a GPU, logical ones and trial.ray.device: cpu)")
    problems = _problems(found, ray, checkpoints)
    if problems:
        raise ClusterMismatch(f"the Ray cluster at {address} cannot run these trials: {problems[0]}")
    unshared = [str(n.get("node", "?")) for n in found if not n.get("shared")] if checkpoints else []
    return [f"the checkpoint directory {checkpoints} is not shared with node(s) {', '.join(unshared)}: a retried "
            "trial that lands there starts afresh (trial.ray.shared_dir names a shared one)"] if unshared else []
