"""The tracking process: ``python -m hpo.tracking._sync SPOOL STUDIES_DIR STUDY [DRIVER_PID]``, one per driver
(started by :class:`hpo.tracking._feed.TrackingFeed`), or by ``verl-hpo track`` to finish what one left.

It reads the driver's spool (:mod:`._spool`: trial start / finish / end), each running trial's metrics file (its
curves: every metric by step) and the study's storage (parameters, outcome, best value, importances), and logs
them to each tracker (:mod:`._mlflow`, :mod:`._wandb`) through a queue per tracker, in order. When a tracker is
unreachable its queue waits (backoff 1 s doubling to 15 s) while the files go on being read; nothing is dropped
and, since every step is logged only past the chain's cursor, nothing is logged twice. The cursors and run ids
are saved in ``<spool>.state.json`` (and run ids in the study's storage, :data:`._content.ATTR_RUN`).

It exits when the driver has ended (or died) and every queue is empty: 0; on SIGTERM (the driver's
``tracking.flush_s`` is over) it saves its cursors and exits 3 with a line saying what is left; when another
tracking process holds the spool's lock it logs nothing and exits 4."""

from __future__ import annotations

import collections
import json
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpo.backends import DEFAULT_BACKEND, BackendError, CommandBackend, backend_named, known_backends
from hpo.execution import MetricsFileError, MetricsTail
from hpo.execution.ray_jobs import JOB_METRICS
from hpo.experiment import TrackingSpec, redact_uri, uri_secrets
from hpo.record import ATTR_SPACE, retry_history
from hpo.storages import open_storage, scrub
from hpo.study import quiet_optuna
from hpo.tracking._check import artifact_root, mlflow_uri
from hpo.tracking._content import ATTR_KEY, ATTR_RUN, chain_info, finished, study_update
from hpo.tracking._feed import ENV_SPEC, ENV_STORAGE, EXIT_BUSY, EXIT_PENDING
from hpo.tracking._sink import Cursors, Sink
from hpo.tracking._spool import SpoolReader, sidecar, spool_lock

POLL_S = 0.5
BACKOFF_S = (1.0, 15.0)
IMPORTANCE_EVERY_S = 30.0
PAGE_EVERY_S = 10.0


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


class StudyRegistry:
    """Run ids in study system attrs (``hpo:tracking:<root>``), so a retry on another host finds its run."""

    def __init__(self, study: optuna.Study) -> None:
        self.study = study

    def run_id(self, root: int, tracker: str) -> str | None:
        ids = self.study._storage.get_study_system_attrs(self.study._study_id).get(ATTR_RUN.format(root=root))
        return ids.get(tracker) if isinstance(ids, dict) else None

    def set_run_id(self, root: int, tracker: str, run_id: str) -> None:
        key = ATTR_RUN.format(root=root)
        ids = self.study._storage.get_study_system_attrs(self.study._study_id).get(key)
        self.study._storage.set_study_system_attr(self.study._study_id, key,
                                                  {**(ids if isinstance(ids, dict) else {}), tracker: run_id})


def study_key(study: optuna.Study) -> str:
    """A random key per study (kept in the storage): tracker run ids derive from it, so a study made again under
    the same name never continues the old one's runs."""
    attrs = study._storage.get_study_system_attrs(study._study_id)
    key = attrs.get(ATTR_KEY)
    if not isinstance(key, str):
        study._storage.set_study_system_attr(study._study_id, ATTR_KEY, secrets.token_hex(4))
        key = study._storage.get_study_system_attrs(study._study_id)[ATTR_KEY]
    return str(key)


