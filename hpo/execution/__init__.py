"""Launching and watching one trial process: the wrapper that dies with the driver, its cgroup and memory cap,
the metrics file tail, kill and exit labels, GPU locks and the driver's identity. Knows nothing of studies.

May import: nothing of ``hpo`` but itself (a peer of ``hpo.experiment``)."""

from hpo.execution._metrics import MetricsFileError, MetricsTail, metric_value, parse_line
from hpo.execution._runner import RunResult, TrialProcess, classify_exit, is_finite, kill_tree

__all__ = ["MetricsFileError", "MetricsTail", "RunResult", "TrialProcess", "classify_exit", "is_finite",
           "kill_tree", "metric_value", "parse_line"]
