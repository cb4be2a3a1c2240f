"""Storage URLs: SQLite by default, any Optuna RDB URL, ``redis://`` through JournalStorage (optional). Study names and
URLs are checked before anything is created, passwords are masked wherever a URL is shown, and every storage is
opened inside a :class:`~hpo.storages._retrying.RetryingStorage` (riding out outages: :mod:`hpo.storages._retrying`).
Masking lives in :mod:`hpo.storages._urls` (re-exported here)."""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import optuna

from hpo.analysis import FileRefused, OutputRefused, check_dir_creatable, open_regular, reserved_study_name
from hpo.experiment import SpaceError, StudySpec
from hpo.storages._retrying import RetryingStorage, opening
from hpo.storages._urls import REDIS_SCHEMES, mask_url, scrub

STUDY_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # fullmatch: ``$`` also matches before a final newline
SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite 3 database file
# A server that stops answering (a network partition) must fail a call, which the retries then ride out, rather
# than block it for ever: PostgreSQL connections send TCP keepalives (a half-open connection is found dead in ~60 s;
# a URL's own values win). redis-py >= 8 (pinned) already times out its reads and connects after 5 s.
PG_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}


def check_study_name(name: str, what: str = "--study") -> str:
    """A study name becomes a file (``<name>.db``) and a directory under the studies directory: letters,
    digits and ``._-``, not starting with a dot or a dash, at most 100 characters (no path separators, so it
    can never point outside the studies directory), and not one of the tool's own names there
    (:func:`~hpo.analysis._outputs.reserved_study_name`: ``rehearsals``, ``x.db``, ...)."""
    if not isinstance(name, str) or not STUDY_NAME_RE.fullmatch(name) or name in (".", ".."):
        raise SpaceError(f"{what} {name!r}: a study name is 1-100 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    why = reserved_study_name(name)
    if why is not None:
        hint = "choose another study name" if what == "--study" else "give the study another name with --study"
        raise SpaceError(f"{what} {name!r}: not a study name: {why}; {hint}")
    return name


def default_storage_url(studies_dir: Path, study: str) -> str:
    return f"sqlite:///{(studies_dir / f'{study}.db').resolve()}"


def _sqlite_database(url: str) -> str | None:
    """The ``database`` part of an SQLite URL (``""`` for in-memory ones); None for other URLs. SpaceError for
    SQLite's URI mode (``?uri=true``): its ``file:...`` names are not paths (``sqlite:///file:/etc/passwd?uri=true``
    opens ``/etc/passwd`` while the checks and the lock would look at ``./file:/etc/passwd``)."""
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
    if memory:
        return ""
    uri = parsed.query.get("uri")
    if uri is not None and not (isinstance(uri, str) and uri.strip().lower() in ("false", "no", "off", "n", "f", "0")):
        raise SpaceError(f"--storage {mask_url(url)}: SQLite URI filenames (uri=true) are not supported; "
                         "give a path (sqlite:///path/to/study.db)")
    return db


def sqlite_path(url: str) -> Path | None:
    """The database file of an SQLite URL (None for other URLs and in-memory SQLite; SpaceError in URI mode)."""
    db = _sqlite_database(url)
    return Path(db) if db else None


def check_sqlite_file(db: Path, url: str) -> None:
    """SpaceError unless ``db`` is absent, empty, or an SQLite database: nothing (not even ``<db>.lock``) is
    created beside a file that is something else (``--storage sqlite:////etc/passwd``)."""
    try:
        real = db.expanduser().resolve()
        if any(real.is_relative_to(pseudo) for pseudo in ("/proc", "/sys", "/dev")):
            raise SpaceError(f"--storage {mask_url(url)}: {db} is on a kernel pseudo-filesystem, not a place a "
                             "database file can live")
        if real.parent.is_dir() and not os.access(real.parent, os.W_OK | os.X_OK):
            raise SpaceError(f"--storage {mask_url(url)}: cannot create files in {real.parent} (SQLite writes "
                             f"{db.name}-journal and the driver {db.name}.lock there)")
        check_dir_creatable(db.parent, "--storage", shown=mask_url(url))  # its directory can be made
        if not db.exists() or (db.is_file() and db.stat().st_size == 0):
            return  # SQLite makes a new database here (an empty file is one too)
        if not db.is_file():
            raise SpaceError(f"--storage {mask_url(url)}: {db} is not a file")
        with os.fdopen(open_regular(db, f"--storage {mask_url(url)}: {db}"), "rb") as f:  # not a FIFO swapped in
            head = f.read(len(SQLITE_HEADER))
    except (FileRefused, OutputRefused) as err:
        raise SpaceError(str(err)) from None
    except OSError as err:
        raise SpaceError(f"--storage {mask_url(url)}: {db} cannot be read ({err.strerror})") from None
    if head != SQLITE_HEADER:
        raise SpaceError(f"--storage {mask_url(url)}: {db} exists and is not an SQLite database")


def check_storage_url(url: str) -> None:
    """Reject a malformed URL, a missing database driver, an in-memory SQLite database (a study that dies
    with its driver and can never be resumed), SQLite's URI mode or an SQLite path that is another kind of file,
    before anything is created."""
    if url.startswith(REDIS_SCHEMES):
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


def open_storage(url: str, spec: StudySpec | None = None, wait_s: float = 0.0) -> RetryingStorage:
    """An Optuna storage, inside a :class:`RetryingStorage` (``spec.storage_retry_s``; default StudySpec's).
    Opening is retried only for ``wait_s`` seconds (``verl-hpo worker`` waits for a database that is starting or
    restarting, as a scheduler's array job may start first); by default a wrong URL or a server that is not there
    fails at once.

    Heartbeats and stale-trial recovery are the driver's own (:mod:`hpo.study._recovery`), the same on every
    storage, so Optuna's RDB-only heartbeat is not switched on. An RDB storage sits in Optuna's
    ``_CachedStorage`` (what ``optuna.load_study`` would wrap it in; it passes any other BaseStorage through),
    and the retries wrap that. A new SQLite file gets its schema under an exclusive lock (``<db>.lock``):
    drivers that start together on a fresh file would otherwise race to create the same tables."""
    retry_s = (spec or StudySpec()).storage_retry_s
    if url.startswith(REDIS_SCHEMES):
        from optuna.storages.journal import JournalRedisBackend, JournalStorage

        journal = opening(url, wait_s, lambda: JournalStorage(JournalRedisBackend(url)))
        return RetryingStorage(journal, url, retry_s)
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        engine_kwargs["connect_args"] = {"timeout": 60}
    else:
        engine_kwargs["pool_pre_ping"] = True  # a pooled connection the server dropped (a restart) is replaced
        if url.startswith(("postgresql://", "postgresql+psycopg2://", "postgresql+psycopg://")):
            query = _query_keys(url)
            connect = {k: v for k, v in PG_KEEPALIVES.items() if k not in query}
            if "connect_timeout" not in query:
                connect["connect_timeout"] = 10  # libpq waits forever on an unreachable host
            engine_kwargs["connect_args"] = connect
    db = sqlite_path(url)
    if db is None:
        rdb = opening(url, wait_s, lambda: optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs))
    else:
        check_sqlite_file(db, url)
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:  # the database's directory, not the database: one line naming it
            raise SpaceError(f"--storage {mask_url(url)}: cannot create directory {db.parent} "
                             f"({err.strerror or err})") from None
        with open(db.with_name(db.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                rdb = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        _serialize_sqlite(rdb.engine)
    return RetryingStorage(optuna.storages._CachedStorage(rdb), url, retry_s, reset=rdb.engine.dispose)


def _query_keys(url: str) -> set[str]:
    return {part.split("=", 1)[0] for part in urlsplit(url).query.split("&") if part}


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


def study_exists(storage: Any, name: str) -> bool:
    return name in optuna.get_all_study_names(storage)
