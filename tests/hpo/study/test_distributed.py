"""Many drivers, one study: the real PostgreSQL and Redis servers on 127.0.0.1, real driver processes (the fake
trainer keeps trials short), kills at random moments. Skipped when a server or its Python driver is missing.

These tests run beside other work on 2 cores: they wait on states (a file, a process, a storage attribute, a
barrier), with generous timeouts, never on a fixed time, and a live driver's grace period (``GRACE_S``) is far
longer than any stall of its heartbeat thread, while a dead driver's last heartbeat (``ghost``) is far older."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing as mp
import random
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest
from optuna.trial import TrialState

from hpo.storages._storage import open_storage
from hpo.study._optuna import ATTR_TARGET
from hpo.study._recovery import ATTR_HEARTBEAT, ATTR_RESULT, Heartbeat, recover_stale_trials
from hpo.study._slots import is_finished
from tests.hpo.conftest import PY, ROOT, cli_env, fake_space, run_cli

PG_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/0"
DIST = optuna.distributions.FloatDistribution(0.0, 1.0)
GRACE_S = 30  # a live driver's trial is never taken for dead by a heartbeat late under load
GHOST_AGE_S = 3600  # a dead driver's last heartbeat: far beyond GRACE_S
WAIT_S = 120  # the longest wait for a state (a busy machine starts a driver in seconds, not minutes)

# A trial command whose first run (trial 0) blocks until its driver stops it; later runs are the fake trainer.
GATE = """
import os, sys, time
try:
    os.close(os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL))
except FileExistsError:
    os.execv(sys.argv[2], sys.argv[2:])
while True:
    time.sleep(60)
"""


def _up(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _need(url: str) -> None:
    module, port = ("redis", 6379) if url.startswith("redis") else ("psycopg2", 5432)
    if importlib.util.find_spec(module) is None or not _up(port):
        pytest.skip(f"{module} or the server on port {port} is not available")


@pytest.fixture
def study_name() -> Iterator[str]:
    name = f"hpo-dist-{uuid.uuid4().hex[:10]}"
    yield name
    for url in (PG_URL, REDIS_URL):
        try:
            optuna.delete_study(study_name=name, storage=open_storage(url))
        except Exception:  # noqa: BLE001 - best-effort cleanup of a shared server
            pass


def start(args: list[str], studies: Path, tag: str, prefix: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    return subprocess.Popen([*prefix, PY, "-m", "hpo", *args, "--studies-dir", str(studies)], cwd=ROOT,
                            env=cli_env(TEST_TAG=tag), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def kill_a_busy_driver(drivers: list[subprocess.Popen[str]], running: list[optuna.trial.FrozenTrial],
                       rng: random.Random, restart: list[str], studies: Path, tag: str) -> bool:
    """SIGKILL a random one of ``drivers`` that runs one of the ``running`` trials and start ``restart`` in its place
    (the list is updated); False when none of them runs one."""
    pids = {t.user_attrs.get("worker", {}).get("pid") for t in running}
    victims = [i for i, d in enumerate(drivers) if d.pid in pids]
    if not victims:
        return False
    victim = rng.choice(victims)
    drivers[victim].send_signal(signal.SIGKILL)
    drivers[victim].wait()
    drivers[victim] = start(restart, studies, tag)
    return True


def all_exit_cleanly(drivers: list[subprocess.Popen[str]]) -> None:
    for d in drivers:
        _, err = d.communicate(timeout=300)
        assert d.returncode == 0, err


def trial_procs(tag: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("TEST_TAG") == tag and "fake_trainer" in " ".join(p.cmdline()):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return out


def wait_for(pred: Callable[[], bool], timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {pred}")


def load(url: str, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=open_storage(url))


def make_study(url: str, name: str, tmp_path: Path, studies: Path, n_trials: int = 1, **sections: Any) -> Path:
    """A finished one-trial study (made by `search`) whose target is then raised to ``n_trials``."""
    space = fake_space(tmp_path, study={"n_trials": 1, "heartbeat_interval": 1, "grace_period": GRACE_S,
                                        **sections.pop("study", {})}, **sections)
    res = run_cli(["search", "--space", str(space), "--study", name, "--storage", url], studies)
    assert res.returncode == 0, res.stderr
    load(url, name).set_user_attr(ATTR_TARGET, n_trials)
    return space


def ghost(study: optuna.Study, **user_attrs: Any) -> optuna.Trial:
    """A RUNNING trial of a driver that is gone: another host's, whose last heartbeat is an hour old."""
    t = study.ask({"x": DIST})
    t.set_user_attr("worker", {"host": "elsewhere", "boot_id": "b", "pidns": 1, "pid": 1, "started": 0.0})
    for k, v in user_attrs.items():
        t.set_user_attr(k, v)
    study._storage.set_trial_system_attr(t._trial_id, ATTR_HEARTBEAT, time.time() - GHOST_AGE_S)
    return t