class Queue:
    """One tracker's operations, run in order; a transient error holds the queue (backoff), another drops the
    operation with one line."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.ops: collections.deque[tuple[str, Callable[[], None]]] = collections.deque()
        self.retry_at = 0.0
        self.backoff = BACKOFF_S[0]
        self.down_since: float | None = None

    def put(self, what: str, op: Callable[[], None]) -> None:
        self.ops.append((what, op))

    def pump(self, deadline: float) -> None:
        while self.ops and time.monotonic() >= self.retry_at and time.monotonic() < deadline:
            what, op = self.ops[0]
            try:
                op()
            except Exception as err:  # noqa: BLE001 - a tracker's error must never stop the others
                why = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"[:300]
                if self.sink.transient(err):
                    if self.down_since is None:
                        self.down_since = time.monotonic()
                        log(f"{self.sink.label}: unreachable ({why}); retrying, {len(self.ops)} pending")
                    self.retry_at = time.monotonic() + self.backoff
                    self.backoff = min(self.backoff * 2, BACKOFF_S[1])
                    return
                log(f"{self.sink.label}: {what} not logged: {why}")
            self.ops.popleft()
            if self.down_since is not None:
                log(f"{self.sink.label}: back after {time.monotonic() - self.down_since:.0f} s")
                self.down_since = None
            self.backoff = BACKOFF_S[0]


class Tracker:
    """Turns spool events, metrics files and the storage into each tracker's queue of operations."""

    def __init__(self, study: optuna.Study, queues: list[Queue], studies_dir: Path) -> None:
        self.study = study
        self.queues = queues
        self.page = studies_dir / study.study_name / "dashboard.html"
        self.objective_names = list(study.metric_names or [f"value_{i}" for i in range(len(study.directions))])
        space = study.user_attrs.get(ATTR_SPACE)
        trial = space.get("trial") if isinstance(space, dict) else None
        name = (trial.get("backend") or DEFAULT_BACKEND) if isinstance(trial, dict) else None
        try:  # where metrics files live; a trainer not installed here: the base class's place
            self.backend = backend_named(name) if name in known_backends() else CommandBackend()
        except BackendError:
            self.backend = CommandBackend()
        # a Ray job's metrics lines reach this host through its log: the driver keeps them in JOB_METRICS
        self.is_ray_job = isinstance(space, dict) and isinstance(space.get("trial"), dict) and \
            space["trial"].get("executor") == "ray"
        self.active: dict[int, tuple[int, MetricsTail]] = {}  # trial number -> (chain root, its metrics)
        self.ended = False
        self._page_mtime = 0.0
        self._page_checked = 0.0
        self._importances_at = 0.0

    def _trial(self, number: int) -> FrozenTrial:
        tid = self.study._storage.get_trial_id_from_study_id_trial_number(self.study._study_id, number)
        return self.study._storage.get_trial(tid)

    def _put(self, what: str, make: Callable[[Sink], Callable[[], None]]) -> None:
        for q in self.queues:
            q.put(what, make(q.sink))

    def handle(self, ev: dict[str, Any]) -> None:
        kind, number = ev.get("ev"), ev.get("trial")
        if kind == "end":
            self.ended = True
        elif kind == "start" and isinstance(number, int):
            self.start(self._trial(number))
        elif kind == "finish" and isinstance(number, int) and number in self.active:
            self.finish(self._trial(number))

    def start(self, t: FrozenTrial) -> None:
        chain = chain_info(t)
        trial_dir = Path(str(t.user_attrs.get("trial_dir", "")))
        attempt = len(retry_history(t))
        path = self.backend.metrics_path(trial_dir, attempt)
        if self.is_ray_job:
            path = trial_dir / JOB_METRICS
        self.active[t.number] = (chain.root, MetricsTail(path))
        self._put(f"trial {t.number}: open", lambda s: lambda: s.open_run(chain))

    def poll(self) -> None:
        now_ms = int(time.time() * 1000)
        for number, (root, tail) in list(self.active.items()):
            try:
                records = tail.read()
            except MetricsFileError as err:
                log(f"trial {number}: {err}")
                records = []
            if records:
                rows = [(step, data, now_ms) for step, data in records]
                self._put(f"trial {number}: steps {rows[0][0]}..{rows[-1][0]}",
                          lambda s, r=rows, c=root: lambda: s.log_steps(c, r))  # type: ignore[misc]

    def finish(self, t: FrozenTrial) -> None:
        self.poll()  # the last lines first
        root, _ = self.active.pop(t.number)
        fin = finished(t, self.objective_names)
        self._put(f"trial {t.number}: end", lambda s: lambda: s.finish_run(root, fin))
        self.update_study()

    def update_study(self, final: bool = False) -> None:
        now = time.monotonic()
        with_imp = final or now - self._importances_at >= IMPORTANCE_EVERY_S
        if with_imp:
            self._importances_at = now
        upd = study_update(self.study, with_imp, final)
        self._put("study run", lambda s: lambda: s.update_study(upd))

    def check_page(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._page_checked < PAGE_EVERY_S:
            return
        self._page_checked = now
        try:
            mtime = self.page.stat().st_mtime
        except OSError:
            return
        if mtime != self._page_mtime:
            self._page_mtime = mtime
            page = self.page
            self._put("dashboard page", lambda s: lambda: s.upload_page(page))

    def end(self) -> None:
        """The driver is done (or dead): trials it did not report finished are ended as the storage has them; a
        trial still RUNNING there (a killed driver's) is left open for its retry to continue."""
        self.poll()
        for number in list(self.active):
            t = self._trial(number)
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL):
                self.finish(t)
            else:
                self.active.pop(number)
        self.update_study(final=True)
        self.check_page(force=True)

    def pending(self) -> int:
        return sum(len(q.ops) for q in self.queues)


