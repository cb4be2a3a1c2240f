"""Every attribute a study or trial carries in the Optuna storage, and what it means. The study loop writes them;
reporting, tracking and the dashboard read them; all of them read the keys and the meaning from here.

Study system attributes: :data:`ATTR_SPACE` (the experiment as parsed), :data:`ATTR_SOURCE` (its file),
:data:`ATTR_TARGET` (the trial target), :data:`ATTR_DIGEST` (sha256 of the experiment), :data:`ATTR_TRACKING_KEY`
and :data:`ATTR_TRACKING_RUN` (MLflow / W&B run ids of each retry chain), :data:`ATTR_RACE` (racing confirmation's
settings), :data:`ATTR_PROMOTION` (the proxy settings promoted to the target), :data:`ATTR_PROXY_TIES` (the proxy's
tied best settings re-run on its own seeds). Study user attributes:
:data:`ATTR_BUDGET`, :data:`ATTR_FIDELITY_CHECK` (the proxy's rank agreement with the target and the decision),
:data:`ATTR_TRANSFER`.

Trial system attributes (set before a trial runs, by whoever queued it):

* a retry chain: ``failed_trial`` (:data:`ATTR_RETRY_OF`, the trial this one retries; Optuna's own key) and
  ``retry_history`` (:data:`ATTR_RETRY_HISTORY`, the chain's earlier trial numbers, oldest first: the chain's root
  is the first);
* a confirmation run: :data:`ATTR_CONFIRM_OF` (the confirmed trial's number; -1 a baseline run, -2 a throughput
  study's control; the trial's user attr ``confirm_of`` shows ``"baseline"`` / ``"control"``),
  :data:`ATTR_CONFIRM_SEED`, :data:`ATTR_BASELINE`; a throughput study's re-measurement, :data:`ATTR_SPEED_BLOCK`;
* the driver's liveness: :data:`ATTR_HEARTBEAT`, :data:`ATTR_RESULT` (the result its driver recorded before telling),
  :data:`ATTR_RECOVERING`, :data:`ATTR_RAY_CLAIM`;
* a PBT segment: the ``pbt:`` keys (:data:`PBT_MEMBER` ... :data:`PBT_INTERMEDIATE`); :data:`ATTR_JOB_TYPE`;
* ``study.fidelity.proxy``: :data:`ATTR_FIDELITY` (``proxy`` or ``target``), a promoted run's
  :data:`ATTR_PROMOTED_FROM` and :data:`ATTR_PROMOTE_STEPS`; a confirmation run's :data:`ATTR_CONTINUES` (the promoted
  run whose checkpoint its first seed continues); a proxy tie run's :data:`ATTR_TIE_OF` and :data:`ATTR_TIE_SEED`.

Trial user attributes (what happened): see :data:`USER_ATTRS`.
"""

from __future__ import annotations

from typing import Any

from optuna.trial import FrozenTrial, TrialState

# ----------------------------------------------------------------------------- study system attributes
ATTR_SPACE = "hpo:space"
ATTR_SOURCE = "hpo:source"
ATTR_TARGET = "hpo:n_trials"
ATTR_DIGEST = "hpo:space_sha256"
ATTR_TRACKING_KEY = "hpo:tracking:key"  # the study's tracking key (run ids derive from it)
ATTR_TRACKING_RUN = "hpo:tracking:{root}"  # {"mlflow": run id, "wandb": run id} of a retry chain
ATTR_BUDGET = "hpo:budget"  # the --budget the search was given (full runs): resume, worker and confirm keep to it
ATTR_RACE = "hpo:race"  # racing confirmation's settings: candidates, seeds (min, max), resolution (hpo.study._confirm)
# study.fidelity.proxy: the proxy settings promoted to the target (candidates, steps), set once (system attr), and
# the proxy's check against the target (agreement figures and the decision: a user attr, so reports show it)
ATTR_PROMOTION = "hpo:promotion"
# study.fidelity.proxy.tie_seeds: the proxy's best settings it could not tell apart and the seeds they re-run on
# before the promotion ({settings, seeds}), set once (system attr)
ATTR_PROXY_TIES = "hpo:proxy_ties"
ATTR_FIDELITY_CHECK = "hpo:fidelity_check"
ATTR_TRANSFER = "hpo:fidelity_transfer"  # the transfer factors the study's proxy runs used, by parameter (user attr)

