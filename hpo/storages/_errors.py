"""Which errors of a storage call are the storage's fault, and which of those mean it cannot be reached or written for
now, an outage that :mod:`hpo.storages._retrying` rides out: :data:`STORAGE_ERRORS` (what the CLI maps to one line),
:func:`unavailable_cause` (the transient error in an exception's chain: a dropped or refused connection, a locked,
read-only or full database file or disk, a Redis failover), :class:`StorageUnavailable` (an outage that lasted past
``study.storage_retry_s``) and :func:`storage_error_line` (any of them as the one line the CLI prints, the URL
masked)."""

from __future__ import annotations

import errno
from collections.abc import Iterator

import optuna
from optuna.exceptions import UpdateFinishedTrialError

from hpo.storages._urls import mask_url, scrub

# what a storage call raises when the storage (not the caller) is at fault: the CLI maps each to one line
STORAGE_ERRORS: tuple[type[BaseException], ...] = (OSError, optuna.exceptions.StorageInternalError)
try:
    from sqlalchemy.exc import SQLAlchemyError

    STORAGE_ERRORS += (SQLAlchemyError,)
except ImportError:  # pragma: no cover
    pass
try:
    from redis.exceptions import RedisError

    STORAGE_ERRORS += (RedisError,)
except ImportError:
    pass


def storage_error_line(err: BaseException, url: str) -> str:
    """One line for a storage error, the URL masked: StorageUnavailable's own text, else the driver's first
    line (not Optuna's wrapper text, "... invalid data in the commit ..."), prefixed with the storage."""
    if isinstance(err, StorageUnavailable):
        return str(err)
    shown = unavailable_cause(err) or next(
        (e for e in _chain(err) if not isinstance(e, optuna.exceptions.StorageInternalError)), err)
    first = (str(shown).strip().splitlines() or [type(shown).__name__])[0]
    return scrub(f"storage {mask_url(url) if url else 'default'}: {first}", url) if url else f"storage default: {first}"


class StorageUnavailable(optuna.exceptions.StorageInternalError):
    """The storage stayed unreachable (or unwritable) for ``study.storage_retry_s``. ``str()`` is one line,
    the URL masked and its password scrubbed. A StorageInternalError (what Optuna raises for a failed
    commit), so that it is never taken for an error of the trial, the disk or a launch."""


# sqlite3.OperationalError texts of a condition that can pass (every other one, e.g. "no such table", is a bug)
_SQLITE_TRANSIENT = ("locked", "busy", "readonly", "read-only", "disk i/o error", "disk is full",
                     "unable to open database file")
_OS_TRANSIENT = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EIO, errno.ENETDOWN, errno.ENETUNREACH,
                 errno.EHOSTUNREACH, errno.EFBIG}


def _unavailable_one(err: BaseException) -> bool:
    try:
        from sqlalchemy import exc as sa
    except ImportError:  # pragma: no cover
        sa = None  # type: ignore[assignment]
    if sa is not None:
        # PendingRollbackError: a query on a connection that broke earlier in the same session (Optuna's
        # _get_trials retries a failed query this way); the next session reconnects
        if isinstance(err, (sa.DisconnectionError, sa.InterfaceError, sa.TimeoutError, sa.PendingRollbackError)):
            return True
        if isinstance(err, sa.DBAPIError) and err.connection_invalidated:
            return True
        if isinstance(err, sa.OperationalError):
            import sqlite3

            if isinstance(err.orig, sqlite3.Error):
                return any(m in str(err.orig).lower() for m in _SQLITE_TRANSIENT)
            return True  # PostgreSQL/MySQL: connection refused / lost, server shutting down or starting, deadlock
    try:
        from redis import exceptions as rx
    except ImportError:
        rx = None  # type: ignore[assignment]
    if rx is not None:
        if isinstance(err, (rx.AuthenticationError, rx.AuthorizationError)):
            return False
        if isinstance(err, (rx.ConnectionError, rx.TimeoutError, rx.ReadOnlyError)):
            return True
        if isinstance(err, rx.ResponseError) and str(err).startswith("MISCONF"):  # cannot persist: disk full
            return True
    if isinstance(err, (ConnectionError, TimeoutError)):
        return True
    return isinstance(err, OSError) and err.errno in _OS_TRANSIENT


def _chain(err: BaseException) -> Iterator[BaseException]:
    """``err``, what it was raised from, or else what it was raised while handling (a few links)."""
    e: BaseException | None = err
    for _ in range(8):
        if e is None:
            return
        yield e
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)


def unavailable_cause(err: BaseException) -> BaseException | None:
    """The error in ``err``'s chain (Optuna's StorageInternalError hides the driver's error) that says the
    storage cannot be reached or written for now; None if none."""
    for e in _chain(err):
        if isinstance(e, (StorageUnavailable, UpdateFinishedTrialError)):
            return None
        if _unavailable_one(e):
            return e
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__
