"""Experiment tracking: every trial of a study in MLflow and Weights & Biases, one run per trial chain (a retry
continues its run), grouped by study (an MLflow parent run, a W&B group), with the study's own run holding the best
value, the importances and the dashboard page (docs/tracking.md).

The driver stays light: ``_feed`` (imported by the driver) only appends trial start / finish events to a spool
(``_spool``) and runs one tracking process per driver, ``python -m hpo.tracking._sync``, which alone imports
mlflow (``_mlflow``) or wandb (``_wandb``), reads the trials' metrics files and the storage (``_content``), and
retries a tracker that is down without losing or repeating a step (``_sink``: the cursors). ``_check`` tests the
trackers before a study starts. The ``tracking:`` section itself is parsed in :mod:`hpo.experiment._tracking`.

May import: ``hpo.reporting`` and everything below it."""

from hpo.tracking._check import checked_tracking, tracker_problems
from hpo.tracking._feed import TrackingFeed, catch_up, describe

__all__ = ["TrackingFeed", "catch_up", "checked_tracking", "describe", "tracker_problems"]
