"""Storage URLs: SQLite by default, any Optuna RDB URL, ``redis://`` through JournalStorage (optional)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna

from hpo._space import SpaceError, StudySpec


def default_storage_url(studies_dir: Path, study: str) -> str:
    return f"sqlite:///{(studies_dir / f'{study}.db').resolve()}"


def sqlite_path(url: str) -> Path | None:
    """The database file of a ``sqlite:///`` URL (None for other URLs and in-memory SQLite)."""
    if not url.startswith("sqlite:///"):
        return None
    rest = url[len("sqlite:///"):].split("?")[0]
    return Path(rest) if rest and rest != ":memory:" else None


def check_storage_url(url: str) -> None:
    """Reject a malformed URL or a missing database driver before anything is created."""
    if url.startswith(("redis://", "rediss://", "unix://")):
        try:
            import redis  # noqa: F401
        except ImportError:
            raise SpaceError(f"--storage {url}: the redis package is not installed "
                             "(pip install 'verl-hpo[distributed]')") from None
        return
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        make_url(url).get_dialect().import_dbapi()
    except (ArgumentError, NoSuchModuleError, ValueError) as err:
        raise SpaceError(f"--storage {url}: not a usable database URL ({str(err).splitlines()[0]})") from None
    except ImportError as err:
        raise SpaceError(f"--storage {url}: database driver missing ({err})") from None


def open_storage(url: str, spec: StudySpec) -> Any:
    """An Optuna storage with heartbeats (RDB) so that trials of a dead driver are retried."""
    if url.startswith(("redis://", "rediss://", "unix://")):
        from optuna.storages.journal import JournalRedisBackend, JournalStorage

        return JournalStorage(JournalRedisBackend(url))
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        engine_kwargs["connect_args"] = {"timeout": 60}
    else:
        engine_kwargs["pool_pre_ping"] = True
    return optuna.storages.RDBStorage(
        url, engine_kwargs=engine_kwargs, heartbeat_interval=spec.heartbeat_interval,
        grace_period=spec.grace_period,
        heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=spec.max_retry),
    )


STORAGE_ERRORS: tuple[type[BaseException], ...] = (OSError,)
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
