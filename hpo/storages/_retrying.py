"""Riding out storage outages: every storage the driver opens (:func:`hpo.storages._storage.open_storage`) is a
:class:`RetryingStorage`. A storage call that fails because the storage cannot be reached or written for now (a
database restart, a dropped connection, a read-only or full disk, a Redis failover) is retried with backoff until
``study.storage_retry_s`` has passed since the outage began; running trials go on meanwhile. Past that window the call
raises :class:`StorageUnavailable`, whose ``str()`` is the one line the CLI prints (the URL masked).

Retrying a write whose commit went through but whose acknowledgement was lost: attribute writes and intermediate
values overwrite (harmless); finishing a trial (``set_trial_state_values``) that the lost commit already finished
with the same state and values returns True instead of raising UpdateFinishedTrialError; popping a WAITING trial that
the lost commit already claimed returns False (Optuna then asks for another), and a trial created twice
(``create_new_trial``) leaves one RUNNING trial that nobody runs or beats for: both are found stale and recovered
(FAIL + a WAITING retry) by :mod:`hpo.study._recovery`, as a dead driver's trial would be.

Which errors are an outage, and the one line each is worded as, are :mod:`hpo.storages._errors`'s (their names stay
importable from here)."""

from __future__ import annotations

import math
import random
import sys
import threading
import time
from collections.abc import Callable, Container, Sequence
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage
from optuna.study._frozen import FrozenStudy
from optuna.study._study_direction import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from hpo.storages._errors import STORAGE_ERRORS, StorageUnavailable, _first_line, storage_error_line, unavailable_cause
from hpo.storages._urls import mask_url, scrub

__all__ = ["BACKOFF_CAP_S", "BACKOFF_START_S", "STORAGE_ERRORS", "RetryingStorage", "StorageUnavailable", "opening",
           "storage_downtime", "storage_error_line", "storage_outages", "storage_recovered_at", "unavailable_cause"]