# ----------------------------------------------------------------------------- trial system attributes
ATTR_RETRY_OF = "failed_trial"  # Optuna's RetryFailedTrialCallback key
ATTR_RETRY_HISTORY = "retry_history"
ATTR_CONFIRM_OF = "hpo:confirm_of"
ATTR_CONFIRM_SEED = "hpo:confirm_seed"
ATTR_BASELINE = "hpo:baseline"
ATTR_SPEED_BLOCK = "hpo:speed_block"  # a throughput re-measurement: its seed's runs in order (hpo.study._confirm)
ATTR_HEARTBEAT = "hpo:heartbeat"
ATTR_RESULT = "hpo:result"
ATTR_RECOVERING = "hpo:recovering"  # set on a dead driver's trial just before it is failed: its retry is due
ATTR_RAY_CLAIM = "hpo:ray_claim"
# the driver's mark in every trial directory it creates (hpo.study._trial_files) and every shared checkpoint directory
# of a Ray-job trial (trial.ray.shared_dir): only directories holding it are ever deleted
TRIAL_MARKER = ".verl-hpo-trial"
ATTR_JOB_TYPE = "hpo:job_type"  # a trial's job type (e.g. "pbt"); else tune or confirm
# study.fidelity.proxy: "proxy" (a search trial on the proxy model) or "target"; a promoted target run names the
# proxy trial whose setting it runs and the steps it stops at
ATTR_FIDELITY = "hpo:fidelity"
ATTR_PROMOTED_FROM = "hpo:promoted_from"
ATTR_PROMOTE_STEPS = "hpo:promote_steps"
ATTR_CONTINUES = "hpo:continues"  # a confirmation run that continues this promoted run's checkpoint (hpo.study)
# a proxy tie run (study.fidelity.proxy.tie_seeds): the proxy trial whose setting it runs again, and on which seed
ATTR_TIE_OF = "hpo:tie_of"
ATTR_TIE_SEED = "hpo:tie_seed"
PROXY, TARGET = "proxy", "target"

PBT = "pbt:"
PBT_MEMBER, PBT_SEQ, PBT_GEN = "pbt:member", "pbt:seq", "pbt:generation"
PBT_START, PBT_END, PBT_ACTION = "pbt:start", "pbt:end", "pbt:action"
PBT_PARENT, PBT_DONOR, PBT_SOURCE, PBT_CHECKPOINT = "pbt:parent_trial", "pbt:donor", "pbt:source", "pbt:checkpoint"
PBT_ROLLBACKS, PBT_WHY = "pbt:rollbacks", "pbt:why"
PBT_SCHEDULE, PBT_INDEX, PBT_INTERMEDIATE = "pbt:schedule", "pbt:schedule_index", "pbt:intermediate"

# ----------------------------------------------------------------------------- trial user attributes
USER_ATTRS: dict[str, str] = {
    "trial_dir": "the trial's directory (logs, metrics, checkpoints)",
    "worker": "the driver that ran it (host, pid)",
    "retry_of": "the trial this attempt retries",
    "stop_reason": "pruned | converged | collapsed[:label] | plateau | interrupted | surplus | driver_error",
    "fail_reason": "oom | timeout | bad_metrics | killed | crash | predicted_oom | infeasible | checkpoint | "
                   "dropped_rows | host (a failed trial: its value, the worst or a timed-out throughput trial's, never "
                   "ranks it among the finished ones: is_failed; host: a FAIL, retried: the host could not start the "
                   "trainer in time, Backend.host_failure_lines)",
    "timeout_rate": "a throughput trial stopped at its time limit: its mean rate over the steps it measured (None: "
                    "none); its value is below every finished trial's",
    "host_busy": "the share of the host's CPU time other processes used while the trial ran (/proc/stat less the "
                 "trial's own processes' CPU time)",
    "trial_cpu_s": "CPU seconds of the trial's processes (user + system, reaped by its wrapper)",
    "error": "why it failed, one line",
    "stderr_tail": "the end of its stderr",
    "exit_code": "the trainer's exit status",
    "last_step": "the last step it logged",
    "total_steps": "the steps its run was set to (a full run's length)",
    "baseline_reused": "a baseline run copied from an earlier study's identical run on this host (costs nothing)",
    "baseline_imported": "a baseline run imported from the user's own run by confirm --baseline-runs (its path; costs "
                         "nothing)",
    "baseline_imported_sha256": "the imported run's metrics file digest (an import is made once per file)",
    "baseline_imported_record": "the record (config.yaml or .hydra/overrides.yaml) the imported run was checked "
                                "against",
    "wall_time_s": "wall time of its process",
    "peak_memory_gb": "its peak memory",
    "first_metric_s": "seconds to its first metrics line",
    "compute_saved_s": "time an early stop saved",
    "confirm_of": "a confirmation run: the confirmed trial, or baseline",
    "confirm_seed": "a confirmation run's seed",
    "test_value": "a confirmation run's held-out value",
    "test_metric": "the metric that value was read from",
    "diagnosis": "the run's diagnosis label (hpo.analysis)",
    "dropped_rows": "rows of its data its trainer said it dropped and went on without (Backend.dropped_row_patterns)",
    "dropped_rows_error": "the first dropped row's exception line (else the trainer's line about it)",
    "logs_cut": "a log that went over its cap ($VERL_HPO_LOG_CAP_MIB) -> bytes cut from its middle",
    "resumed_from_step": "a retry, or a confirmation run continuing a promoted run: the checkpoint step it continued "
                         "from",
    "interrupted": "stopped by the user or its driver's death (queued again)",
    "fidelity": "study.fidelity.proxy: proxy (ran on the proxy model) or target",
    "promoted_from": "a promoted target run: the proxy trial whose setting it runs",
    "promote_seed": "a promoted target run: the seed it ran on (the race's first confirmation seed)",
    "continued_from": "a confirmation run that continued a promoted run: {run, step} of the checkpoint",
    "continue_refused": "a confirmation run that was to continue a promoted run and started afresh: why",
    "tie_of": "a proxy tie run: the proxy trial whose setting it runs again on another seed (study.fidelity.proxy."
              "tie_seeds)",
    "tie_seed": "a proxy tie run: its seed (one of the race's confirmation seeds)",
}


