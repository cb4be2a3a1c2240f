"""A PostgreSQL (or Redis) server that goes away and comes back: storage calls wait for it
(``study.storage_retry_s``), running trials go on, and a study run by several workers ends exactly as without
the outage.

Each test module run starts its own server (initdb + pg_ctl on a free port in a temporary directory; as the
``postgres`` user when run as root, which initdb refuses), so stopping it disturbs nobody else."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from hpo.experiment._space import StudySpec
from hpo.storages._storage import open_storage
from tests.hpo.conftest import PY, ROOT, cli_env, fake_space, run_cli


def _pg_bin() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    return Path(dirs[-1]) if dirs and (Path(dirs[-1]) / "initdb").exists() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """A private PostgreSQL cluster: ``stop()`` (fast shutdown: every connection is dropped) and ``start()``."""

    def __init__(self, bin_dir: Path, root: Path, user: str | None) -> None:
        self.bin, self.root, self.port = bin_dir, root, _free_port()
        self.data, self.log = root / "data", root / "server.log"
        self.prefix = ["runuser", "-u", user, "--"] if user else []
        self.url = f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        res = subprocess.run([*self.prefix, str(self.bin / args[0]), *args[1:]], capture_output=True, text=True,
                             timeout=120)
        if res.returncode:
            raise RuntimeError(f"{args[0]} failed: {res.stderr.strip() or res.stdout.strip()}")

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")

    def start(self) -> None:
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w", "-t", "60", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def up(self) -> bool:
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", self.port)) == 0


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    bin_dir = _pg_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL's initdb/pg_ctl are not installed (apt-get install postgresql)")
    if importlib.util.find_spec("psycopg2") is None:
        pytest.skip("psycopg2 is not installed")
    user = None
    if os.geteuid() == 0:  # initdb refuses to run as root
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: cannot start a private PostgreSQL server")
        try:
            user = pwd.getpwnam("postgres").pw_name
        except KeyError:
            pytest.skip("running as root and there is no postgres user to run a private server as")
    root = Path(tempfile.mkdtemp(prefix="hpo-pg-"))  # not under pytest's 0700 tmp: the server user must enter
    if user:
        shutil.chown(root, user)
    pg = PgServer(bin_dir, root, user)
    try:
        pg.init()
        pg.start()
        yield pg
    finally:
        try:
            if pg.up():
                pg.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg(server: PgServer) -> PgServer:
    if not server.up():  # an earlier test failed while its server was down
        server.start()
    return server


def _count_failures(storage: object) -> Counter[int]:
    """Failed tries of ``storage``'s calls from now on, by the thread that made them (each failed try drops the
    pool's connections once: that reset is counted; the storage still does it)."""
    retrier = storage._retrier  # type: ignore[attr-defined]
    reset, counts = retrier._reset, Counter[int]()

    def counted() -> None:
        counts[threading.get_ident()] += 1
        if reset is not None:
            reset()

    retrier._reset = counted
    return counts


