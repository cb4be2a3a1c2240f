"""The driver's side of tracking, kept light: it never imports mlflow or wandb. It starts one tracker process per
driver (``python -m hpo.tracking._sync``), tells it which trials start and finish through the spool
(:mod:`._spool`), and at the end gives it ``tracking.flush_s`` to catch up. A tracker that is slow, or a server that
is down, never holds a trial: the driver only appends a line per event.

The tracker's secrets (an MLflow URI with a password, the storage URL) reach it in its environment, never in argv
(world-readable in ``ps``) or on disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from hpo.execution import driver_identity, identity_alive
from hpo.experiment import TrackingSpec, redact_uri
from hpo.study import Progress
from hpo.tracking._check import artifact_root, mlflow_uri
from hpo.tracking._spool import (
    SPOOL_GLOB,
    SpoolWriter,
    host_part,
    is_locked,
    sidecar,
    spool_driver,
    spool_path,
    tracking_dir,
)

ENV_STORAGE = "VERL_HPO_TRACK_STORAGE"
ENV_SPEC = "VERL_HPO_TRACK_SPEC"
EXIT_PENDING = 3  # the tracker stopped with events not yet logged (verl-hpo track finishes them)
EXIT_BUSY = 4  # another tracking process works on the spool (nothing was logged by this one)


def describe(spec: TrackingSpec, studies_dir: Path | None = None) -> str:
    """The trackers in one line; with ``studies_dir``, where a new MLflow experiment on a database backend keeps
    its artifacts (:func:`hpo.tracking._check.artifact_root`)."""
    parts = []
    if spec.mlflow is not None:
        uri = mlflow_uri(spec) or "?"
        root = None if studies_dir is None else artifact_root(uri, studies_dir)
        where = "" if root is None else f"; artifacts of a new experiment in {root}"
        parts.append(f"MLflow {redact_uri(uri)} (experiment {spec.mlflow.experiment}{where})")
    if spec.wandb is not None:
        parts.append(f"W&B project {spec.wandb.project} ({spec.wandb.mode})")
    return ", ".join(parts)


def tracker_env(spec: TrackingSpec, storage_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env[ENV_STORAGE] = storage_url
    env[ENV_SPEC] = json.dumps(spec.to_json())
    root = str(Path(__file__).resolve().parents[2])  # the directory holding the hpo package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def tracker_process(spool: Path, spec: TrackingSpec, storage_url: str, studies_dir: Path, study_name: str,
                    driver_pid: int | None) -> subprocess.Popen[bytes]:
    """``python -m hpo.tracking._sync SPOOL STUDIES_DIR STUDY [DRIVER_PID]``; its messages go to ``<spool>.log``."""
    argv = [sys.executable, "-m", "hpo.tracking._sync", str(spool), str(studies_dir), study_name]
    if driver_pid is not None:
        argv.append(str(driver_pid))
    with open(sidecar(spool, ".log"), "ab") as log:
        return subprocess.Popen(argv, env=tracker_env(spec, storage_url), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=log, start_new_session=True)


class TrackingFeed:
    """One driver's tracker: :meth:`wrap` its progress reporter (trial start / finish become spool events), then
    :meth:`close` at the end."""

    def __init__(self, spec: TrackingSpec, study_name: str, storage_url: str, studies_dir: Path,
                 identity: dict[str, Any]) -> None:
        self.spec = spec
        self.study_name = study_name
        self.spool = spool_path(tracking_dir(studies_dir, study_name), identity)
        self.writer = SpoolWriter(self.spool)
        self.log_path = sidecar(self.spool, ".log")
        self.proc = tracker_process(self.spool, spec, storage_url, studies_dir, study_name, os.getpid())

    def wrap(self, inner: Progress) -> Progress:
        return _TrackedProgress(inner, self.writer)

    def close(self, timeout: float | None = None) -> str | None:
        """Tell the tracker the driver is done and wait up to ``timeout`` (``tracking.flush_s``) for it; None when
        everything was logged, else one line saying what to run."""
        self.writer.event("end")
        self.writer.close()
        wait = self.spec.flush_s if timeout is None else timeout
        try:
            code = self.proc.wait(wait)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)  # it saves its cursors and exits
            try:
                code = self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                code = self.proc.wait()
        if code == 0:
            return None
        last = _last_line(sidecar(self.spool, ".log"))
        return (f"tracking: not everything reached {describe(self.spec)} within {wait:.0f} s"
                + (f" ({last})" if last else "") + f"; run verl-hpo track --study {self.study_name} to finish")


def catch_up(spec: TrackingSpec, study_name: str, storage_url: str, studies_dir: Path) -> int:
    """``verl-hpo track``: run a tracking process over each spool of the study on this host whose driver has ended,
    until everything in it is logged, and say what became of each spool on a line of its own: fully logged;
    skipped, and why (another tracking process works on it; its driver still runs); not logged, with its tracking
    process's last line (stderr). Then one summary line. 0 when every spool is logged or being logged by a tracking
    process, else 1 (one not logged, or one a live driver left without its tracking process: run ``track`` again
    once that driver has ended)."""
    spools = sorted(tracking_dir(studies_dir, study_name).glob(SPOOL_GLOB))
    logged, skipped, left = 0, 0, 0
    for spool in spools:
        pid = _running_driver(spool)
        if pid is not None:  # never end a live driver's spool: the study's run would end while it goes on
            skipped += 1
            if is_locked(spool):
                print(f"{spool.name}: skipped: its driver (pid {pid}) and its tracking process are still running")
            else:
                left += 1
                print(f"{spool.name}: skipped: its driver (pid {pid}) is still running and its tracking process is "
                      "not; run verl-hpo track again once the driver has ended")
            continue
        code = tracker_process(spool, spec, storage_url, studies_dir, study_name, None).wait()
        if code == 0:
            logged += 1
            print(f"{spool.name}: fully logged")
        elif code == EXIT_BUSY:  # e.g. a dead driver's tracking process, still flushing, or another track
            skipped += 1
            print(f"{spool.name}: skipped: another tracking process works on it")
        else:
            left += 1
            print(f"error: {spool.name}: not logged: {_last_line(sidecar(spool, '.log'))}", file=sys.stderr)
    failed = len(spools) - logged - skipped
    print(f"tracking: {logged} of {len(spools)} spool(s) of study {study_name} fully logged to {describe(spec)}"
          + (f"; {skipped} skipped" if skipped else "") + (f"; {failed} not logged" if failed else ""))
    return 1 if left else 0


def _running_driver(spool: Path) -> int | None:
    """The pid of the driver that writes ``spool`` when it is alive: the host, pid and start second in the spool's
    name (:func:`._spool.spool_path`) are this host's and a live process's. The name keeps neither the boot nor the
    pid namespace: a spool of this host's name is taken to be of this boot and namespace (the start time guards a
    reused pid)."""
    named = spool_driver(spool)
    if named is None:
        return None
    host, pid, start = named
    here = driver_identity()
    if host != host_part(str(here["host"])):
        return None
    return pid if identity_alive({**here, "pid": pid, "started": start + 0.5}) else None  # start: a whole second


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


class _TrackedProgress:
    """A :class:`~hpo.study._progress.Progress` that also writes trial start / finish to the spool."""

    def __init__(self, inner: Progress, writer: SpoolWriter) -> None:
        self.inner = inner
        self.writer = writer

    def note(self, text: str) -> None:
        self.inner.note(text)

    def trial_started(self, number: int, params: dict[str, Any], retry_of: int | None) -> None:
        self.writer.event("start", trial=number)
        self.inner.trial_started(number, params, retry_of)

    def trial_eval(self, number: int, step: int, total: int | None, value: float, mem_gb: float) -> None:
        self.inner.trial_eval(number, step, total, value, mem_gb)

    def trial_tick(self, number: int, step: int | None, total: int | None, mem_gb: float) -> None:
        self.inner.trial_tick(number, step, total, mem_gb)

    def trial_finished(self, study: optuna.Study, trial: FrozenTrial, finished: int) -> None:
        self.writer.event("finish", trial=trial.number)
        self.inner.trial_finished(study, trial, finished)

    def __getattr__(self, name: str) -> Any:  # the console reporter's own methods (header, ...)
        return getattr(self.inner, name)
