"""Where a study lives: storage URLs (SQLite by default, any Optuna RDB URL, Redis through a journal), study names
checked before anything is created (``_storage``), passwords masked wherever a URL is shown (``_urls``), and every
storage wrapped to ride out outages (``_retrying``: retries with backoff, the downtime it rode out; ``_errors``: which
errors are an outage, each as one line).

May import: ``hpo.experiment``, ``hpo.analysis``."""

from hpo.storages._retrying import (
           STORAGE_ERRORS,
           RetryingStorage,
           StorageUnavailable,
           storage_downtime,
           storage_error_line,
           storage_outages,
           storage_recovered_at,
)
from hpo.storages._storage import (
           check_storage_url,
           check_study_name,
           default_storage_url,
           open_storage,
           sqlite_path,
           study_exists,
)
from hpo.storages._urls import mask_url, scrub

__all__ = ["RetryingStorage", "STORAGE_ERRORS", "StorageUnavailable", "check_storage_url", "check_study_name",
           "default_storage_url", "mask_url", "open_storage", "scrub", "sqlite_path", "storage_downtime",
           "storage_error_line", "storage_outages", "storage_recovered_at", "study_exists"]