def make_queues(spec: TrackingSpec, study: optuna.Study, studies_dir: Path, state: dict[str, Any]) -> list[Queue]:
    key = study_key(study)
    registry = StudyRegistry(study)
    queues: list[Queue] = []
    sinks = state.setdefault("trackers", {})
    if spec.mlflow is not None:
        from hpo.tracking._mlflow import MlflowSink

        uri = strip_credentials(mlflow_uri(spec) or "")
        queues.append(Queue(MlflowSink(uri, f"MLflow {redact_uri(uri)}", spec.mlflow.experiment, study.study_name,
                                       key, Cursors(sinks.setdefault("mlflow", {})), registry,
                                       artifact_root(uri, studies_dir))))
    if spec.wandb is not None:
        from hpo.tracking._wandb import WandbSink

        wb = spec.wandb
        directory = Path(wb.dir) if wb.dir else studies_dir / study.study_name / "tracking"
        queues.append(Queue(WandbSink(wb.project, wb.entity, wb.mode, directory, study.study_name, key,
                                      Cursors(sinks.setdefault("wandb", {})))))
    return queues


def strip_credentials(uri: str) -> str:
    """``http://user:pw@host`` -> ``http://host``, the user and password moved to ``MLFLOW_TRACKING_USERNAME`` /
    ``MLFLOW_TRACKING_PASSWORD`` (MLflow's basic auth): MLflow prints and raises with its URI (run links, request
    errors), and those lines go to the tracking log."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    os.environ["MLFLOW_TRACKING_USERNAME"] = unquote(parts.username or "")
    os.environ["MLFLOW_TRACKING_PASSWORD"] = unquote(parts.password)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _save(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def run(spool: Path, studies_dir: Path, study_name: str, driver_pid: int | None, spec: TrackingSpec,
        storage_url: str) -> int:
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's; it ends us through the spool
    with spool_lock(spool, wait=False) as got:
        if not got:
            log(f"another tracking process works on {spool}")
            return EXIT_BUSY
        state_path = sidecar(spool, ".state.json")
        try:
            state: dict[str, Any] = json.loads(state_path.read_text())
        except (OSError, ValueError):
            state = {}
        quiet_optuna()
        study = optuna.load_study(study_name=study_name, storage=open_storage(storage_url))
        queues = make_queues(spec, study, studies_dir, state)
        tracker = Tracker(study, queues, studies_dir)
        reader = SpoolReader(spool)
        saved = 0.0
        ended_at: float | None = None
        try:
            while not stop:
                for ev in reader.read():
                    tracker.handle(ev)
                if ended_at is None and (tracker.ended or not _alive(driver_pid)):
                    for ev in reader.read():  # the driver's last lines
                        tracker.handle(ev)
                    tracker.end()
                    ended_at = time.monotonic()
                else:
                    tracker.poll()
                    tracker.check_page()
                for q in queues:
                    q.pump(time.monotonic() + 5.0)
                if time.monotonic() - saved > 1.0:
                    _save(state_path, state)
                    saved = time.monotonic()
                if ended_at is not None and tracker.pending() == 0:
                    break
                time.sleep(POLL_S if tracker.pending() == 0 else 0.1)
        finally:
            for q in queues:
                try:
                    if not q.ops:
                        q.sink.close()
                except Exception as err:  # noqa: BLE001
                    log(f"{q.sink.label}: close: {type(err).__name__}: {err}")
            _save(state_path, state)
        left = tracker.pending()
        if left or ended_at is None:
            down = ", ".join(q.sink.label for q in queues if q.ops)
            log(f"stopped with {left} operation(s) not yet logged" + (f" ({down} unreachable)" if down else ""))
            return EXIT_PENDING
        log("everything logged")
        return 0


class _Scrubbed:
    """A text stream that writes through to ``inner`` with each of ``secrets`` replaced by ``***``: the tracking
    process's stdout and stderr, where MLflow prints its URI (run links) and its errors."""

    def __init__(self, inner: Any, secrets: list[str]) -> None:
        self.inner = inner
        self.secrets = sorted((s for s in secrets if s), key=len, reverse=True)

    def write(self, text: str) -> int:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return int(self.inner.write(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def main(argv: list[str]) -> int:
    spool, studies_dir, study_name = Path(argv[0]), Path(argv[1]), argv[2]
    driver_pid = int(argv[3]) if len(argv) > 3 else None
    url = os.environ.get(ENV_STORAGE, "")
    spec = TrackingSpec.from_json(json.loads(os.environ.get(ENV_SPEC, "{}")))
    hidden = [*uri_secrets(mlflow_uri(spec) or ""), *uri_secrets(url)]
    if hidden:  # before mlflow is imported: its log handlers bind to these streams
        sys.stdout, sys.stderr = _Scrubbed(sys.stdout, hidden), _Scrubbed(sys.stderr, hidden)
    try:
        return run(spool, studies_dir, study_name, driver_pid, spec, url)
    except Exception as err:  # noqa: BLE001 - one line, never a password
        text = f"{type(err).__name__}: {err}".splitlines()[0]
        uri = mlflow_uri(spec)
        log(scrub(text.replace(uri, redact_uri(uri)) if uri else text, url))
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
