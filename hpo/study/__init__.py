"""The study loop: the ``Driver`` that asks, runs and tells trials beside other drivers, stale-trial recovery and
heartbeats, seed confirmation and checkpoint retention. What a trial runs is its backend's (:mod:`hpo.backends`),
where the study lives is :mod:`hpo.storages`, how values are chosen :mod:`hpo.samplers`, what the stored
attributes mean :mod:`hpo.record`.

Modules: ``_driver`` (the loop), ``_slots`` (claiming the target), ``_trial`` (one trial: ``_runner`` runs it,
``_outcome`` what its ending is recorded as: run attrs, values, stop and fail reasons), ``_trial_files`` (its
directory, environment and files), ``_watch`` (reporting, pruning and early stopping per metrics line), ``_optuna``
(sampler, pruner, creating and loading the study), ``_recovery``, ``_confirm``, ``_compare``, ``_continuation`` (a
proxy search's race: its field, promoted runs continued), ``_checkpoints``, ``_ray_trials``, ``_population`` (PBT's
segments as trials), ``_schedules`` (a PBT study's confirmation), ``_errors``, ``_progress``.

May import: ``hpo.backends``, ``hpo.storages``, ``hpo.samplers``, ``hpo.record``, ``hpo.execution``,
``hpo.experiment``, ``hpo.analysis``; never ``hpo.reporting`` (progress goes to a ``Progress`` the caller hands in)."""

from hpo.storages import RetryingStorage, StorageUnavailable, open_storage
from hpo.study._checkpoints import CHECKPOINTS, checkpoint_problem, disk_usage
from hpo.study._compare import LEVEL, RULE, Difference, Verdict, improvement, race_state, t_quantile, verdict
from hpo.study._confirm import (
           BASELINE_OF,
           CONTROL_OF,
           IMPORTED,
           IMPORTED_SHA256,
           Confirmed,
           add_imported_baseline,
           baseline_cache,
           baseline_confirmed,
           baseline_runs_on,
           confirm_overrides,
           confirm_reserve,
           confirm_seeds,
           confirmed,
           heldout_metric_of,
           heldout_note,
           heldout_overrides,
           pending,
           queue_confirmations,
           queue_speed_check,
           seed_keys,
           strict_pair,
)
from hpo.study._continuation import proxy_race_line, unused_top_line
from hpo.study._driver import Driver, check_search, open_stored, queue_confirm, study_target
from hpo.study._errors import DriverError, TrialInterrupted
from hpo.study._optuna import load_stored, make_pruner, make_sampler, open_study, quiet_optuna
from hpo.study._population import NoHealthyMember, best_final, lineage_of, no_healthy_line, pbt_total, step_name
from hpo.study._progress import Progress
from hpo.study._slots import n_finished

__all__ = ["BASELINE_OF", "CHECKPOINTS", "CONTROL_OF", "Confirmed", "Difference", "Driver", "DriverError", "IMPORTED",
           "IMPORTED_SHA256", "LEVEL", "NoHealthyMember", "Progress", "RULE", "RetryingStorage", "StorageUnavailable",
           "TrialInterrupted", "Verdict", "add_imported_baseline", "baseline_cache", "baseline_confirmed",
           "baseline_runs_on", "best_final", "check_search", "checkpoint_problem", "confirm_overrides",
           "confirm_reserve", "confirm_seeds", "confirmed", "disk_usage", "heldout_metric_of", "heldout_note",
           "heldout_overrides", "improvement", "lineage_of", "load_stored", "make_pruner", "make_sampler",
           "n_finished", "no_healthy_line", "open_storage", "open_stored", "open_study", "pbt_total", "pending",
           "proxy_race_line", "queue_confirm", "queue_confirmations", "queue_speed_check", "quiet_optuna",
           "race_state", "seed_keys", "step_name", "strict_pair", "study_target", "t_quantile",
           "unused_top_line", "verdict"]
