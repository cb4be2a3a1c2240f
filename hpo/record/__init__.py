"""The stored record: every attribute key a study or trial carries in the Optuna storage and what a stored trial is
(finished, a confirmation run, a PBT segment, a retry chain), and what a study spent (``_cost``: steps and full-run
equivalents). The study loop writes the record; reporting, tracking and the dashboard read it, all through this
package (``_attrs``, ``_cost``); the baseline runs a host keeps, and the trial files they name, are read and
written without following a link (``_kept``).

May import: nothing of ``hpo``."""

from hpo.record._attrs import (
    ATTR_BASELINE,
    ATTR_BUDGET,
    ATTR_CONFIRM_OF,
    ATTR_CONFIRM_SEED,
    ATTR_DIGEST,
    ATTR_FIDELITY,
    ATTR_FIDELITY_CHECK,
    ATTR_HEARTBEAT,
    ATTR_JOB_TYPE,
    ATTR_PROMOTE_STEPS,
    ATTR_PROMOTED_FROM,
    ATTR_PROMOTION,
    ATTR_RACE,
    ATTR_RAY_CLAIM,
    ATTR_RECOVERING,
    ATTR_RESULT,
    ATTR_RETRY_HISTORY,
    ATTR_RETRY_OF,
    ATTR_SOURCE,
    ATTR_SPACE,
    ATTR_SPEED_BLOCK,
    ATTR_TARGET,
    ATTR_TRACKING_KEY,
    ATTR_TRACKING_RUN,
    ATTR_TRANSFER,
    PROXY,
    TARGET,
    TRIAL_MARKER,
    USER_ATTRS,
    chain_root,
    fidelity_of,
    is_baseline,
    is_confirm,
    is_failed,
    is_finished,
    is_promoted,
    is_proxy,
    is_segment,
    is_segment_attrs,
    retry_history,
    rungs,
    runs_steps,
)
from hpo.record._cost import Cost, full_steps, proxy_ratio, step_seconds, steps_run, study_cost
from hpo.record._kept import (
    KEPT_ATTRS,
    MAX_METRICS_BYTES,
    KeptRefused,
    checked_record,
    kept_metrics,
    metrics_inside,
    read_kept,
    read_study_file,
    stored_run_problem,
    trial_parts,
    write_kept,
)

__all__ = ["ATTR_BASELINE", "ATTR_CONFIRM_OF", "ATTR_CONFIRM_SEED", "ATTR_DIGEST", "ATTR_HEARTBEAT", "ATTR_JOB_TYPE",
           "ATTR_BUDGET", "TRIAL_MARKER",
           "ATTR_RACE", "ATTR_RAY_CLAIM", "ATTR_RECOVERING", "ATTR_RESULT", "ATTR_RETRY_HISTORY", "ATTR_RETRY_OF",
           "ATTR_SOURCE", "ATTR_SPACE", "ATTR_SPEED_BLOCK", "ATTR_TARGET", "ATTR_TRACKING_KEY", "ATTR_TRACKING_RUN",
           "USER_ATTRS",
           "chain_root", "is_baseline", "is_confirm", "is_failed", "is_finished", "is_segment", "is_segment_attrs",
           "retry_history", "rungs", "runs_steps", "Cost", "full_steps", "proxy_ratio", "step_seconds",
           "steps_run", "study_cost",
           "ATTR_FIDELITY", "ATTR_FIDELITY_CHECK", "ATTR_PROMOTE_STEPS", "ATTR_PROMOTED_FROM", "ATTR_PROMOTION",
           "ATTR_TRANSFER", "PROXY", "TARGET", "fidelity_of", "is_promoted", "is_proxy",  # study.fidelity.proxy
           "KEPT_ATTRS", "MAX_METRICS_BYTES", "KeptRefused", "checked_record", "kept_metrics", "metrics_inside",
           "read_kept", "read_study_file", "stored_run_problem", "trial_parts", "write_kept"]