def wait_for(pred: Callable[[], bool], timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


# ----------------------------------------------------------------------------- the storage
def test_a_restart_during_a_call_is_ridden_out(pg: PgServer, capsys: pytest.CaptureFixture[str]) -> None:
    """Calls made while the server is down wait for it; the pool reconnects; the outage is counted once."""
    from hpo.storages._retrying import storage_downtime, storage_outages

    storage = open_storage(pg.url, StudySpec(storage_retry_s=120))
    study = optuna.create_study(study_name=f"r-{uuid.uuid4().hex[:8]}", storage=storage)
    trials = [study.ask() for _ in range(3)]
    errors: list[BaseException] = []

    def tell(t: optuna.Trial) -> None:
        try:
            study.tell(t, 0.5)
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    failures = _count_failures(storage)
    stopped = time.monotonic()
    pg.stop()
    threads = [threading.Thread(target=tell, args=(t,)) for t in trials]
    for th in threads:
        th.start()
    wait_for(lambda: storage_outages(storage) == 1, what="the outage to be noticed")
    seen = time.monotonic()  # the outage began before this
    # the calls wait (what is being tested), they do not fail: each thread's call has failed and been retried
    wait_for(lambda: len(failures) == len(threads) and min(failures.values()) >= 3, what="every call to retry")
    assert all(th.is_alive() for th in threads) and not errors, errors
    restarting = time.monotonic()  # no call can succeed before this
    pg.start()
    for th in threads:
        th.join(timeout=60)
    assert not errors, errors
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
    # the outage is counted once, and its length is what the test saw of it (bounds the test measured itself)
    assert storage_outages(storage) == 1
    assert restarting - seen <= storage_downtime(storage) <= time.monotonic() - stopped
    err = capsys.readouterr().err
    assert "unreachable" in err and "reachable again after" in err and "invalid data" not in err


def test_an_idle_pool_reconnects_after_a_restart(pg: PgServer) -> None:
    """Pooled connections the restart killed are replaced before use (pool_pre_ping): no error, no outage."""
    from hpo.storages._retrying import storage_outages

    storage = open_storage(pg.url, StudySpec(storage_retry_s=30))
    study = optuna.create_study(study_name=f"i-{uuid.uuid4().hex[:8]}", storage=storage)
    study.tell(study.ask(), 1.0)
    pg.stop()
    pg.start()
    study.tell(study.ask(), 2.0)
    assert [t.value for t in study.trials] == [1.0, 2.0] and storage_outages(storage) == 0


@pytest.mark.timeout(300)  # a call that never gives up fails here instead of hanging
def test_past_the_window_a_call_raises_one_line_without_the_password(pg: PgServer,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from hpo.storages._retrying import StorageUnavailable, storage_downtime, storage_error_line, storage_outages

    secret = "s3cret-pw"  # trust authentication ignores it
    url = pg.url.replace("postgres@", f"postgres:{secret}@")
    storage = open_storage(url, StudySpec(storage_retry_s=1.5))
    study = optuna.create_study(study_name=f"g-{uuid.uuid4().hex[:8]}", storage=storage)
    trial = study.ask()
    failures = _count_failures(storage)
    pg.stop()
    t0 = time.monotonic()
    with pytest.raises(StorageUnavailable) as caught:
        trial.set_user_attr("k", 1)
    took = time.monotonic() - t0
    line = str(caught.value)
    assert took >= 1.5, took  # it waited out the window (a lower bound: a slow machine only waits longer)
    # ... trying again with backoff, not in a tight loop and not for longer: the sleeps between tries are at least
    # half of 0.1, 0.2, 0.4, 0.8 s, so 1.5 s are over after six tries at most (a slower machine makes fewer)
    assert 2 <= sum(failures.values()) <= 6, failures
    assert "\n" not in line and secret not in line and "***" in line, line
    assert "unreachable for" in line and "study.storage_retry_s=1.5" in line and "Connection refused" in line, line
    assert storage_error_line(caught.value, url) == line
    failures.clear()
    with pytest.raises(StorageUnavailable):  # past the window: one try, no new wait
        study.get_trials()
    assert sum(failures.values()) == 1, failures
    assert secret not in capsys.readouterr().err
    pg.start()
    trial.set_user_attr("k", 2)  # back: the outage ends
    assert storage_outages(storage) == 1 and storage_downtime(storage) >= 1.5
    assert study.trials[0].user_attrs["k"] == 2


def test_threads_working_through_rapid_restarts_see_no_error(pg: PgServer) -> None:
    """Four threads ask, suggest, write attributes, report and tell while the server restarts again and again
    (connections die mid-query, mid-commit, in the pool): not one error reaches them, every trial completes
    once. (Optuna's trial read retries a broken query on the broken session: PendingRollbackError.)"""
    from hpo.storages._retrying import storage_outages

    storage = open_storage(pg.url, StudySpec(storage_retry_s=120))
    study = optuna.create_study(study_name=f"t-{uuid.uuid4().hex[:8]}", storage=storage)
    stop, errors, told = threading.Event(), list[BaseException](), [0]

    def work(i: int) -> None:
        while not stop.is_set():
            try:
                t = study.ask()
                x = t.suggest_float("x", 0.0, 1.0)
                t.set_user_attr("thread", i)
                t.report(x, 1)
                study.get_trials(deepcopy=False)
                study.tell(t, x)
                told[0] += 1
            except BaseException as err:  # noqa: BLE001
                errors.append(err)
                return

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    try:
        for k in range(8):
            wait_for(lambda n=told[0]: told[0] >= n + 5 or bool(errors), 60, "work between restarts")
            pg.stop()
            wait_for(lambda k=k: storage_outages(storage) > k or bool(errors), 60, "the outage to be noticed")
            pg.start()
    finally:
        stop.set()
        for th in threads:
            th.join(timeout=60)
    assert not errors, repr(errors[0])
    trials = study.get_trials()
    assert storage_outages(storage) >= 8 and len(trials) == told[0]
    assert {t.state for t in trials} == {TrialState.COMPLETE}


def test_a_heartbeat_missed_during_an_outage_does_not_make_a_trial_stale(pg: PgServer) -> None:
    """Nobody can beat while the database is down: a live driver on another host (pids not comparable) whose
    last beat is older than grace_period only because of the outage is not recovered; one silent for
    grace_period after the outage is."""
    from hpo.study._recovery import ATTR_HEARTBEAT, recover_stale_trials

    grace = 2.0
    storage = open_storage(pg.url, StudySpec(storage_retry_s=120))
    study = optuna.create_study(study_name=f"h-{uuid.uuid4().hex[:8]}", storage=storage)
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0.0, 1.0)})
    trial.set_user_attr("worker", {"host": "elsewhere", "boot_id": "b", "pidns": 1, "pid": 1, "started": 0.0})
    storage.set_trial_system_attr(trial._trial_id, ATTR_HEARTBEAT, time.time())
    pg.stop()
    found: list[list[tuple[int, str]]] = []
    th = threading.Thread(target=lambda: found.append(recover_stale_trials(study, grace, max_retry=1)))
    th.start()
    wait_for(lambda: storage.downtime_s > grace + 0.5, what="an outage longer than grace_period")
    pg.start()
    th.join(timeout=60)
    assert found == [[]]  # the beat is older than grace_period, but the outage ended just now
    wait_for(lambda: bool(recover_stale_trials(study, grace, max_retry=1)), 30, "the silent trial to go stale")
    assert study.trials[0].state == TrialState.FAIL


