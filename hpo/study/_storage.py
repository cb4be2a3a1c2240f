"""Storage URLs: SQLite by default, any Optuna RDB URL, ``redis://`` through JournalStorage (optional).

Every storage the driver opens is a :class:`RetryingStorage`: a storage call that fails because the storage
cannot be reached or written for now (a database restart, a dropped connection, a read-only or full disk, a
Redis failover) is retried with backoff until ``study.storage_retry_s`` has passed since the outage began;
running trials go on meanwhile. Past that window the call raises :class:`StorageUnavailable`, whose ``str()``
is the one line the CLI prints (the URL masked)."""

from __future__ import annotations

import errno
import fcntl
import math
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Container, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage
from optuna.study._frozen import FrozenStudy
from optuna.study._study_direction import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from hpo.experiment._space import SpaceError, StudySpec

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
MASK = "***"
STUDY_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # fullmatch: ``$`` also matches before a final newline
SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite 3 database file


def check_study_name(name: str, what: str = "--study") -> str:
    """A study name becomes a file (``<name>.db``) and a directory under the studies directory: letters,
    digits and ``._-``, not starting with a dot or a dash, at most 100 characters (no path separators, so it
    can never point outside the studies directory)."""
    if not isinstance(name, str) or not STUDY_NAME_RE.fullmatch(name) or name in (".", ".."):
        raise SpaceError(f"{what} {name!r}: a study name is 1-100 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    return name


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (SQLAlchemy URLs and ``redis://user:pw@host``); shown
    wherever a storage URL is printed or rendered. Unparsable URLs are masked between ``:`` and ``@``."""
    if url.startswith(_REDIS_SCHEMES):
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{host}"))
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
        if parsed.password is None:
            return url
        return str(parsed.render_as_string(hide_password=True))
    except Exception:  # noqa: BLE001 - a malformed URL is still masked by pattern
        return re.sub(r"(//[^:/@]*:)[^@]*@", rf"\1{MASK}@", url)


def url_password(url: str) -> str | None:
    """The password in a storage URL, to scrub from error texts (None when there is none)."""
    try:
        if url.startswith(_REDIS_SCHEMES):
            return urlsplit(url).password
        from sqlalchemy.engine import make_url

        pw = make_url(url).password
        return None if pw is None else str(pw)
    except Exception:  # noqa: BLE001
        m = re.search(r"//[^:/@]*:([^@]*)@", url)
        return m.group(1) if m else None


def scrub(text: str, url: str) -> str:
    """``text`` (an error message) with the URL masked and any copy of its password replaced."""
    text = text.replace(url, mask_url(url))
    pw = url_password(url)
    if pw:
        text = text.replace(pw, MASK)
    return text


def default_storage_url(studies_dir: Path, study: str) -> str:
    return f"sqlite:///{(studies_dir / f'{study}.db').resolve()}"


def _sqlite_database(url: str) -> str | None:
    """The ``database`` part of an SQLite URL (``""`` for in-memory ones); None for other URLs."""
    if not url.startswith("sqlite"):
        return None
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return None
    if parsed.get_backend_name() != "sqlite":
        return None
    db = parsed.database or ""
    memory = db == ":memory:" or db.startswith("file::memory:") or parsed.query.get("mode") == "memory"
    return "" if memory else db


def sqlite_path(url: str) -> Path | None:
    """The database file of an SQLite URL (None for other URLs and in-memory SQLite)."""
    db = _sqlite_database(url)
    return Path(db) if db else None


def check_sqlite_file(db: Path, url: str) -> None:
    """SpaceError unless ``db`` is absent, empty, or an SQLite database: nothing (not even ``<db>.lock``) is
    created beside a file that is something else (``--storage sqlite:////etc/passwd``)."""
    try:
        if not db.exists() or (db.is_file() and db.stat().st_size == 0):
            return  # SQLite makes a new database here (an empty file is one too)
        if not db.is_file():
            raise SpaceError(f"--storage {mask_url(url)}: {db} is not a file")
        with open(db, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as err:
        raise SpaceError(f"--storage {mask_url(url)}: {db} cannot be read ({err.strerror})") from None
    if head != SQLITE_HEADER:
        raise SpaceError(f"--storage {mask_url(url)}: {db} exists and is not an SQLite database")


def check_storage_url(url: str) -> None:
    """Reject a malformed URL, a missing database driver, an in-memory SQLite database (a study that dies
    with its driver and can never be resumed) or an SQLite path that is another kind of file, before
    anything is created."""
    if url.startswith(_REDIS_SCHEMES):
        try:
            import redis  # noqa: F401
        except ImportError:
            raise SpaceError(f"--storage {mask_url(url)}: the redis package is not installed "
                             "(pip install 'verl-hpo[distributed]')") from None
        return
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        make_url(url).get_dialect().import_dbapi()
    except (ArgumentError, NoSuchModuleError, ValueError) as err:
        raise SpaceError(scrub(f"--storage {url}: not a usable database URL ({str(err).splitlines()[0]})", url)) \
            from None
    except ImportError as err:
        raise SpaceError(scrub(f"--storage {url}: database driver missing ({err})", url)) from None
    db = _sqlite_database(url)
    if db == "":
        raise SpaceError(f"--storage {mask_url(url)}: an in-memory SQLite study is lost when its driver exits and "
                         "can never be resumed; give a file (sqlite:///path/to/study.db)")
    if db is not None:
        check_sqlite_file(Path(db), url)


def open_storage(url: str, spec: StudySpec | None = None) -> RetryingStorage:
    """An Optuna storage, inside a :class:`RetryingStorage` (``spec.storage_retry_s``; default StudySpec's).
    Opening is not retried: a wrong URL or a server that is not there fails at once.

    Heartbeats and stale-trial recovery are the driver's own (:mod:`hpo.study._recovery`), the same on every
    storage, so Optuna's RDB-only heartbeat is not switched on. An RDB storage sits in Optuna's
    ``_CachedStorage`` (what ``optuna.load_study`` would wrap it in; it passes any other BaseStorage through),
    and the retries wrap that. A new SQLite file gets its schema under an exclusive lock (``<db>.lock``):
    drivers that start together on a fresh file would otherwise race to create the same tables."""
    retry_s = (spec or StudySpec()).storage_retry_s
    if url.startswith(_REDIS_SCHEMES):
        from optuna.storages.journal import JournalRedisBackend, JournalStorage

        return RetryingStorage(JournalStorage(JournalRedisBackend(url)), url, retry_s)
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        engine_kwargs["connect_args"] = {"timeout": 60}
    else:
        engine_kwargs["pool_pre_ping"] = True  # a pooled connection the server dropped (a restart) is replaced
        if url.startswith(("postgresql://", "postgresql+psycopg2://", "postgresql+psycopg://")) \
                and "connect_timeout=" not in url:
            engine_kwargs["connect_args"] = {"connect_timeout": 10}  # libpq waits forever on an unreachable host
    db = sqlite_path(url)
    if db is None:
        rdb = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
    else:
        check_sqlite_file(db, url)
        db.parent.mkdir(parents=True, exist_ok=True)
        with open(db.with_name(db.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                rdb = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        _serialize_sqlite(rdb.engine)
    return RetryingStorage(optuna.storages._CachedStorage(rdb), url, retry_s, reset=rdb.engine.dispose)


def _serialize_sqlite(engine: Any) -> None:
    """Every SQLite transaction starts with ``BEGIN IMMEDIATE`` (SQLAlchemy's documented pysqlite recipe).

    Optuna claims a queued (WAITING) trial by reading its state and writing RUNNING in one transaction, with
    ``SELECT ... FOR UPDATE``, which SQLite ignores: under pysqlite's deferred transactions two threads or
    processes can both read WAITING and both "win" (measured: 4 threads popping 40 queued trials got 37-41
    distinct ones out of 48 asks). Taking SQLite's write lock at BEGIN makes the read-then-write atomic; SQLite
    has one writer at a time anyway, and the 60 s busy timeout absorbs the wait."""
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _no_pysqlite_begin(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy emits BEGIN itself (below)

    @event.listens_for(engine, "begin")
    def _begin_immediate(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # pooled connections were opened before the listeners


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


def study_exists(storage: Any, name: str) -> bool:
    return name in optuna.get_all_study_names(storage)


def storage_error_line(err: BaseException, url: str) -> str:
    """One line for a storage error, the URL masked: StorageUnavailable's own text, else the driver's first
    line (not Optuna's wrapper text, "... invalid data in the commit ..."), prefixed with the storage."""
    if isinstance(err, StorageUnavailable):
        return str(err)
    shown = unavailable_cause(err) or next(
        (e for e in _chain(err) if not isinstance(e, optuna.exceptions.StorageInternalError)), err)
    first = (str(shown).strip().splitlines() or [type(shown).__name__])[0]
    return scrub(f"storage {mask_url(url) if url else 'default'}: {first}", url) if url else f"storage default: {first}"


# ----------------------------------------------------------------------------- riding out outages
class StorageUnavailable(optuna.exceptions.StorageInternalError):
    """The storage stayed unreachable (or unwritable) for ``study.storage_retry_s``. ``str()`` is one line,
    the URL masked and its password scrubbed. A StorageInternalError (what Optuna raises for a failed
    commit), so that it is never taken for an error of the trial, the disk or a launch."""


BACKOFF_START_S = 0.1
BACKOFF_CAP_S = 2.0  # a driver notices a storage that is back within this (and beats again: see _recovery)
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


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class RetryingStorage(BaseStorage):
    """An Optuna storage whose calls ride out an outage (see the module docstring).

    One outage begins with the first call that fails as :func:`unavailable_cause` says and ends with the
    next call that succeeds, whichever thread makes them (heartbeat and ``n_jobs`` threads share a storage);
    once a write has failed, only a write ends it (a read-only or full disk still serves reads).
    ``downtime_s`` adds up the outages, ``outages`` counts them. A call is retried with exponential backoff
    (``BACKOFF_START_S`` doubling to ``BACKOFF_CAP_S``, jittered) while less than ``retry_s`` has passed since
    the outage began, then raises StorageUnavailable; after that each call is tried once.

    Retrying a write whose commit went through but whose acknowledgement was lost: attribute writes and
    intermediate values overwrite (harmless); finishing a trial (``set_trial_state_values``) that the lost
    commit already finished with the same state and values returns True instead of raising
    UpdateFinishedTrialError; popping a WAITING trial that the lost commit already claimed returns False
    (Optuna then asks for another), and a trial created twice (``create_new_trial``) leaves one RUNNING
    trial that nobody runs or beats for: both are found stale and recovered (FAIL + a WAITING retry) by
    :mod:`hpo.study._recovery`, as a dead driver's trial would be."""

    def __init__(self, inner: BaseStorage, url: str, retry_s: float, *, reset: Callable[[], None] | None = None,
                 notify: Callable[[str], None] = _stderr) -> None:
        self.inner = inner
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

    def __getattr__(self, name: str) -> Any:  # the wrapped storage's other attributes (not retried)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    # -- outage bookkeeping
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

    def _read(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._call(False, fn, *args, **kwargs)

    def _write(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._call(True, fn, *args, **kwargs)

    def _call(self, write: bool, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
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
