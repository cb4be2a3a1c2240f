"""The Ray-job executor's parts that need no cluster: the entrypoint that runs on the node (a real subprocess with a
trainer that writes good, bad and endless metrics lines), the driver's reading of the job's log (the same records
and bad-line count as the local metrics tail), per-node packing and admission, and the one-line errors of a study
whose cluster cannot be reached. The cluster tests are in ``test_ray_study.py``."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpo.execution import MetricsTail
from hpo.execution.ray_jobs import (
    ENTRY_PACKAGE,
    JobLog,
    JobResources,
    NodeView,
    RayClusterError,
    _entry,
    entry_package,
    fits_now,
    job_env,
    packs,
)
from tests.hpo.conftest import fake_space, run_cli

PY = sys.executable


def run_entry(tmp_path: Path, trainer: str, *opts: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m verl_hpo_ray_entry`` as the job's entrypoint runs it, from the package the job ships."""
    script = tmp_path / "trainer.py"
    script.write_text(textwrap.dedent(trainer))
    env = {**os.environ, "PYTHONPATH": str(entry_package().parent)}
    return subprocess.run([PY, "-m", ENTRY_PACKAGE, "--metrics", str(tmp_path / "m" / "metrics.jsonl"), *opts,
                           "--", PY, str(script), str(tmp_path / "m" / "metrics.jsonl")],
                          env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


HOSTILE = """
    import json, os, sys, time
    path = sys.argv[1]
    with open(path, "w") as fh:
        for step in range(3):
            fh.write(json.dumps({"step": step, "data": {"eval/reward_mean": step / 10}}) + "\\n"); fh.flush()
            time.sleep(0.3)
        fh.write("not json\\n")
        fh.write('{"step": -1, "data": {}}\\n')
        fh.write("x" * 5000 + "\\n")  # over the line cap
        fh.write('{"step": 3, "data": {"eval/reward_mean": null, "s": "text"}}\\n')
        fh.write('{"step": 4, "data"')  # never completed
    print("trainer output", flush=True)
    print("Traceback (most recent call last):\\nRuntimeError: boom", file=sys.stderr, flush=True)
    sys.exit(3)
"""


def test_the_entrypoint_echoes_metrics_lines_and_the_driver_reads_them_as_the_local_tail(tmp_path: Path) -> None:
    res = run_entry(tmp_path, HOSTILE, "--max-line-bytes", "1000")
    assert res.returncode == 3, res.stderr
    out, mirror = io.StringIO(), io.StringIO()
    log = JobLog(out, mirror)
    records = []
    for i in range(0, len(res.stdout), 37):  # the log arrives in arbitrary chunks
        records += log.feed(res.stdout[i:i + 37])
    log.close()
    local = MetricsTail(tmp_path / "m" / "metrics.jsonl", max_line_bytes=1000)
    expected = local.read()
    assert [s for s, _ in records] == [0, 1, 2, 3] == [s for s, _ in expected]
    assert repr(records) == repr(expected)  # NaN for null, text dropped: parse_line's own rules
    assert log.bad_lines == local.bad_lines == 3  # not JSON, step -1, over the cap
    assert log.end == {"exit": 3, "peak_kb": log.end["peak_kb"], "memory": False}
    assert "trainer output" in out.getvalue() and _entry.PREFIX not in out.getvalue()
    copy = tmp_path / "copy.jsonl"  # the driver-side copy of the good lines reads as the node's file
    copy.write_text(mirror.getvalue())
    assert repr(MetricsTail(copy).read()) == repr(expected)
    assert "RuntimeError: boom" in res.stderr  # the trainer's stderr is the job's, untouched


def test_the_entrypoint_passes_a_signal_death_on_and_enforces_the_memory_cap(tmp_path: Path) -> None:
    killed = run_entry(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert killed.returncode == 128 + 9
    assert json.loads(killed.stdout.split(_entry.END)[1])["exit"] == -9
    hog = run_entry(tmp_path, """
        import time
        blocks = []
        for _ in range(200):
            blocks.append(bytearray(8 * 2**20))
            time.sleep(0.02)
    """, "--memory-limit-bytes", str(100 * 2**20))
    end = json.loads(hog.stdout.split(_entry.END)[1])
    assert end["memory"] is True and end["exit"] == -9 and end["peak_kb"] > 100 * 1024
    assert hog.returncode == 128 + 9


def test_job_env_carries_only_the_trials_own_entries() -> None:
    base = {"PATH": "/usr/bin", "HOME": "/root", "X": "1"}
    env = {**base, "X": "2", "VERL_HPO_TRIAL": "3", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": "/fake",
           "VERL_HPO_DRIVER": "{}"}  # a driver's orphan sweep on the same host must never take a job for its orphan
    assert job_env(env, base) == {"X": "2", "VERL_HPO_TRIAL": "3", "PYTHONPATH": "/fake"}


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


def test_private_namespaces_map_to_the_job_s_own_and_the_user_s_hook_still_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The submission adds the worker setup hook only when the backend named private namespaces, keeps a user's own
    hook to run after it; in a worker the hook sends the fixed namespace's lookups and creations to the job's own and
    leaves every other namespace alone (run twice, it wraps once)."""
    import ray
    import ray.actor

    from hpo.execution.ray_jobs import PRIVATE_NAMESPACES_ENV, _isolate

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