class RedisServer:
    """A private redis-server that keeps its journal on disk (append-only file), so a restart loses nothing."""

    def __init__(self, root: Path) -> None:
        self.root, self.port = root, _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
                                      str(self.root), "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.up, 30, "redis-server to listen")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()  # SIGTERM: redis flushes its append-only file and exits
            self.proc.wait(timeout=30)
            self.proc = None

    def up(self) -> bool:
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", self.port)) == 0


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None or importlib.util.find_spec("redis") is None:
        pytest.skip("redis-server or the redis package is not installed")
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_a_redis_restart_during_a_call_is_ridden_out(redis_server: RedisServer) -> None:
    """The same on a JournalStorage: a call made while Redis is down waits for it and lands once."""
    from hpo.storages._retrying import storage_outages

    storage = open_storage(redis_server.url, StudySpec(storage_retry_s=120))
    study = optuna.create_study(study_name="r", storage=storage)
    trial = study.ask()
    redis_server.stop()
    errors: list[BaseException] = []
    th = threading.Thread(target=lambda: _catch(errors, study.tell, trial, 0.5))
    th.start()
    wait_for(lambda: storage_outages(storage) == 1, what="the outage to be noticed")
    assert th.is_alive() and not errors, errors
    redis_server.start()
    th.join(timeout=60)
    assert not errors, errors
    again = optuna.load_study(study_name="r", storage=open_storage(redis_server.url))
    assert [(t.state, t.value) for t in again.trials] == [(TrialState.COMPLETE, 0.5)]