# ----------------------------------------------------------------------------- 1. a live driver is not taken for dead
def test_a_live_driver_in_another_pid_namespace_is_not_taken_for_dead(tmp_path: Path, studies: Path,
                                                                       study_name: str) -> None:
    _need(PG_URL)
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-pf", "--mount-proc", "true"]).returncode:
        pytest.skip("cannot make a pid namespace here (unshare)")
    # (a grace of GRACE_S: only a pid wrongly judged across namespaces could fail the live trial, not a late beat)
    space = fake_space(tmp_path, overrides={"trainer.total_training_steps": 30, "fake.step_s": 0.2},
                       study={"n_trials": 1, "heartbeat_interval": 1, "grace_period": GRACE_S})
    tag = uuid.uuid4().hex
    inside = start(["search", "--space", str(space), "--study", study_name, "--storage", PG_URL], studies, tag,
                   prefix=("unshare", "-pf", "--mount-proc"))
    wait_for(lambda: (studies / study_name / "trials" / "0" / "metrics.jsonl").exists())
    ident = load(PG_URL, study_name).trials[0].user_attrs["worker"]
    assert ident["pid"] < 100, ident  # the pid inside the namespace, meaningless outside it
    outside = run_cli(["resume", "--study", study_name, "--storage", PG_URL], studies, timeout=300, TEST_TAG=tag)
    out, err = inside.communicate(timeout=300)
    assert outside.returncode == 0 and inside.returncode == 0, (outside.stderr, err)
    trials = load(PG_URL, study_name).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE], [(t.number, t.state, t.user_attrs) for t in trials]
    assert trials[0].user_attrs["last_step"] == 30 and "its driver is gone" not in outside.stdout


def test_a_driver_whose_trial_was_finished_elsewhere_goes_on(tmp_path: Path, studies: Path, study_name: str) -> None:
    """Someone else fails our running trial (taking us for dead): we drop it, note it, and run the retry.
    Trial 0 runs until its driver stops it (``GATE``), so it cannot finish before the driver notices, however
    slow the machine; the retry is the fake trainer."""
    _need(PG_URL)
    gate, first = tmp_path / "gate.py", tmp_path / "first-run"
    gate.write_text(GATE)
    space = fake_space(tmp_path, study={"n_trials": 1, "heartbeat_interval": 1, "grace_period": GRACE_S},
                       trial={"command": [PY, str(gate), str(first), PY, str(ROOT / "tests/hpo/fake_trainer.py"),
                                          "train"]})
    driver = start(["search", "--space", str(space), "--study", study_name, "--storage", PG_URL], studies, "x")
    wait_for(first.exists)
    study = load(PG_URL, study_name)
    assert [t.state for t in study.trials] == [TrialState.RUNNING]
    t0 = study.trials[0]
    study._storage.set_trial_state_values(t0._trial_id, TrialState.FAIL)  # what a mistaken recovery does
    from hpo.study._recovery import queue_retry

    queue_retry(study, study.trials[0], None)
    out, err = driver.communicate(timeout=300)
    assert driver.returncode == 0, err
    assert "Traceback" not in err and "finished by another driver" in out
    trials = load(PG_URL, study_name).trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert trials[1].params == t0.params and trials[1].system_attrs["failed_trial"] == 0


# ----------------------------------------------------------------------------- 2. one retry per dead trial
def _recover(url: str, name: str, ready: Any, out: Any) -> None:
    study = load(url, name)
    ready.wait(timeout=WAIT_S)  # every process has started and connected: all recover at once
    out.put(recover_stale_trials(study, grace_period=GRACE_S, max_retry=3))


