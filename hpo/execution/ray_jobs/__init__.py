"""Trials as Ray jobs on the user's cluster: the job executor (:class:`RayJob`, the same interface and result as
a local :class:`~hpo.execution.TrialProcess`), the entrypoint that runs on the node and sends metrics through
the job's log, and the cluster's view (free resources per node, packing claims, the job client). Ray itself is
imported only when a job client is made (``trial.executor: ray``).

``_job``: :class:`RayJob`; ``_entry``: the entrypoint (standard library only, shipped with the job); ``_isolate``:
the jobs' worker setup hook that gives each job its own copy of a trainer's fixed Ray namespaces
(:data:`PRIVATE_NAMESPACES_ENV`, shipped with it);
``_cluster``: :class:`JobResources`, :func:`cluster_view`, :func:`fits_now`, the job client and job listing.

May import: ``hpo.execution`` (it is part of it)."""

from hpo.execution.ray_jobs._cluster import (
    META_STUDY,
    META_TRIAL,
    TERMINAL,
    JobResources,
    NodeView,
    RayClusterError,
    cluster_view,
    dashboard_url,
    fits_now,
    job_client,
    packs,
    stop_and_wait,
    study_jobs,
)
from hpo.execution.ray_jobs._isolate import PRIVATE_NAMESPACES_ENV
from hpo.execution.ray_jobs._job import ENTRY_PACKAGE, JOB_METRICS, JobLog, RayJob, entry_package, job_env

__all__ = ["ENTRY_PACKAGE", "JOB_METRICS", "JobLog", "JobResources", "META_STUDY", "META_TRIAL", "NodeView",
           "PRIVATE_NAMESPACES_ENV", "RayClusterError", "RayJob", "TERMINAL", "cluster_view", "dashboard_url",
           "entry_package", "fits_now", "job_client", "job_env", "packs", "stop_and_wait", "study_jobs"]
