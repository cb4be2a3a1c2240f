"""Ray namespaces of one trial's own (:mod:`hpo.execution.ray_jobs._isolate`): the submission adds the worker setup hook
only when the backend named private namespaces, mapped to the job's own; in a worker the hook sends the fixed
namespace's lookups and creations there, leaves every other namespace alone and still runs the user's own hook."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpo.execution.ray_jobs import PRIVATE_NAMESPACES_ENV, _isolate


def test_the_named_namespaces_map_to_the_job_s_own() -> None:
    assert _isolate.namespace_map(" transfer_queue, ,other ", "verl-hpo-s-3") == {
        "transfer_queue": "transfer_queue@verl-hpo-s-3", "other": "other@verl-hpo-s-3"}
    assert _isolate.namespace_map("", "x") == {}


def test_private_namespaces_map_to_the_job_s_own_and_the_user_s_hook_still_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The submission adds the worker setup hook only when the backend named private namespaces, keeps a user's own
    hook to run after it; in a worker the hook sends the fixed namespace's lookups and creations to the job's own and
    leaves every other namespace alone (run twice, it wraps once)."""
    import ray
    import ray.actor

    plain: dict[str, object] = {"env_vars": {"A": "1"}}
    _isolate.isolation({}, plain, "verl-hpo-s-0", "pkg")
    assert plain == {"env_vars": {"A": "1"}}
    runtime_env: dict[str, object] = {"env_vars": {"A": "1"}, "worker_process_setup_hook": "user_hook.setup"}
    _isolate.isolation({PRIVATE_NAMESPACES_ENV: "transfer_queue, other"}, runtime_env, "verl-hpo-s-0", "pkg")
    env_vars = runtime_env["env_vars"]
    assert isinstance(env_vars, dict) and runtime_env["worker_process_setup_hook"] == "pkg.isolate.setup_worker"
    assert json.loads(env_vars[_isolate.NAMESPACE_MAP_ENV]) == {"other": "other@verl-hpo-s-0",
                                                               "transfer_queue": "transfer_queue@verl-hpo-s-0"}
    assert env_vars[_isolate.USER_HOOK_ENV] == "user_hook.setup" and env_vars["A"] == "1"

    (tmp_path / "user_hook.py").write_text("import os\ndef setup():\n    os.environ['USER_HOOK_RAN'] = '1'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    asked: list[tuple[str, str | None]] = []
    monkeypatch.setattr(ray, "get_actor", lambda name, namespace=None: asked.append((name, namespace)))
    monkeypatch.setattr(ray.actor.ActorClass, "options", lambda self, **kw: asked.append(("options", kw["namespace"])))
    monkeypatch.delenv("USER_HOOK_RAN", raising=False)
    for key, value in env_vars.items():
        monkeypatch.setenv(key, str(value))
    _isolate.setup_worker()
    _isolate.setup_worker()  # a second run wraps the originals, not its own wrappers
    ray.get_actor("TransferQueueController", namespace="transfer_queue")
    ray.get_actor("Other", namespace="mine")
    ray.get_actor("Anonymous")
    ray.actor.ActorClass.options(object(), name="TransferQueueController", namespace="transfer_queue")
    assert asked == [("TransferQueueController", "transfer_queue@verl-hpo-s-0"), ("Other", "mine"),
                     ("Anonymous", None), ("options", "transfer_queue@verl-hpo-s-0")]
    assert os.environ["USER_HOOK_RAN"] == "1"
