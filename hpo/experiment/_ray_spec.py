"""``trial.ray``: what each trial of a ``trial.executor: ray`` study asks of the user's Ray cluster (see docs/ray.md).

Parsed apart from the other sections because two of its fields are free-form (``resources`` maps names to numbers,
``runtime_env`` is handed to Ray as it is); every problem is still one :class:`SpaceError` line naming the field."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hpo.experiment._secrets import is_secret_key

EXECUTORS = ("local", "ray")
_RESERVED = ("CPU", "GPU", "memory", "object_store_memory")
_RESOURCE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_:.-]*$")
_ADDRESS_RE = re.compile(r"^(https?://)?[A-Za-z0-9_.\-\[\]:]+(:\d+)?/?$")
FIELDS = ("address", "nodes", "num_gpus", "num_cpus", "resources", "runtime_env", "stop_timeout_s", "device",
          "shared_dir")
DEVICES = ("cuda", "cpu")


@dataclass(frozen=True)
class RaySpec:
    """Per-trial resources of a Ray job and where the cluster is.

    ``nodes`` x (``num_gpus``, ``num_cpus``, ``resources``) must be free (Ray's own view, and no other running trial
    of the study holding them) before a trial is submitted. A one-node trial of ``verl_core`` or a custom command
    holds them through the job's entrypoint (Ray picks the node and sets ``CUDA_VISIBLE_DEVICES``); a verl trial
    gets ``trainer.nnodes=nodes trainer.n_gpus_per_node=num_gpus`` and makes its own placement groups.

    ``device``: what the cluster's GPUs are. ``cuda``: real ones. ``cpu``: logical GPUs (``ray start --num-gpus N``
    on machines without one), each standing for a CPU worker: a verl trial then runs on the CPU platform
    (:mod:`hpo.backends.verl._cpu`). ``shared_dir``: a directory every node and the driver see (NFS, a mounted
    bucket) where a trial keeps its checkpoints, so a retry on another node resumes; unset: the studies directory,
    which must then be shared for trials of several nodes."""

    address: str | None = None  # the dashboard, http://head:8265; null: --ray-address, else $RAY_ADDRESS
    nodes: int = 1
    num_gpus: int = 1  # per node
    num_cpus: float = 1.0  # per node
    resources: dict[str, float] = field(default_factory=dict)  # custom resources per node, e.g. {"a100": 1}
    runtime_env: dict[str, Any] = field(default_factory=dict)  # Ray's runtime_env: working_dir, env_vars, pip, ...
    stop_timeout_s: float = 60.0  # a stopped job must be terminal within this long
    device: str = "cuda"  # cuda: real GPUs; cpu: logical GPUs standing for CPU workers
    shared_dir: str | None = None  # checkpoints of every trial, on storage every node reads; null: the studies dir

    def per_node(self) -> dict[str, float]:
        out = {"GPU": float(self.num_gpus), "CPU": float(self.num_cpus), **self.resources}
        return {k: v for k, v in out.items() if v > 0}


def split_ray(trial_raw: Any) -> tuple[Any, Any]:
    """The ``trial`` section without its ``ray`` mapping, and that mapping (None when absent)."""
    if not isinstance(trial_raw, dict) or "ray" not in trial_raw:
        return trial_raw, None
    rest = {k: v for k, v in trial_raw.items() if k != "ray"}
    return rest, trial_raw["ray"]


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def parse_ray(raw: Any, error: Callable[[str, str], Exception]) -> RaySpec:
    """``trial.ray`` as a :class:`RaySpec`; ``error(where, message)`` makes the one-line error to raise."""
    if raw is None:
        return RaySpec()
    if not isinstance(raw, dict):
        raise error("trial.ray", f"expected a mapping, got {raw!r}")
    for key in raw:
        if key not in FIELDS:
            raise error(f"trial.ray.{key}", f"unknown field (value {raw[key]!r}); known: {', '.join(FIELDS)}")
    address = raw.get("address")
    if address is not None:
        if not isinstance(address, str) or not address.strip():
            raise error("trial.ray.address", f"expected the dashboard's address (http://head:8265), got {address!r}")
        if address.startswith("ray://") or not _ADDRESS_RE.match(address.strip()):
            raise error("trial.ray.address", f"{address!r}: expected the dashboard's address (http://head:8265; "
                        "the job API lives there, not at ray:// or the GCS port)")
    nodes = raw.get("nodes", 1)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise error("trial.ray.nodes", f"expected an integer >= 1, got {nodes!r}")
    gpus = raw.get("num_gpus", 1)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise error("trial.ray.num_gpus", f"expected an integer >= 0 (GPUs per node), got {gpus!r}")
    cpus = raw.get("num_cpus", 1.0)
    if not _number(cpus) or cpus < 0:
        raise error("trial.ray.num_cpus", f"expected a number >= 0 (CPUs per node), got {cpus!r}")
    resources = raw.get("resources") or {}
    if not isinstance(resources, dict):
        raise error("trial.ray.resources", f"expected a mapping of resource names to amounts, got {resources!r}")
    for name, amount in resources.items():
        if not isinstance(name, str) or not _RESOURCE_RE.match(name) or name in _RESERVED:
            raise error("trial.ray.resources", f"{name!r} is not a custom resource name (CPU and GPU have their "
                        "own fields)")
        if not _number(amount) or amount <= 0:
            raise error(f"trial.ray.resources.{name}", f"expected a positive number, got {amount!r}")
    runtime_env = raw.get("runtime_env") or {}
    if not isinstance(runtime_env, dict) or not all(isinstance(k, str) for k in runtime_env):
        raise error("trial.ray.runtime_env", f"expected a mapping (Ray's runtime_env), got {runtime_env!r}")
    env_vars = runtime_env.get("env_vars", {})
    for name in env_vars if isinstance(env_vars, dict) else ():
        if isinstance(name, str) and is_secret_key(name):  # Ray's runtime_env is stored and shown as it is
            raise error(f"trial.ray.runtime_env.env_vars.{name}", "names a secret, and the study stores and shows "
                        "trial.ray as written: set it in trial.env instead (masked in the record, passed to the job)")
    if not isinstance(env_vars, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in env_vars.items()):
        raise error("trial.ray.runtime_env.env_vars", f"expected a mapping of names to strings, got {env_vars!r}")
    for key in ("working_dir", "py_modules"):
        if key == "working_dir" and key in runtime_env and not isinstance(runtime_env[key], str):
            raise error(f"trial.ray.runtime_env.{key}", f"expected a path or URI, got {runtime_env[key]!r}")
        if key == "py_modules" and not isinstance(runtime_env.get(key, []), list):
            raise error(f"trial.ray.runtime_env.{key}", f"expected a list, got {runtime_env[key]!r}")
    stop = raw.get("stop_timeout_s", 60.0)
    if not _number(stop) or stop <= 0:
        raise error("trial.ray.stop_timeout_s", f"expected a positive number of seconds, got {stop!r}")
    device = raw.get("device", "cuda")
    if device not in DEVICES:
        raise error("trial.ray.device", f"expected one of {', '.join(DEVICES)} (cpu: the cluster's GPUs are logical "
                    f"ones standing for CPU workers), got {device!r}")
    shared = raw.get("shared_dir")
    if shared is not None and (not isinstance(shared, str) or "\0" in shared
                               or not shared.strip().startswith("/")):
        raise error("trial.ray.shared_dir", f"expected the absolute path of a directory every node and the driver "
                    f"can read and write, got {shared!r}")
    return RaySpec(address=None if address is None else address.strip(), nodes=nodes, num_gpus=gpus,
                   num_cpus=float(cpus), resources={k: float(v) for k, v in resources.items()},
                   runtime_env=dict(runtime_env), stop_timeout_s=float(stop), device=device,
                   shared_dir=None if shared is None else shared.strip())
