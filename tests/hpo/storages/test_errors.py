"""Which errors of a storage call are the storage's fault and which of those an outage to ride out
(:mod:`hpo.storages._errors`), on the exceptions the drivers really raise (SQLAlchemy over sqlite3 and psycopg2, redis,
the OS), through Optuna's wrapper too; and the one line the CLI prints for any of them, the URL masked. Moved here
from ``test_storage.py`` (whose tests import the error builders from here)."""

from __future__ import annotations

import errno
import sqlite3

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError

from hpo.storages._errors import STORAGE_ERRORS, StorageUnavailable, storage_error_line, unavailable_cause


def _sqlite_error(text: str) -> BaseException:
    """What SQLAlchemy raises over sqlite3 for ``text``."""
    return OperationalError("SELECT 1", {}, sqlite3.OperationalError(text))


def _wrapped(err: BaseException) -> BaseException:
    """What Optuna's RDBStorage raises: StorageInternalError("... invalid data in the commit ...") from err."""
    try:
        raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from err
    except optuna.exceptions.StorageInternalError as wrapped:
        return wrapped


def test_which_errors_are_an_outage() -> None:
    """Connection-type errors (through Optuna's wrapper too) are retried; a bug, a conflict or a finished trial
    is not."""
    import redis.exceptions as rx

    pg_down = OperationalError("SELECT 1", {}, Exception("connection to server failed: Connection refused"))
    outage = [pg_down, _wrapped(pg_down), InterfaceError("SELECT 1", {}, Exception("connection already closed")),
              _sqlite_error("database is locked"), _wrapped(_sqlite_error("attempt to write a readonly database")),
              _sqlite_error("database or disk is full"), _sqlite_error("disk I/O error"),
              rx.ConnectionError("Error 111 connecting"), rx.TimeoutError("Timeout reading"),
              OSError(errno.ENOSPC, "No space left on device"), OSError(errno.EROFS, "Read-only file system")]
    not_outage = [_sqlite_error("no such table: trials"), _wrapped(_sqlite_error("no such column: x")),
                  IntegrityError("INSERT", {}, Exception("duplicate key")), UpdateFinishedTrialError("finished"),
                  StorageUnavailable("given up"), rx.AuthenticationError("invalid password"), ValueError("bad"),
                  OSError(errno.ENOENT, "No such file"), KeyError("x")]
    assert [e for e in outage if unavailable_cause(e) is None] == []
    assert [e for e in not_outage if unavailable_cause(e) is not None] == []


def test_the_one_line_names_the_storage_masked_and_the_driver_s_own_error() -> None:
    url = "postgresql+psycopg2://alice:S3cret@db:5432/hpo"
    pg_down = OperationalError("SELECT 1", {}, Exception("connection to server at db failed (S3cret)\nmore"))
    assert storage_error_line(_wrapped(pg_down), url) == (
        "storage postgresql+psycopg2://alice:***@db:5432/hpo: (builtins.Exception) connection to server at db "
        "failed (***)")
    assert storage_error_line(_wrapped(ValueError("")), "") == "storage default: ValueError"
    gave_up = StorageUnavailable("storage x: unreachable for 300 s")
    assert storage_error_line(gave_up, url) == "storage x: unreachable for 300 s"
    assert all(isinstance(e, STORAGE_ERRORS) for e in (pg_down, gave_up, OSError("x")))
    assert not isinstance(ValueError("x"), STORAGE_ERRORS)
    assert isinstance(gave_up, optuna.exceptions.StorageInternalError)  # never taken for the trial's own error
