"""Ray namespaces of one trial's own, on a cluster that runs several trials at once.

A trainer may create a Ray actor under a name in a namespace fixed in its code and find it again by that name from
every worker. Two jobs of such a trainer on one cluster then share that actor: the second job's workers use the
first's, and when the first job ends and kills it, the second waits on it forever (a backend's case and why: the
comment where it names the namespace; docs/ray.md).

The trainer's backend names such namespaces in the trial's environment (:data:`PRIVATE_NAMESPACES_ENV`, a
comma-separated list). The job is then submitted with this module's :func:`setup_worker` as Ray's
``worker_process_setup_hook`` (it runs in every worker process of the job before any task or actor), and
:data:`NAMESPACE_MAP_ENV` maps each named namespace to ``<namespace>@<submission id>``: ``ray.get_actor`` and
``ActorClass.options`` are given the job's own namespace instead, so each trial gets its own actors and the names
inside a namespace stay the trainer's. A hook of the user's (``trial.ray.runtime_env.worker_process_setup_hook``)
still runs, after this one.

Standard library only at import: shipped inside the entrypoint package (``verl_hpo_ray_entry.isolate``), imported
in the cluster's interpreter.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Mapping
from typing import Any

PRIVATE_NAMESPACES_ENV = "VERL_HPO_RAY_PRIVATE_NAMESPACES"  # set by a backend: namespaces its trainer fixes
NAMESPACE_MAP_ENV = "VERL_HPO_RAY_NAMESPACE_MAP"  # set on submission: {"<ns>": "<ns>@<submission id>"}
USER_HOOK_ENV = "VERL_HPO_RAY_USER_HOOK"  # the user's own worker_process_setup_hook ("module.function")
HOOK = "isolate.setup_worker"  # under the entrypoint package


def namespace_map(names: str, submission_id: str) -> dict[str, str]:
    """``names`` (:data:`PRIVATE_NAMESPACES_ENV`'s value) mapped to the job's own namespaces."""
    return {n: f"{n}@{submission_id}" for n in (s.strip() for s in names.split(",")) if n}


def isolation(env: Mapping[str, str], runtime_env: dict[str, Any], submission_id: str, package: str) -> None:
    """Add the hook and its map to a job's ``runtime_env`` (its ``env_vars`` already the job's, ``env``) when the
    backend named private namespaces; the user's own hook is kept to run after it."""
    mapping = namespace_map(env.get(PRIVATE_NAMESPACES_ENV, ""), submission_id)
    if not mapping:
        return
    env_vars = runtime_env.setdefault("env_vars", {})
    env_vars[NAMESPACE_MAP_ENV] = json.dumps(mapping, sort_keys=True)
    user = runtime_env.get("worker_process_setup_hook")
    if isinstance(user, str) and user:
        env_vars[USER_HOOK_ENV] = user
    runtime_env["worker_process_setup_hook"] = f"{package}.{HOOK}"


def setup_worker() -> None:
    """Ray's ``worker_process_setup_hook``: the job's namespaces in place of the trainer's fixed ones, then the
    user's hook."""
    mapping = json.loads(os.environ.get(NAMESPACE_MAP_ENV) or "{}")
    if mapping:
        _rename(mapping)
    user = os.environ.get(USER_HOOK_ENV)
    if user:
        module, _, name = user.rpartition(".")
        getattr(importlib.import_module(module), name)()


def _rename(mapping: dict[str, str]) -> None:
    import ray
    import ray.actor

    original = "_verl_hpo_original"  # the function a wrapper of ours replaced (the hook may run twice)
    get_actor = getattr(ray.get_actor, original, ray.get_actor)
    options = getattr(ray.actor.ActorClass.options, original, ray.actor.ActorClass.options)

    def job_get_actor(name: str, namespace: str | None = None) -> Any:
        return get_actor(name, mapping.get(namespace, namespace) if namespace else namespace)

    def job_options(self: Any, **kwargs: Any) -> Any:
        if kwargs.get("namespace") in mapping:
            kwargs["namespace"] = mapping[kwargs["namespace"]]
        return options(self, **kwargs)

    setattr(job_get_actor, original, get_actor)
    setattr(job_options, original, options)
    ray.get_actor = job_get_actor
    ray.actor.ActorClass.options = job_options  # type: ignore[method-assign]
