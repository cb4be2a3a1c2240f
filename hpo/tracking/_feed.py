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

from hpo.experiment import TrackingSpec, redact_uri
from hpo.study import Progress
from hpo.tracking._check import artifact_root, mlflow_uri
from hpo.tracking._spool import SPOOL_GLOB, SpoolWriter, is_locked, sidecar, spool_path, tracking_dir

ENV_STORAGE = "VERL_HPO_TRACK_STORAGE"
ENV_SPEC = "VERL_HPO_TRACK_SPEC"
EXIT_PENDING = 3  # the tracker stopped with events not yet logged (verl-hpo track finishes them)


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
    """``verl-hpo track``: run a tracking process over each spool of the study on this host that none works on
    (its driver gone), until everything in it is logged. 0 when all are (a skipped spool, one a live driver's
    tracking process works on, is counted as skipped, not logged), else 1 with one line per spool left."""
    spools = sorted(tracking_dir(studies_dir, study_name).glob(SPOOL_GLOB))
    left, skipped = [], 0
    for spool in spools:
        if is_locked(spool):  # a live driver's tracking process
            print(f"{spool.name}: its tracking process is still running; skipped")
            skipped += 1
            continue
        proc = tracker_process(spool, spec, storage_url, studies_dir, study_name, None)
        if proc.wait() != 0:
            left.append(f"{spool.name}: {_last_line(sidecar(spool, '.log'))}")
    for line in left:
        print(f"error: {line}", file=sys.stderr)
    print(f"tracking: {len(spools) - len(left) - skipped} of {len(spools)} spool(s) of study {study_name} fully "
          f"logged to {describe(spec)}" + (f"; {skipped} skipped (still being logged by a running driver)"
                                           if skipped else ""))
    return 1 if left else 0


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