def test_a_redis_server_that_stops_answering_fails_calls_instead_of_hanging(
        redis_server: RedisServer) -> None:
    """A hung server (SIGSTOP: the port still accepts, nothing answers) must end a call with StorageUnavailable
    once the retry window is over, not block the driver for ever (redis-py >= 8 times out its reads after 5 s)."""
    from hpo.storages._retrying import StorageUnavailable

    storage = open_storage(redis_server.url, StudySpec(storage_retry_s=3))
    study = optuna.create_study(study_name="hung", storage=storage)
    assert redis_server.proc is not None
    redis_server.proc.send_signal(signal.SIGSTOP)
    errors: list[BaseException] = []
    try:
        th = threading.Thread(target=lambda: _catch(errors, study.get_trials), daemon=True)
        th.start()
        th.join(timeout=120)
        assert not th.is_alive(), "a call to a hung Redis never returned"
    finally:
        redis_server.proc.send_signal(signal.SIGCONT)
    assert len(errors) == 1 and isinstance(errors[0], StorageUnavailable), errors


def test_postgresql_connections_send_keepalives() -> None:
    """A PostgreSQL connection sends TCP keepalives (a half-open connection in a partition is found dead); a URL's
    own values win."""
    try:
        storage = open_storage("postgresql+psycopg://postgres@127.0.0.1:5432/test?keepalives_idle=7")
        with storage.inner._backend.engine.connect() as conn:  # type: ignore[attr-defined]
            params = conn.connection.dbapi_connection.info.get_parameters()
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"PostgreSQL on 127.0.0.1:5432 is not reachable ({type(err).__name__})")
    assert params.get("keepalives") == "1" and params.get("keepalives_idle") == "7"
    assert params.get("keepalives_count") == "3" and params.get("connect_timeout") == "10"


def _catch(errors: list[BaseException], fn: Callable[..., object], *args: object) -> None:
    try:
        fn(*args)
    except BaseException as err:  # noqa: BLE001
        errors.append(err)