# ----------------------------------------------------------------------------- riding out outages
BACKOFF_START_S = 0.1
BACKOFF_CAP_S = 2.0  # a driver notices a storage that is back within this (and beats again: see _recovery)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class _Retrier:
    """Retries one storage's calls through its outages, whichever thread makes them (heartbeat and ``n_jobs``
    threads share a storage), and keeps the outages' books.

    One outage begins with the first call that fails as :func:`unavailable_cause` says and ends with the
    next call that succeeds; once a write has failed, only a write ends it (a read-only or full disk still serves
    reads). ``downtime_s`` adds up the outages, ``outages`` counts them. A call is retried with exponential backoff
    (``BACKOFF_START_S`` doubling to ``BACKOFF_CAP_S``, jittered) while less than ``retry_s`` has passed since
    the outage began, then raises StorageUnavailable; after that each call is tried once."""

    def __init__(self, url: str, retry_s: float, reset: Callable[[], None] | None,
                 notify: Callable[[str], None]) -> None:
        self.url = url
        self.retry_s = float(retry_s)
        self._reset = reset  # after a failure: drop pooled connections (an SQLite one that opened read-only stays so)
        self._notify = notify
        self._lock = threading.Lock()
        self._since: float | None = None  # monotonic start of the outage in progress
        self._write_failed = False  # in this outage: then a read that succeeds does not end it
        self._downtime = 0.0
        self.outages = 0
        self.recovered_at: float | None = None  # wall clock (time.time) when the last outage ended

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_reset")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock(), _reset=None)

    @property
    def downtime_s(self) -> float:
        """Seconds the storage was unreachable, the outage in progress included."""
        with self._lock:
            return self._downtime + (0.0 if self._since is None else time.monotonic() - self._since)

    @property
    def unreachable(self) -> bool:
        return self._since is not None

    def _failed(self, cause: BaseException, write: bool) -> float:
        """Record a failed call; the seconds since the outage began."""
        now = time.monotonic()
        with self._lock:
            self._write_failed |= write
            if self._since is None:
                self._since = now
                self.outages += 1
                self._notify(scrub(f"storage {mask_url(self.url)} unreachable ({_first_line(cause)}); retrying for up "
                                   f"to {self.retry_s:g} s (study.storage_retry_s), running trials go on", self.url))
            return now - self._since

    def _succeeded(self, write: bool) -> None:
        with self._lock:
            if self._since is None or (self._write_failed and not write):
                return
            down = time.monotonic() - self._since
            self._downtime += down
            self._since, self._write_failed = None, False
            self.recovered_at = time.time()
        self._notify(f"storage {mask_url(self.url)} reachable again after {down:.1f} s")

    def call(self, write: bool, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        attempt = 0
        while True:
            try:
                out = fn(*args, **kwargs)
            except Exception as err:
                cause = unavailable_cause(err)
                if cause is None:
                    raise
                elapsed = self._failed(cause, write)
                if self._reset is not None:
                    try:
                        self._reset()
                    except Exception:  # noqa: BLE001, S110 - best effort; the next attempt reconnects anyway
                        pass
                if elapsed >= self.retry_s:
                    raise StorageUnavailable(scrub(
                        f"storage {mask_url(self.url)} unreachable for {elapsed:.0f} s (study.storage_retry_s="
                        f"{self.retry_s:g}): {_first_line(cause)}", self.url)) from err
                delay = min(BACKOFF_CAP_S, BACKOFF_START_S * 2**attempt) * random.uniform(0.5, 1.0)
                time.sleep(min(delay, max(0.0, self.retry_s - elapsed) + 0.01))
                attempt += 1
                continue
            if self._since is not None:
                self._succeeded(write)
            return out


def opening(url: str, wait_s: float, make: Callable[[], Any], notify: Callable[[str], None] = _stderr) -> Any:
    """``make()`` (opening a storage), retried like a storage call for ``wait_s`` seconds while the storage cannot be
    reached (a wrong URL, a bad password or a missing table fail at once); tried once when ``wait_s`` is 0."""
    if wait_s <= 0:
        return make()
    return _Retrier(url, wait_s, None, notify).call(True, make)


class RetryingStorage(BaseStorage):
    """An Optuna storage whose calls ride out an outage (see the module docstring and :class:`_Retrier`)."""

    def __init__(self, inner: BaseStorage, url: str, retry_s: float, *, reset: Callable[[], None] | None = None,
                 notify: Callable[[str], None] = _stderr) -> None:
        self.inner = inner
        self.url = url
        self._retrier = _Retrier(url, retry_s, reset, notify)

    def __getattr__(self, name: str) -> Any:  # the wrapped storage's other attributes (not retried)
        if name in ("inner", "_retrier"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def retry_s(self) -> float:
        return self._retrier.retry_s

    @property
    def downtime_s(self) -> float:
        """Seconds the storage was unreachable, the outage in progress included."""
        return self._retrier.downtime_s

    @property
    def unreachable(self) -> bool:
        return self._retrier.unreachable

    @property
    def outages(self) -> int:
        return self._retrier.outages

    @property
    def recovered_at(self) -> float | None:
        """Wall clock (time.time) when the last outage ended."""
        return self._retrier.recovered_at

    def _read(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._retrier.call(False, fn, *args, **kwargs)

    def _write(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._retrier.call(True, fn, *args, **kwargs)

    # -- BaseStorage: every call through _read or _write
    def create_new_study(self, directions: Sequence[StudyDirection], study_name: str | None = None) -> int:
        return int(self._write(self.inner.create_new_study, directions, study_name))

    def delete_study(self, study_id: int) -> None:
        self._write(self.inner.delete_study, study_id)

    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        self._write(self.inner.set_study_user_attr, study_id, key, value)

    def set_study_system_attr(self, study_id: int, key: str, value: Any) -> None:
        self._write(self.inner.set_study_system_attr, study_id, key, value)

    def get_study_id_from_name(self, study_name: str) -> int:
        return int(self._read(self.inner.get_study_id_from_name, study_name))

    def get_study_name_from_id(self, study_id: int) -> str:
        return str(self._read(self.inner.get_study_name_from_id, study_id))

    def get_study_directions(self, study_id: int) -> list[StudyDirection]:
        return list(self._read(self.inner.get_study_directions, study_id))

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        return dict(self._read(self.inner.get_study_user_attrs, study_id))

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        return dict(self._read(self.inner.get_study_system_attrs, study_id))

    def get_all_studies(self) -> list[FrozenStudy]:
        return list(self._read(self.inner.get_all_studies))

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        return int(self._write(self.inner.create_new_trial, study_id, template_trial))

    def set_trial_param(self, trial_id: int, param_name: str, param_value_internal: float,
                        distribution: optuna.distributions.BaseDistribution) -> None:
        self._write(self.inner.set_trial_param, trial_id, param_name, param_value_internal, distribution)

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        return int(self._read(self.inner.get_trial_id_from_study_id_trial_number, study_id, trial_number))

    def get_trial_number_from_id(self, trial_id: int) -> int:
        return int(self._read(self.inner.get_trial_number_from_id, trial_id))

    def get_trial_param(self, trial_id: int, param_name: str) -> float:
        return float(self._read(self.inner.get_trial_param, trial_id, param_name))

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Sequence[float] | None = None) -> bool:
        failed = [False]

        def once() -> bool:
            try:
                return bool(self.inner.set_trial_state_values(trial_id, state, values))
            except UpdateFinishedTrialError:
                if failed[0] and state.is_finished() and self._landed(trial_id, state, values):
                    return True  # our own earlier attempt committed; only its acknowledgement was lost
                raise
            except Exception:
                failed[0] = True
                raise

        return bool(self._write(once))

    def _landed(self, trial_id: int, state: TrialState, values: Sequence[float] | None) -> bool:
        t = self.inner.get_trial(trial_id)
        if t.state != state:
            return False
        if values is None or t.values is None:
            return values is None or state != TrialState.COMPLETE
        return len(t.values) == len(values) and all(
            a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(t.values, values, strict=True))

    def set_trial_intermediate_value(self, trial_id: int, step: int, intermediate_value: float) -> None:
        self._write(self.inner.set_trial_intermediate_value, trial_id, step, intermediate_value)

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._write(self.inner.set_trial_user_attr, trial_id, key, value)

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._write(self.inner.set_trial_system_attr, trial_id, key, value)

    def get_trial(self, trial_id: int) -> FrozenTrial:
        return self._read(self.inner.get_trial, trial_id)  # type: ignore[no-any-return]

    def get_all_trials(self, study_id: int, deepcopy: bool = True,
                       states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        return list(self._read(self.inner.get_all_trials, study_id, deepcopy=deepcopy, states=states))

    def get_n_trials(self, study_id: int, state: tuple[TrialState, ...] | TrialState | None = None) -> int:
        return int(self._read(self.inner.get_n_trials, study_id, state))

    def get_best_trial(self, study_id: int) -> FrozenTrial:
        return self._read(self.inner.get_best_trial, study_id)  # type: ignore[no-any-return]

    def get_trial_params(self, trial_id: int) -> dict[str, Any]:
        return dict(self._read(self.inner.get_trial_params, trial_id))

    def get_trial_user_attrs(self, trial_id: int) -> dict[str, Any]:
        return dict(self._read(self.inner.get_trial_user_attrs, trial_id))

    def get_trial_system_attrs(self, trial_id: int) -> dict[str, Any]:
        return dict(self._read(self.inner.get_trial_system_attrs, trial_id))

    def remove_session(self) -> None:
        self.inner.remove_session()

    def check_trial_is_updatable(self, trial_id: int, trial_state: TrialState) -> None:
        self.inner.check_trial_is_updatable(trial_id, trial_state)


def storage_downtime(storage: Any) -> float:
    """Seconds ``storage`` (a study's ``_storage`` or what :func:`open_storage` returned) was unreachable."""
    return storage.downtime_s if isinstance(storage, RetryingStorage) else 0.0


def storage_outages(storage: Any) -> int:
    """How many times ``storage`` became unreachable (each ridden out, or the last one given up on)."""
    return storage.outages if isinstance(storage, RetryingStorage) else 0


def storage_recovered_at(storage: Any) -> float | None:
    """Wall-clock time the last outage of ``storage`` ended (None: none yet, or one in progress)."""
    return storage.recovered_at if isinstance(storage, RetryingStorage) else None
