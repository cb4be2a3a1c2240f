"""Launching and watching one trial process: the wrapper that dies with the driver, its cgroup and memory cap,
the metrics file tail, kill and exit labels, GPU locks and the driver's identity. Knows nothing of studies.

``_trial_run``: :class:`TrialRun` (one attempt: its argv, logs, limits and callbacks), which either executor runs;
``_runner``: :class:`TrialProcess` (one run), :class:`RunResult` and the exit labels; ``_process``: the trial's
process tree (find, measure, kill, orphans, the kernel's OOM kills); ``_watchdog``: the thread that samples its
memory and enforces the cap, the timeout and the stop event; ``_trial_wrapper``: the wrapper process;
``_cgroup``: the memory cgroup; ``_metrics``: the metrics file tail; ``_executor``: :class:`TrialExecutor`, the
interface a local process and a Ray job (``ray_jobs/``, imported only by Ray-executor studies) share; ``_logpump``:
the process that writes a trial's stdout/stderr capped (head and tail kept) and counts the rows the trainer dropped;
``_logs``: its driver side and the two settings (``$VERL_HPO_LOG_CAP_MIB``, ``$VERL_HPO_MAX_DROPPED_ROWS``);
``_devices``: GPU locks across drivers; ``_identity``: the driver's identity; ``_hostload``: how busy the host was
while a trial ran.

May import: ``hpo.analysis`` (its bounded file reads); nothing else of ``hpo`` (a peer of ``hpo.experiment``)."""

from hpo.execution._devices import DevicePool, detect_devices
from hpo.execution._executor import TrialExecutor
from hpo.execution._identity import driver_identity, identity_alive
from hpo.execution._logs import knob_problem, max_dropped_rows
from hpo.execution._metrics import MAX_STEP, MetricsFileError, MetricsTail, metric_value, parse_line
from hpo.execution._process import (
    ENV_DRIVER,
    ENV_STUDY,
    ENV_TRIAL,
    kernel_oom_killed,
    kill_tree,
    sweep_orphans,
    tree,
    tree_rss_bytes,
)
from hpo.execution._runner import RunResult, TrialProcess, classify_exit, final_exception, is_finite, read_tail
from hpo.execution._trial_run import TrialRun

__all__ = ["DevicePool", "ENV_DRIVER", "ENV_STUDY", "ENV_TRIAL", "MAX_STEP", "MetricsFileError", "MetricsTail",
           "RunResult", "TrialExecutor", "TrialProcess", "TrialRun", "classify_exit", "detect_devices",
           "driver_identity", "final_exception", "identity_alive", "is_finite", "kernel_oom_killed", "kill_tree",
           "knob_problem", "max_dropped_rows", "metric_value", "parse_line", "read_tail", "sweep_orphans", "tree",
           "tree_rss_bytes"]
