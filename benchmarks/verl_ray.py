"""Real verl through the Ray executor (issue 45): the same ``verl_grpo_cpu`` trial run as a Ray job on a local cluster
of logical GPUs and run locally, side by side: wall time and the driver's CPU.

``python -m benchmarks.run --only verl_ray [--smoke]``: a one-node cluster started with verl's interpreter
(``.venv-verl/bin/ray start --head --num-gpus 1 --num-cpus 16``, private temp dir and ports), then for each
repetition the local trial and the Ray-job trial one after the other (interleaved, local first), each a ``search``
of one trial of ``steps`` steps in a fresh studies directory. Figures:

* trial wall: the Optuna trial's ``datetime_complete - datetime_start`` (a Ray job's includes the submission, the
  job's runtime-env set-up and the log's last lines; a local trial's its spawn and Ray start-up of its own);
* study wall: the ``search`` process from spawn to exit (the Ray study adds the probe job that checks the nodes);
* the driver's CPU seconds (user + sys of the driver process only, ``getrusage(RUSAGE_SELF)`` through
  :data:`benchmarks.verl_cpu.PROBE`): following a job's log over the dashboard against tailing a local file.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna

from benchmarks._common import REPO, Row, load_average, log, main_python, make_row, tail
from benchmarks.verl_cpu import PROBE, SPACE, VERL_PY

GROUP = "verl as a Ray job (real verl 0.9.1 on a local cluster of logical GPUs)"
VERL_RAY = VERL_PY.parent / "ray"


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def start_cluster(temp: Path) -> tuple[str, dict[str, str]]:
    """A one-node head of verl's interpreter; its dashboard address and the environment it was started with."""
    gcs, dash, agent, client = _free_ports(4)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    cmd = [str(VERL_RAY), "start", "--head", "--num-cpus", "16", "--num-gpus", "1", "--node-ip-address", "127.0.0.1",
           "--port", str(gcs), "--dashboard-port", str(dash), "--include-dashboard=true", "--dashboard-host",
           "127.0.0.1", "--dashboard-agent-listen-port", str(agent), "--ray-client-server-port", str(client),
           "--temp-dir", str(temp), "--disable-usage-stats"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise RuntimeError(f"ray start failed:\n{tail(res.stdout + res.stderr)}")
    return f"http://127.0.0.1:{dash}", env


def stop_cluster(temp: Path) -> None:
    """SIGKILL the processes of this cluster only (its temp dir in their command line), never another Ray."""
    out = subprocess.run(["pgrep", "-f", str(temp)], capture_output=True, text=True).stdout.split()
    for pid in out:
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
            pass
    shutil.rmtree(temp, ignore_errors=True)


def run_one(studies: Path, steps: int, ray_address: str | None) -> dict[str, Any]:
    probe_out = studies / "driver-rusage.json"
    studies.mkdir(parents=True)
    over = ["trial.n_jobs=1", f"trainer.total_training_steps={steps}", "study.n_trials=1"]
    if ray_address:
        over += ["trial.executor=ray", f"trial.ray.address={ray_address}", "trial.ray.device=cpu",
                 "trial.ray.num_gpus=1", "trial.ray.num_cpus=6"]
    argv = [main_python(), "-c", PROBE, "search", "--space", SPACE, "--studies-dir", str(studies),
            *[a for o in over for a in ("--override", o)], str(probe_out)]
    t0 = time.time()
    res = subprocess.run(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"},
                         capture_output=True, text=True, timeout=3600)
    wall = time.time() - t0
    if res.returncode != 0:
        raise RuntimeError(f"search ({'ray' if ray_address else 'local'}) exited {res.returncode}:\n{tail(res.stderr)}")
    study = optuna.load_study(study_name=SPACE, storage=f"sqlite:///{studies / SPACE}.db")
    (t,) = [t for t in study.trials if t.datetime_complete is not None]
    assert t.datetime_start is not None and t.datetime_complete is not None
    ru = json.loads(probe_out.read_text())
    return {"state": t.state.name, "value": t.value, "study_wall_s": wall,
            "trial_wall_s": (t.datetime_complete - t.datetime_start).total_seconds(),
            "driver_cpu_s": ru["user_s"] + ru["sys_s"]}


def bench(smoke: bool) -> tuple[list[Row], dict[str, Any]]:
    if not VERL_RAY.exists():
        log(f"verl_ray: skipped: {VERL_RAY} is missing (make install-verl)")
        return [], {"skipped": f"{VERL_RAY} missing"}
    reps, steps = (1, 2) if smoke else (2, 4)
    load_start = load_average()
    runs: dict[str, list[dict[str, Any]]] = {"local": [], "ray": []}
    temp = Path(tempfile.mkdtemp(prefix="bvr", dir="/tmp"))  # short: Ray's socket paths
    try:
        address, _ = start_cluster(temp)
        with tempfile.TemporaryDirectory(prefix="bench-verl-ray-") as tmp:
            for rep in range(reps):
                for how in ("local", "ray"):
                    log(f"verl_ray: repetition {rep + 1}/{reps}, one trial of {steps} steps, {how}")
                    runs[how].append(run_one(Path(tmp) / f"{how}{rep}", steps, address if how == "ray" else None))
    finally:
        stop_cluster(temp)
    load_end = load_average()
    what = f"one trial of {steps} steps per run, {reps} interleaved pair(s); load {load_start} -> {load_end}"

    def vals(how: str, key: str) -> list[float]:
        return [r[key] for r in runs[how]]

    g = GROUP
    rows = [
        make_row("verl trial wall: as a Ray job (ours) vs a local subprocess (baseline)", "s",
                 vals("ray", "trial_wall_s"), vals("local", "trial_wall_s"), higher_is_better=False, group=g,
                 note=f"Optuna's start to complete of the trial; ratio < 1: the Ray job is slower; {what}"),
        make_row("search wall: Ray (ours) vs local (baseline)", "s", vals("ray", "study_wall_s"),
                 vals("local", "study_wall_s"), higher_is_better=False, group=g,
                 note=f"spawn to exit of verl-hpo search; the Ray study adds the probe job of the nodes; {what}"),
        make_row("driver CPU: following a Ray job (ours) vs tailing a local trial (baseline)", "s",
                 vals("ray", "driver_cpu_s"), vals("local", "driver_cpu_s"), higher_is_better=False, group=g,
                 note=f"user + sys of the driver process only (getrusage RUSAGE_SELF); {what}"),
    ]
    return rows, {"runs": runs, "load_start": load_start, "load_end": load_end}