@pytest.mark.parametrize("url", [PG_URL, REDIS_URL], ids=["postgresql", "redis"])
@pytest.mark.slow  # ~30-100 s on 2 busy cores: make test-slow (CI runs it)
def test_drivers_recovering_at_once_queue_one_retry(url: str, study_name: str) -> None:
    _need(url)
    study = optuna.create_study(study_name=study_name, storage=open_storage(url))
    ctx = mp.get_context("spawn")
    for _round in range(3):
        dead = ghost(study)
        q, ready = ctx.Queue(), ctx.Barrier(4)
        procs = [ctx.Process(target=_recover, args=(url, study_name, ready, q)) for _ in range(4)]
        for p in procs:
            p.start()
        results = [q.get(timeout=WAIT_S * 2) for _ in procs]
        for p in procs:
            p.join(timeout=WAIT_S)
        assert sum(len(r) for r in results) == 1, results
        retries = [t for t in load(url, study_name).trials if t.system_attrs.get("failed_trial") == dead.number]
        assert len(retries) == 1 and retries[0].state == TrialState.WAITING
        study.tell(study.ask(), 0.0)  # pop and finish the retry before the next round


# ----------------------------------------------------------------------------- 3. a retry carries no outcome
@pytest.mark.parametrize("url", [PG_URL, REDIS_URL], ids=["postgresql", "redis"])
def test_a_retry_carries_params_and_system_attrs_only(url: str, tmp_path: Path, studies: Path,
                                                      study_name: str) -> None:
    _need(url)
    make_study(url, study_name, tmp_path, studies, n_trials=2)
    study = load(url, study_name)
    dead = ghost(study, fail_reason="oom", stderr_tail="Killed", stop_reason="pruned", curve={"2": 0.1},
                 **{"score/reward": 0.5})
    study._storage.set_trial_system_attr(dead._trial_id, "custom:tag", "kept")
    res = run_cli(["resume", "--study", study_name, "--storage", url], studies)
    assert res.returncode == 0, res.stderr
    trials = load(url, study_name).trials
    retry = next(t for t in trials if t.system_attrs.get("failed_trial") == dead.number)
    assert retry.state == TrialState.COMPLETE and retry.params == dead.params
    assert retry.system_attrs["custom:tag"] == "kept" and retry.system_attrs["retry_history"] == [dead.number]
    for k in ("fail_reason", "stderr_tail", "stop_reason", "curve", "score/reward"):
        assert k not in retry.user_attrs, k
    assert retry.user_attrs["worker"]["pid"] != 1
    assert sum(is_finished(t) for t in trials) == 2


def test_a_death_after_the_result_was_recorded_finishes_the_trial(tmp_path: Path, studies: Path,
                                                                 study_name: str) -> None:
    _need(PG_URL)
    make_study(PG_URL, study_name, tmp_path, studies, n_trials=2)
    study = load(PG_URL, study_name)
    dead = ghost(study)
    study._storage.set_trial_system_attr(dead._trial_id, ATTR_RESULT, {"state": "COMPLETE", "values": [0.97]})
    res = run_cli(["resume", "--study", study_name, "--storage", PG_URL], studies)
    assert res.returncode == 0, res.stderr
    trials = load(PG_URL, study_name).trials
    assert len(trials) == 2 and trials[1].state == TrialState.COMPLETE and trials[1].value == 0.97
    assert "recorded complete" in res.stdout


# ----------------------------------------------------------------------------- 4. Redis recovers stale trials
def test_redis_recovers_a_ghost_trial_by_heartbeat(tmp_path: Path, studies: Path, study_name: str) -> None:
    _need(REDIS_URL)
    make_study(REDIS_URL, study_name, tmp_path, studies, n_trials=2)
    dead = ghost(load(REDIS_URL, study_name))
    res = run_cli(["resume", "--study", study_name, "--storage", REDIS_URL], studies)
    assert res.returncode == 0, res.stderr
    trials = load(REDIS_URL, study_name).trials
    assert trials[dead.number].state == TrialState.FAIL
    assert [t.state for t in trials if t.system_attrs.get("failed_trial") == dead.number] == [TrialState.COMPLETE]


