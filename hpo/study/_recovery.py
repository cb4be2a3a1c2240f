"""Trials of dead drivers: heartbeats, stale detection, recorded results and retries, on every storage.

Optuna's own heartbeat exists only for RDB storages and runs only inside ``study.optimize``; its retry
copies the dead trial's user attrs (its outcome included). This module replaces it with one mechanism for
SQLite, PostgreSQL/MySQL and Redis (JournalStorage) alike:

* **Heartbeat.** Every running trial carries system attr ``hpo:heartbeat`` (wall-clock seconds), written by
  its driver's :class:`Heartbeat` thread every ``heartbeat_interval`` seconds. The storage retries a beat
  through an outage (:class:`hpo.storages._retrying.RetryingStorage`); an error that still comes through is logged
  once and the thread beats on; if the trial was finished by someone else, the driver is told (``lost``)
  and stops it.
* **Stale.** A RUNNING trial is dead when its driver's pid is comparable with ours and gone
  (:func:`hpo.execution._identity.identity_alive`), or when its heartbeat (else its start) is older than
  ``grace_period``. Hosts' clocks must agree to well under ``grace_period`` (NTP). Nobody could beat
  during a storage outage this driver saw, so a heartbeat's age counts from the outage's end at the
  earliest: a live driver on another host is not taken for dead just because the database restarted.
* **Recorded results.** Before telling Optuna, a driver writes the trial's outcome into system attr
  ``hpo:result``; a driver that dies after that point has finished its trial, and recovery tells the
  recorded outcome instead of retrying.
* **Exactly one retry.** Recovery first moves the trial RUNNING -> FAIL (or its recorded state). The storage
  makes that transition once: a second driver recovering the same trial gets ``UpdateFinishedTrialError``
  and queues nothing. Only the driver whose transition succeeded queues the retry, a WAITING trial with
  the same parameters and the dead trial's *system* attrs (plus ``failed_trial`` / ``retry_history``), never
  its user attrs (outcome, stderr, curves, scores).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from hpo.execution import identity_alive
from hpo.record import ATTR_HEARTBEAT, ATTR_RECOVERING, ATTR_RESULT, ATTR_RETRY_HISTORY, ATTR_RETRY_OF
from hpo.storages import storage_recovered_at
from hpo.study._confirm import speed_block_retry


# ----------------------------------------------------------------------------- results
def encode_values(values: list[float] | None) -> list[Any] | None:
    """JSON-safe values (storages keep system attrs as JSON: +-inf as strings)."""
    if values is None:
        return None
    return [v if math.isfinite(v) else ("inf" if v > 0 else "-inf") for v in values]


def decode_values(values: list[Any] | None) -> list[float] | None:
    return None if values is None else [float(v) for v in values]


def record_result(study: optuna.Study, trial_id: int, state: TrialState, values: list[float] | None) -> None:
    study._storage.set_trial_system_attr(trial_id, ATTR_RESULT, {"state": state.name, "values": encode_values(values)})


def finish(study: optuna.Study, trial_id: int, state: TrialState, values: list[float] | None) -> bool:
    """Move a RUNNING trial to ``state``; False when it was already finished (by another driver)."""
    try:
        study._storage.set_trial_state_values(trial_id, state, values)
    except UpdateFinishedTrialError:
        return False
    return True


# ----------------------------------------------------------------------------- retries
def queue_retry(study: optuna.Study, trial: FrozenTrial, max_retry: int | None) -> bool:
    """A WAITING copy of ``trial``: same parameters, system attrs only. False when max_retry is reached."""
    system = {k: v for k, v in trial.system_attrs.items() if k not in (ATTR_HEARTBEAT, ATTR_RESULT, ATTR_RECOVERING)}
    history = [*system.get(ATTR_RETRY_HISTORY, []), trial.number]
    if max_retry is not None and len(history) > max_retry:
        return False
    system.update({ATTR_RETRY_OF: trial.number, ATTR_RETRY_HISTORY: history})
    if speed_block_retry(study, trial, system):  # a throughput re-measurement: its seed's runs re-made with it
        return True
    study.add_trial(optuna.create_trial(state=TrialState.WAITING, params=trial.params,
                                        distributions=trial.distributions, system_attrs=system))
    return True


def last_beat(t: FrozenTrial) -> float | None:
    beat = t.system_attrs.get(ATTR_HEARTBEAT)
    if isinstance(beat, (int, float)):
        return float(beat)
    return None if t.datetime_start is None else t.datetime_start.timestamp()


def is_stale(t: FrozenTrial, grace_period: float, now: float | None = None, since: float | None = None) -> bool:
    """Dead driver: its pid is comparable and gone, else no heartbeat for ``grace_period`` seconds, counted
    from ``since`` (wall clock: the end of a storage outage, when nobody could beat) if that is later."""
    ident = t.user_attrs.get("worker")
    alive = identity_alive(ident) if isinstance(ident, dict) else None
    if alive is not None:
        return not alive
    beat = last_beat(t)
    if beat is None:
        return False
    return (time.time() if now is None else now) - max(beat, since or beat) > grace_period


def recover_stale_trials(study: optuna.Study, grace_period: float, max_retry: int | None,
                         skip: Callable[[int], bool] = lambda _n: False) -> list[tuple[int, str]]:
    """Finish the RUNNING trials of dead drivers: their recorded result, else FAIL and one retry.
    Returns (trial number, what was done) for the trials this driver recovered."""
    done: list[tuple[int, str]] = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        # read after the trials: an outage that this very read waited out counts
        if skip(t.number) or not is_stale(t, grace_period, since=storage_recovered_at(study._storage)):
            continue
        recorded = t.system_attrs.get(ATTR_RESULT)
        if isinstance(recorded, dict) and recorded.get("state") in TrialState.__members__:
            state = TrialState[recorded["state"]]
            if finish(study, t._trial_id, state, decode_values(recorded.get("values"))):
                done.append((t.number, f"recorded {state.name.lower()}"))
            continue
        retried = fail_and_retry(study, t, max_retry)
        if retried is not None:  # None: another driver recovered it first: its retry, not ours
            done.append((t.number, "retry queued" if retried else "max_retry reached, not retried"))
    return done


def fail_and_retry(study: optuna.Study, trial: FrozenTrial, max_retry: int | None) -> bool | None:
    """Move a RUNNING trial to FAIL and queue one retry, as this driver: marked first (counting drivers see the retry
    as due between the FAIL and the queueing), the retry queued only when this driver moved it. None when it was
    already finished (recovered by another driver, or told meanwhile: never run again); else whether the retry was
    queued (False: ``max_retry`` reached)."""
    try:
        study._storage.set_trial_system_attr(trial._trial_id, ATTR_RECOVERING, True)
    except UpdateFinishedTrialError:
        return None
    if not finish(study, trial._trial_id, TrialState.FAIL, None):
        return None
    return queue_retry(study, trial, max_retry)


# ----------------------------------------------------------------------------- heartbeat
class Heartbeat:
    """Writes ``hpo:heartbeat`` of this driver's running trials every ``interval`` seconds (one thread). No
    error ends the thread: the first of a run of failed beats is printed, and it beats on."""

    def __init__(self, study: optuna.Study, interval: float) -> None:
        self.study = study
        self.interval = interval
        self._trials: dict[int, threading.Event] = {}  # trial id -> set when the trial was finished elsewhere
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="verl-hpo-heartbeat", daemon=True)
        self.errors = 0
        self._failing = False  # the last beat failed: further failures are counted, not printed

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval + 5)

    def add(self, trial_id: int) -> threading.Event:
        lost = threading.Event()
        with self._lock:
            self._trials[trial_id] = lost
        self._beat(trial_id, lost)
        return lost

    def remove(self, trial_id: int) -> None:
        with self._lock:
            self._trials.pop(trial_id, None)

    def _beat(self, trial_id: int, lost: threading.Event) -> None:
        try:
            self.study._storage.set_trial_system_attr(trial_id, ATTR_HEARTBEAT, time.time())
        except UpdateFinishedTrialError:
            lost.set()
            self.remove(trial_id)
        except Exception as err:  # noqa: BLE001 - a storage hiccup must not end the heartbeat
            self.errors += 1
            if not self._failing:
                self._failing = True
                first = (str(err).strip().splitlines() or [""])[0]
                print(f"heartbeat: storage error ({type(err).__name__}: {first}); beating on", file=sys.stderr,
                      flush=True)
        else:
            self._failing = False

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                trials = list(self._trials.items())
            for trial_id, lost in trials:
                if self._stop.is_set():
                    return
                try:
                    self._beat(trial_id, lost)
                except Exception:  # noqa: BLE001, S112 - (printing failed, ...) the next period beats again
                    continue


def sweep_scratch(study: optuna.Study, trials_dir: Path, cleanup: Callable[[Path, int], None]) -> int:
    """Remove what the attempts of this study's finished trials left (``cleanup``: the backend's, e.g. a verl
    trial's private ``/tmp/vhpo-*`` scratch that a SIGKILLed driver never removed); returns the attempts swept. Only
    trials that are no longer running, and only trial directories inside ``trials_dir`` (a ``trial_dir`` read from
    the storage is untrusted; another host's or another study's is never touched)."""
    root = trials_dir.resolve()
    swept = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)):
        where = t.user_attrs.get("trial_dir")
        if not isinstance(where, str) or not where or "\0" in where:
            continue
        trial_dir = Path(where)
        try:
            if not trial_dir.resolve().is_relative_to(root) or not trial_dir.is_dir():
                continue
        except (OSError, RuntimeError):
            continue
        history = t.system_attrs.get(ATTR_RETRY_HISTORY)
        attempt = sum(1 for n in history if isinstance(n, int)) if isinstance(history, list) else 0
        cleanup(trial_dir, attempt)
        swept += 1
    return swept