# ----------------------------------------------------------------------------- the workers
def _start(args: list[str], studies: Path, tag: str) -> subprocess.Popen[str]:
    return subprocess.Popen([PY, "-m", "hpo", *args, "--studies-dir", str(studies)], cwd=ROOT,
                            env=cli_env(TEST_TAG=tag), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_three_workers_ride_out_two_database_restarts(pg: PgServer, tmp_path: Path) -> None:
    """3 workers on one study; the server is stopped for 20 s, twice, while trials run. Every worker waits
    and goes on; the study ends with exactly n_trials finished, every one complete and intact, nothing left
    running or waiting, no parameter set run twice."""
    from hpo.study._optuna import ATTR_TARGET
    from hpo.study._recovery import ATTR_HEARTBEAT
    from hpo.study._slots import is_finished

    n_trials, down_s, outages = 12, 20.0, 2
    name, studies, log = f"chaos-{uuid.uuid4().hex[:8]}", tmp_path / "studies", tmp_path / "runs.jsonl"
    space = fake_space(tmp_path, overrides={"trainer.total_training_steps": 10, "fake.step_s": 0.3,
                                            "fake.log_file": str(log)},
                       study={"n_trials": 1, "heartbeat_interval": 1, "grace_period": 3, "storage_retry_s": 120})
    res = run_cli(["search", "--space", str(space), "--study", name, "--storage", pg.url], studies)
    assert res.returncode == 0, res.stderr
    mine = open_storage(pg.url, StudySpec(storage_retry_s=120))  # the test's own view (waits out outages too)
    study = optuna.load_study(study_name=name, storage=mine)
    study.set_user_attr(ATTR_TARGET, n_trials)
    t_start = time.monotonic()
    workers = [_start(["worker", "--study", name, "--storage", pg.url], studies, name) for _ in range(3)]
    pids = {w.pid for w in workers}

    def running_workers() -> set[int]:
        return {t.user_attrs.get("worker", {}).get("pid") for t in study.get_trials(states=(TrialState.RUNNING,))}

    def beat_since(when: float) -> bool:  # every worker wrote to the storage (its heartbeat) after ``when``
        beats = [(t.user_attrs.get("worker", {}).get("pid"), t.system_attrs.get(ATTR_HEARTBEAT, 0.0))
                 for t in study.get_trials()]
        return all(any(pid == p and beat > when for p, beat in beats) for pid in pids)

    for _ in range(outages):
        wait_for(lambda: pids <= running_workers(), 120, "a trial running in every worker")
        pg.stop()
        deadline = time.monotonic() + down_s
        while time.monotonic() < deadline:  # the outage lasts down_s; every worker must live through it
            assert all(w.poll() is None for w in workers), [w.communicate() for w in workers if w.poll() is not None]
            time.sleep(0.2)
        back = time.time()
        pg.start()
        wait_for(lambda back=back: beat_since(back), 120, "every worker to write again after the restart")
    outputs = [w.communicate(timeout=300) for w in workers]
    took = time.monotonic() - t_start
    for w, (_out, err) in zip(workers, outputs):
        assert w.returncode == 0, err
        assert "Traceback" not in err and "invalid data" not in err, err
        assert err.count("reachable again after") == outages, err
    trials = study.get_trials()
    done = [t for t in trials if is_finished(t)]
    assert len(done) == n_trials
    assert not [t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    for t in done:
        assert t.state == TrialState.COMPLETE and t.value == pytest.approx(1 - (t.params["x"] - 0.3) ** 2)
        assert t.user_attrs["exit_code"] == 0 and t.user_attrs["last_step"] == 10
    runs = Counter(json.loads(line)["x"] for line in log.read_text().splitlines())
    declared = Counter(t.params["x"] for t in trials if "failed_trial" in t.system_attrs)
    assert all(n == 1 or n <= 1 + declared[x] for x, n in runs.items()), runs
    for out, _err in outputs:
        assert "storage unreachable for" in out, out  # the summary says how long
    others = Counter(t.user_attrs.get("stop_reason", t.state.name) for t in trials if not is_finished(t))
    print(f"restart chaos: {outages} outages of {down_s:.0f} s ridden out by 3 workers; {len(trials)} trials, "
          f"{len(done)} finished, others {dict(others)}; {took:.0f} s")
    print(outputs[0][1].strip())
    print(next(line for line in outputs[0][0].splitlines() if "storage unreachable for" in line))


def test_a_worker_waits_for_a_database_that_is_not_up_yet(pg: PgServer, tmp_path: Path) -> None:
    """``verl-hpo worker`` (often started by a scheduler before the database) waits for the storage to open
    instead of failing at once; ``search``/``resume`` still fail at once on an unreachable URL."""
    from tests.hpo.conftest import fake_space, run_cli

    studies = tmp_path / "studies"
    space = fake_space(tmp_path, name="waits", study={"n_trials": 1, "pruner": {"type": "none"},
                                                      "heartbeat_interval": 1, "grace_period": 3})
    assert run_cli(["search", "--space", str(space), "--storage", pg.url], studies).returncode == 0
    pg.stop()
    quick = run_cli(["resume", "--study", "waits", "--storage", pg.url], studies, timeout=120)
    assert quick.returncode == 1 and "Traceback" not in quick.stderr, quick.stderr[-2000:]
    from tests.hpo.conftest import PY, ROOT, cli_env

    worker = subprocess.Popen([PY, "-m", "hpo", "worker", "--study", "waits", "--storage", pg.url, "--studies-dir",
                               str(studies)], cwd=ROOT, env=cli_env(), stderr=subprocess.PIPE, text=True)
    try:
        assert worker.stderr is not None
        line = worker.stderr.readline()  # the worker says it waits (the first line it prints), then waits
        assert "unreachable" in line and "retrying for up to" in line, line
        assert worker.poll() is None
        pg.start()
        assert worker.wait(timeout=240) == 0, worker.stderr.read()[-2000:]
    finally:
        if worker.poll() is None:
            worker.kill()
    study = optuna.load_study(study_name="waits", storage=open_storage(pg.url))
    assert [t.state for t in study.trials] == [TrialState.COMPLETE]  # the target was met: the worker ran none
