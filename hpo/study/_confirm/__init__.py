"""Seed confirmation: re-run a study's top configurations with fresh seeds, and rank by the confirmed mean.

An RL run's final reward depends on its seed about as much as on many hyperparameters, and the best setting
found with one tuning seed is partly that seed's luck (Eimer et al., ICML 2023). ``verl-hpo confirm`` takes
the ``top_k`` best distinct configurations of the search (COMPLETE, finite, feasible) and queues ``seeds`` runs
of each with seeds the tuning trials never used, as WAITING trials of the same study tagged with the system
attrs ``hpo:confirm_of`` (the trial confirmed) and ``hpo:confirm_seed``. Any driver of the study runs them
(never pruned; they never count towards ``study.n_trials``); ``best`` then ranks by the confirmed mean, with
its spread, instead of by the single tuning run.

Seeds: ``study.confirm.seed_base, seed_base + 1, ...`` skipping every tuning seed: the fixed override of a
seed key, the trainer's default when it is not set (verl_core's ``trainer.seed``, verl's 42), and every value a
tuned seed parameter could take. A confirmation run sets every seed key of the run to its seed
(:func:`seed_overrides`): ``trainer.seed`` for verl_core; for verl every seed of its default path
(``verl._compose_checks.SEED_KEYS``: the train sampler ``data.seed``, vLLM's ``actor_rollout_ref.rollout.seed``, the
actor's and critic's mini-batch shuffling ``*.data_loader_seed``); ``study.confirm.seed_key`` names one key instead.
Confirmation runs go to the full budget (the early-stopping rules are off unless ``study.confirm.early_stopping``;
never pruned) and evaluate the held-out test split once at their last step (:func:`heldout_overrides`); their user
attr ``test_value`` is its value of the objective's metric. ``study.baseline`` (the setting a user would run without
a search) is confirmed on the same seeds, as runs tagged ``hpo:baseline`` (``hpo:confirm_of`` = -1, no parameters).
Re-running ``confirm`` queues only what is missing (a trial already has a
queued, running or finished run with that seed), so an interrupted confirmation resumes where it stopped.

Modules: ``_seeds`` (seed keys, fresh seeds, held-out split, the top trials), ``_queue`` (queueing runs, the budget's
reserve), ``_baselines`` (the baseline's runs imported or kept per host), ``_speed`` (a throughput study's
re-measurement), ``_first_rollout`` (its first rollout recorded once per seed and replayed), ``_results`` (the
confirmed values).
"""

from hpo.record import ATTR_BASELINE, ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED, is_confirm
from hpo.study._confirm._baselines import (
    BASELINES,
    IMPORTED,
    IMPORTED_SHA256,
    MAX_ATTEMPTS,
    Note,
    add_imported_baseline,
    baseline_cache,
    baseline_key,
    baseline_run,
    baseline_runs_on,
    cached_baseline,
    remember_baseline,
    value_of_metrics,
)
from hpo.study._confirm._first_rollout import ATTR as FIRST_ROLLOUT
from hpo.study._confirm._first_rollout import first_rollout, first_rollout_env, strict_pair
from hpo.study._confirm._queue import confirm_reserve, pending, queue_confirmations, queue_runs, search_over_budget
from hpo.study._confirm._results import Confirmed, baseline_confirmed, confirmed
from hpo.study._confirm._seeds import (
    BASELINE_OF,
    MAX_TUNED_SEEDS,
    confirm_overrides,
    confirm_seeds,
    heldout_metric_of,
    heldout_note,
    heldout_overrides,
    present_runs,
    seed_key,
    seed_keys,
    seed_overrides,
    top_trials,
    tuning_seeds,
)
from hpo.study._confirm._speed import CONTROL_OF, queue_speed_check, speed_block_retry, speed_generation

__all__ = ["ATTR_BASELINE", "ATTR_CONFIRM_OF", "ATTR_CONFIRM_SEED", "BASELINES", "BASELINE_OF", "CONTROL_OF",
           "Confirmed", "FIRST_ROLLOUT", "IMPORTED", "IMPORTED_SHA256", "MAX_ATTEMPTS", "MAX_TUNED_SEEDS", "Note",
           "add_imported_baseline", "baseline_cache", "baseline_confirmed", "baseline_key", "baseline_run",
           "baseline_runs_on", "cached_baseline", "confirm_overrides", "confirm_reserve", "confirm_seeds", "confirmed",
           "first_rollout", "first_rollout_env", "heldout_metric_of", "heldout_note", "heldout_overrides",
           "is_confirm", "pending", "present_runs", "queue_confirmations", "queue_runs", "queue_speed_check",
           "remember_baseline", "search_over_budget", "seed_key", "seed_keys", "seed_overrides", "speed_block_retry",
           "speed_generation", "strict_pair", "top_trials", "tuning_seeds", "value_of_metrics"]