# ----------------------------------------------------------------------------- what a stored trial is
def is_confirm(t: FrozenTrial) -> bool:
    """A confirmation run (queued by ``verl-hpo confirm``)."""
    return ATTR_CONFIRM_OF in t.system_attrs


def is_failed(t: FrozenTrial) -> bool:
    """The trial failed (``fail_reason``): whatever value it completed with (the worst, or a timed-out throughput
    trial's finite one), it is never the best, never confirmed, and ranks after every finished trial."""
    return "fail_reason" in t.user_attrs


def fidelity_of(t: FrozenTrial) -> str:
    """``proxy`` for a search trial that ran on ``study.fidelity.proxy``'s model, else ``target`` (every trial of a
    study without a proxy, and every confirmation run)."""
    return PROXY if t.system_attrs.get(ATTR_FIDELITY) == PROXY and not is_confirm(t) else TARGET


def is_proxy(t: FrozenTrial) -> bool:
    return fidelity_of(t) == PROXY


def is_promoted(t: FrozenTrial) -> bool:
    """A target run of a proxy setting promoted by ``study.fidelity.proxy`` (its short budget: promote_steps)."""
    return ATTR_PROMOTED_FROM in t.system_attrs and not is_confirm(t)


def is_tie_run(t: FrozenTrial) -> bool:
    """A proxy run of a setting the proxy could not tell from its best, on another seed (``tie_seeds``): evidence for
    the promotion, not a search trial (never counted in ``n_trials``, never pruned)."""
    return ATTR_TIE_OF in t.system_attrs and not is_confirm(t)


def is_baseline(t: FrozenTrial) -> bool:
    """A confirmation run of ``study.baseline``."""
    return bool(t.system_attrs.get(ATTR_BASELINE))


def is_finished(t: FrozenTrial) -> bool:
    """COMPLETE, PRUNED, or FAIL with a result its driver recorded (``on_failure: fail``); an interrupted or
    recovered trial (FAIL without a recorded result) is not finished: its retry is. Confirmation runs never count
    towards the search's target."""
    if is_confirm(t):
        return False
    if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    if t.state != TrialState.FAIL:
        return False
    return ATTR_RESULT in t.system_attrs or ("fail_reason" in t.user_attrs and ATTR_HEARTBEAT not in t.system_attrs)


def retry_history(t: FrozenTrial) -> list[int]:
    """The retry chain's earlier trial numbers, oldest first ([] for a first attempt)."""
    history = t.system_attrs.get(ATTR_RETRY_HISTORY)  # from shared storage: anything; the ints are the chain
    return [n for n in history if isinstance(n, int) and not isinstance(n, bool)] if isinstance(history, list) else []


def chain_root(t: FrozenTrial) -> int:
    """The first trial of ``t``'s retry chain (``t`` itself for a first attempt)."""
    history = retry_history(t)
    return history[0] if history else t.number


def is_segment_attrs(system: dict[str, Any]) -> bool:
    """A trial's system attrs are those of a PBT segment (of the population)."""
    return PBT_MEMBER in system


def is_segment(t: FrozenTrial) -> bool:
    return is_segment_attrs(t.system_attrs)


RUNG = "completed_rung_{}"  # Optuna's SuccessiveHalvingPruner / HyperbandPruner: the value a trial had at rung k


def rungs(t: FrozenTrial) -> int:
    """How many rungs of successive halving ``t`` completed (0: none, or another pruner)."""
    k = 0
    while RUNG.format(k) in t.system_attrs:
        k += 1
    return k


def runs_steps(system: dict[str, Any]) -> bool:
    """A segment of the population or of a schedule's confirmation chain: it runs a step range."""
    return PBT_START in system