def test_heartbeats_keep_a_trial_alive_and_survive_storage_errors(study_name: str) -> None:
    _need(PG_URL)
    storage = open_storage(PG_URL)
    study = optuna.create_study(study_name=study_name, storage=storage)
    t = study.ask({"x": DIST})
    t.set_user_attr("worker", {"host": "elsewhere", "pid": 1, "started": 0.0})
    real = storage.set_trial_system_attr
    calls = {"n": 0}

    def flaky(trial_id: int, key: str, value: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            from sqlalchemy.exc import OperationalError

            raise OperationalError("UPDATE", {}, Exception("server closed the connection"))
        real(trial_id, key, value)

    storage.set_trial_system_attr = flaky  # one failing write, as a dropped connection
    with Heartbeat(study, interval=0.5) as hb:
        lost = hb.add(t._trial_id)
        wait_for(lambda: hb.errors == 1)
        failed_at = time.time()
        wait_for(lambda: storage.get_trial(t._trial_id).system_attrs[ATTR_HEARTBEAT] > failed_at)  # beats resumed
        assert hb.errors == 1 and not lost.is_set()
        assert recover_stale_trials(study, grace_period=GRACE_S, max_retry=3) == []
        storage.set_trial_state_values(t._trial_id, TrialState.FAIL)  # someone else finishes it
        wait_for(lost.is_set)


# ----------------------------------------------------------------------------- 5 + 6. seeds and the target
@pytest.mark.slow  # ~30-100 s on 2 busy cores: make test-slow (CI runs it)
def test_joining_workers_draw_different_parameters_and_hit_the_target(tmp_path: Path, studies: Path,
                                                                      study_name: str) -> None:
    _need(PG_URL)
    log = tmp_path / "runs.jsonl"
    make_study(PG_URL, study_name, tmp_path, studies, n_trials=3,
               overrides={"trainer.total_training_steps": 10, "fake.step_s": 0.1, "fake.log_file": str(log)},
               study={"sampler": {"type": "random", "seed": 0}}, trial={"n_jobs": 2})
    workers = [start(["worker", "--study", study_name, "--storage", PG_URL], studies, "w") for _ in range(2)]
    for w in workers:
        _, err = w.communicate(timeout=300)
        assert w.returncode == 0, err
    trials = load(PG_URL, study_name).trials
    done = [t for t in trials if is_finished(t)]
    assert len(done) == 3, [(t.number, t.state, t.user_attrs.get("stop_reason")) for t in trials]
    xs = [t.params["x"] for t in done]
    assert len(set(xs)) == 3, xs
    assert all(t.user_attrs.get("stop_reason") == "surplus" for t in trials if not is_finished(t))
    assert len(log.read_text().splitlines()) == 3  # surplus trials never ran a process


@pytest.mark.slow  # ~30-100 s on 2 busy cores: make test-slow (CI runs it)
def test_drivers_starting_together_on_a_fresh_sqlite_file(tmp_path: Path, studies: Path) -> None:
    space = fake_space(tmp_path, study={"n_trials": 4})
    drivers = [start(["search", "--space", str(space)], studies, "s") for _ in range(3)]
    for d in drivers:
        _, err = d.communicate(timeout=300)
        assert d.returncode == 0, err
    trials = optuna.load_study(study_name="fake", storage=f"sqlite:///{studies / 'fake.db'}").trials
    assert sum(is_finished(t) for t in trials) == 4


# ----------------------------------------------------------------------------- 8. GPUs on one host
@pytest.mark.slow  # ~30-100 s on 2 busy cores: make test-slow (CI runs it)
def test_two_drivers_never_share_a_gpu(tmp_path: Path, studies: Path, study_name: str) -> None:
    _need(PG_URL)
    log = tmp_path / "runs.jsonl"
    # trials of ~2 s: a device wait (a whole trial) stays far above a launch overhead inflated by a busy machine
    make_study(PG_URL, study_name, tmp_path, studies, n_trials=7,
               overrides={"trainer.total_training_steps": 6, "fake.step_s": 0.3, "fake.log_file": str(log)},
               trial={"devices": ["0", "1"], "n_jobs": 2})
    runtime = tmp_path / "runtime"
    workers = [subprocess.Popen([PY, "-m", "hpo", "worker", "--study", study_name, "--storage", PG_URL,
                                 "--studies-dir", str(studies)], cwd=ROOT,
                                env=cli_env(VERL_HPO_RUNTIME_DIR=str(runtime)), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for w in workers:
        _, err = w.communicate(timeout=300)
        assert w.returncode == 0, err
    runs = [json.loads(line) for line in log.read_text().splitlines()][1:]  # after the study's first trial
    assert {r["cuda"] for r in runs} <= {"0", "1"} and len(runs) == 6
    for gpu in ("0", "1"):
        spans = sorted((r["start"], r["end"]) for r in runs if r["cuda"] == gpu)
        assert all(a[1] <= b[0] + 0.05 for a, b in zip(spans, spans[1:])), spans
    waited = [t.user_attrs["device_wait_s"] for t in load(PG_URL, study_name).trials if "device_wait_s" in t.user_attrs]
    assert max(waited) > 0.1  # four jobs, two GPUs: someone waited, and that is not launch overhead
    assert max(t.user_attrs["launch_overhead_s"] for t in load(PG_URL, study_name).trials
               if "launch_overhead_s" in t.user_attrs) < max(waited)


def test_more_gpus_per_trial_than_exist_is_one_line(tmp_path: Path, studies: Path) -> None:
    space = fake_space(tmp_path, trial={"devices": ["0"], "gpus_per_trial": 4})
    res = run_cli(["search", "--space", str(space)], studies)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "gpus_per_trial=4" in res.stderr
    assert not (studies / "fake.db").exists()


def test_grace_period_under_two_heartbeats_is_one_line(tmp_path: Path, studies: Path) -> None:
    space = fake_space(tmp_path, study={"heartbeat_interval": 5, "grace_period": 8})
    res = run_cli(["search", "--space", str(space)], studies)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "study.grace_period" in res.stderr


# ----------------------------------------------------------------------------- chaos
@pytest.mark.slow
@pytest.mark.parametrize("url", [PG_URL, REDIS_URL], ids=["postgresql", "redis"])
def test_chaos_three_workers_killed_at_random(url: str, tmp_path: Path, studies: Path, study_name: str) -> None:
    """3 workers on one study; a random worker is SIGKILLed at a random moment 5 times and restarted. At the
    end: exactly n_trials finished, no parameter set run twice except declared retries, every completed
    trial intact, no trial process left, every interrupted trial retried exactly once."""
    _need(url)
    n_trials, kills = 16, 5
    rng = random.Random(uuid.uuid4().int)
    log = tmp_path / "runs.jsonl"
    make_study(url, study_name, tmp_path, studies, n_trials=n_trials,
               overrides={"trainer.total_training_steps": 8, "fake.step_s": 0.1, "fake.log_file": str(log)},
               study={"heartbeat_interval": 1, "grace_period": 3, "max_retry": 10})
    tag = uuid.uuid4().hex
    workers = [start(["worker", "--study", study_name, "--storage", url], studies, tag) for _ in range(3)]
    killed, deadline = 0, time.monotonic() + 120
    study = load(url, study_name)
    while killed < kills and time.monotonic() < deadline:
        if any(w.poll() is not None for w in workers):
            break  # the study is done
        time.sleep(rng.uniform(0.0, 0.8))  # a random moment of a running trial (or of its start or end)
        if kill_a_busy_driver(workers, study.get_trials(states=(TrialState.RUNNING,)), rng,
                              ["worker", "--study", study_name, "--storage", url], studies, tag):
            killed += 1
    all_exit_cleanly(workers)
    assert killed == kills, "the study ended before the chaos"
    wait_for(lambda: not trial_procs(tag))
    trials = load(url, study_name).trials
    done = [t for t in trials if is_finished(t)]
    assert len(done) == n_trials
    for t in done:
        assert t.state == TrialState.COMPLETE and t.value == pytest.approx(1 - (t.params["x"] - 0.3) ** 2)
        assert t.user_attrs["exit_code"] == 0 and t.user_attrs["last_step"] == 8
    interrupted = [t for t in trials if t.state == TrialState.FAIL and t.user_attrs.get("stop_reason") != "surplus"]
    retries = Counter(t.system_attrs["failed_trial"] for t in trials if "failed_trial" in t.system_attrs)
    assert all(retries[t.number] == 1 for t in interrupted), (retries, [t.number for t in interrupted])
    assert set(retries) == {t.number for t in interrupted}
    runs = Counter(json.loads(line)["x"] for line in log.read_text().splitlines())
    declared = Counter(t.params["x"] for t in trials if "failed_trial" in t.system_attrs)
    assert all(n == 1 or n <= 1 + declared[x] for x, n in runs.items()), runs
    print(f"chaos {url.split(':')[0]}: {killed} kills, {len(trials)} trials, {len(done)} finished, "
          f"{len(interrupted)} interrupted and retried, "
          f"{sum(t.user_attrs.get('stop_reason') == 'surplus' for t in trials)} surplus")


# ----------------------------------------------------------------------------- successive halving, killed at a rung
@pytest.mark.slow
def test_workers_killed_at_a_rung_boundary_keep_successive_halving_whole(tmp_path: Path, studies: Path,
                                                                          study_name: str) -> None:
    """3 workers on PostgreSQL run successive halving (rungs at steps 2 and 6); a worker is SIGKILLed right after one
    of its trials completed a rung, 3 times, and restarted. At the end: exactly n_trials finished; every interrupted
    trial retried once, its retry carrying the rungs it had completed (and so never judged at them again); every
    pruned trial stopped at a rung; every completed one passed both."""
    _need(PG_URL)
    n_trials, kills = 12, 3
    make_study(PG_URL, study_name, tmp_path, studies, n_trials=n_trials,
               overrides={"trainer.total_training_steps": 8, "trainer.test_freq": 2, "fake.step_s": 0.15},
               study={"heartbeat_interval": 1, "grace_period": 3, "max_retry": 10,
                      "pruner": {"type": "successive_halving", "min_resource": 2, "reduction_factor": 3}})
    tag = uuid.uuid4().hex
    workers = [start(["worker", "--study", study_name, "--storage", PG_URL], studies, tag) for _ in range(3)]
    study = load(PG_URL, study_name)
    killed, seen, deadline = 0, set(), time.monotonic() + 240
    while killed < kills and time.monotonic() < deadline and all(w.poll() is None for w in workers):
        at_rung = [t for t in study.get_trials(states=(TrialState.RUNNING,))
                   if t.number not in seen and any(k.startswith("completed_rung_") for k in t.system_attrs)]
        pids = {t.user_attrs.get("worker", {}).get("pid"): t for t in at_rung}
        victim = next((i for i, w in enumerate(workers) if w.pid in pids), None)
        if victim is None:
            time.sleep(0.05)
            continue
        seen.add(pids[workers[victim].pid].number)
        workers[victim].send_signal(signal.SIGKILL)
        workers[victim].wait()
        killed += 1
        workers[victim] = start(["worker", "--study", study_name, "--storage", PG_URL], studies, tag)
    for w in workers:
        _, err = w.communicate(timeout=300)
        assert w.returncode == 0, err
    assert killed == kills, "the study ended before the kills"
    wait_for(lambda: not trial_procs(tag))
    trials = load(PG_URL, study_name).trials
    done = [t for t in trials if is_finished(t)]
    assert len(done) == n_trials
    by_number = {t.number: t for t in trials}
    retries = Counter(t.system_attrs["failed_trial"] for t in trials if "failed_trial" in t.system_attrs)
    interrupted = [t for t in trials if t.state == TrialState.FAIL and t.user_attrs.get("stop_reason") != "surplus"]
    assert {t.number for t in interrupted} >= seen and all(retries[t.number] == 1 for t in interrupted)
    for t in trials:
        if "failed_trial" in t.system_attrs:  # a retry starts at the rungs its attempt completed
            before = by_number[t.system_attrs["failed_trial"]].system_attrs
            for k, v in before.items():
                if k.startswith("completed_rung_"):
                    assert t.system_attrs.get(k) == v, (t.number, k)
    for t in done:
        rungs = sorted(k for k in t.system_attrs if k.startswith("completed_rung_"))
        if t.state == TrialState.PRUNED:
            assert max(t.intermediate_values) in (2, 6) and rungs, (t.number, t.intermediate_values, rungs)
        else:
            assert t.state == TrialState.COMPLETE and rungs == ["completed_rung_0", "completed_rung_1"], t.number
            assert t.user_attrs["last_step"] == 8


# ----------------------------------------------------------------------------- a proxy search's tie runs
@pytest.mark.slow  # ~60-120 s on 2 busy cores: make test-slow (CI runs it)
def test_workers_killed_at_random_run_each_proxy_tie_run_once_and_promote_once(tmp_path: Path, studies: Path,
                                                                               study_name: str) -> None:
    """A proxy search (study.fidelity.proxy) on PostgreSQL whose small model scores every setting alike on the tuning
    seed (fake.small_flat_seed=1): its 3 settings are tied, so they run again on the proxy before the promotion, round
    by round (tie_seeds 2: all 3 on the first seed, then those still tied on the second). 3 drivers start together;
    one of them is SIGKILLed while a tie or promoted run of its own is running, 3 times, and restarted as a worker. At
    the end: the ties kept once (the 3 settings, 2 seeds); each (setting, seed) of the rounds ran to exactly one
    result (an interrupted attempt's retry instead of it, never a second run); each promoted setting ran once on the
    target, the promotion in the order of the means over the proxy's seeds; no trial process left."""
    from hpo.record import (
        ATTR_PROMOTED_FROM,
        ATTR_PROMOTION,
        ATTR_PROXY_TIES,
        ATTR_TIE_OF,
        ATTR_TIE_SEED,
        is_promoted,
        is_proxy,
        is_tie_run,
    )
    from tests.hpo.study.test_proxy_fidelity import models

    _need(PG_URL)
    large, small = models(tmp_path)
    space = fake_space(
        tmp_path, overrides={"trainer.total_training_steps": 10, "trainer.test_freq": 5, "fake.step_s": 0.1,
                             "actor_rollout_ref.model.path": str(large), "fake.model": "large"},
        study={"n_trials": 3, "heartbeat_interval": 1, "grace_period": 3, "max_retry": 10,
               "fidelity": {"proxy": {"overrides": {"actor_rollout_ref.model.path": str(small), "fake.model": "small",
                                                    "fake.small_step_s": 0.1, "fake.small_flat_seed": 1},
                                      "promote": 3, "promote_steps": 5, "tie_seeds": 2}}},
        trial={"n_jobs": 1})
    tag = uuid.uuid4().hex
    search = ["search", "--space", str(space), "--study", study_name, "--storage", PG_URL]
    worker = ["worker", "--study", study_name, "--storage", PG_URL]
    drivers = [start(search, studies, tag) for _ in range(3)]
    rng = random.Random(uuid.uuid4().int)
    killed, deadline = 0, time.monotonic() + 240
    study: optuna.Study | None = None
    while killed < 3 and time.monotonic() < deadline and all(d.poll() is None for d in drivers):
        time.sleep(rng.uniform(0.0, 0.5))  # a random moment of a tie or promoted run (or of its start or end)
        try:
            study = study or load(PG_URL, study_name)
        except KeyError:  # not created yet
            continue
        running = [t for t in study.get_trials(states=(TrialState.RUNNING,)) if is_tie_run(t) or is_promoted(t)]
        if kill_a_busy_driver(drivers, running, rng, worker, studies, tag):
            killed += 1
    all_exit_cleanly(drivers)
    assert killed == 3, "the study ended before the kills"
    wait_for(lambda: not trial_procs(tag))
    study = load(PG_URL, study_name)
    trials = study.trials
    system = study._storage.get_study_system_attrs(study._study_id)
    search_trials = [t for t in trials if is_proxy(t) and not is_tie_run(t) and is_finished(t)]
    assert len(search_trials) == 3 and {t.value for t in search_trials} == {0.9}
    seeds = system[ATTR_PROXY_TIES]["seeds"]
    assert sorted(system[ATTR_PROXY_TIES]["settings"]) == sorted(t.number for t in search_trials) and len(seeds) == 2
    # round 1: the 3 on the first seed; round 2: those still within the resolution (1% of 0.9) of the best mean
    value = {t.number: 1 - (t.params["x"] - 0.3) ** 2 for t in search_trials}  # the small model on other seeds
    after = {n: (0.9 + v) / 2 for n, v in value.items()}
    second = [n for n in after if max(after.values()) - after[n] <= 0.009 + 1e-12]
    expected = [(n, seeds[0]) for n in value] + ([(n, seeds[1]) for n in second] if len(second) >= 2 else [])
    ran = Counter((t.system_attrs[ATTR_TIE_OF], t.system_attrs[ATTR_TIE_SEED]) for t in trials
                  if is_tie_run(t) and is_finished(t))
    assert ran == Counter(expected), (ran, expected)  # each once: a killed attempt's retry instead, never twice
    for t in trials:
        if is_tie_run(t) and is_finished(t):
            assert t.value == pytest.approx(value[t.system_attrs[ATTR_TIE_OF]]) and t.user_attrs["last_step"] == 10
    promoted = Counter(t.system_attrs[ATTR_PROMOTED_FROM] for t in trials if is_promoted(t) and is_finished(t))
    assert promoted == Counter({t.number: 1 for t in search_trials}), promoted
    runs = Counter(n for n, _ in expected)
    means = {n: (0.9 + runs[n] * v) / (1 + runs[n]) for n, v in value.items()}
    assert system[ATTR_PROMOTION]["candidates"] == sorted(means, key=lambda n: -means[n])
