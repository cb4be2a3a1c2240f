"""The study's side of ``trial.executor: ray`` (docs/ray.md): admission of a trial onto the cluster, the job a trial
runs (a fresh one, or the still-running job of its dead predecessor, adopted), and the sweep of jobs nobody follows.

Admission. A trial is submitted only when (1) its claim (``nodes`` x per-node resources) and the claims of the
study's other running trials pack into the nodes' totals, and (2) Ray's own view shows it free now
(:func:`hpo.execution.ray_jobs.fits_now`); the time this takes is the trial's ``device_wait_s``. Claims live in the
study storage (system attr ``hpo:ray_claim`` of a RUNNING trial), so any number of drivers of one study on one
cluster never over-admit, whether or not Ray already sees an admitted job use anything (a verl job takes its GPUs
only when its placement groups are made). A driver writes its claim, then reads every claim; it admits itself only
if everything it read fits. Two drivers that claim at once both see both claims; the later claim is withdrawn
(set to null) so that the earlier goes first, and is made again on the next poll.

Adoption. Jobs carry their study and trial number in their metadata. A retry of a trial whose driver died (its
``retry_history``) first looks for a job of its chain that is still PENDING or RUNNING, or whose newest job SUCCEEDED
while no driver watched: it follows that job instead of submitting one (its log is read from the start, so its
curve and its end are the retry's). Otherwise it submits
``verl-hpo-<study>-<trial number>`` (a suffix when an older job, e.g. of a deleted study of the same name, has that
id): Ray refuses a second job with one id, so a trial never has two.

Sweep. When a driver starts and when it ends, a job of the study that is alive but belongs to no running trial
(nor, at the start, to the chain of a queued retry, which will adopt it) is stopped and waited for.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from hpo.execution import TrialRun
from hpo.execution.ray_jobs import (
    META_STUDY,
    META_TRIAL,
    TERMINAL,
    JobResources,
    RayClusterError,
    RayJob,
    cluster_view,
    fits_now,
    job_client,
    stop_and_wait,
    study_jobs,
)
from hpo.experiment import TrialSpec
from hpo.record import ATTR_RAY_CLAIM, ATTR_RETRY_HISTORY

ATTR_CLAIM = ATTR_RAY_CLAIM
POLL_S = 1.0  # admission re-checks this often (plus up to 50 % jitter)
ENV_ADDRESS = "RAY_ADDRESS"
_FITTED: set[str] = set()  # clusters that were big enough for a trial once: a lost node is waited for


def address(spec: TrialSpec) -> str:
    """The cluster's dashboard: ``trial.ray.address`` (``--ray-address`` sets it), else ``$RAY_ADDRESS``."""
    found = spec.ray.address or os.environ.get(ENV_ADDRESS, "").strip()
    if not found or found.startswith("ray://"):
        raise RayClusterError("trial.executor is ray but no cluster is named: set trial.ray.address, --ray-address "
                              "or $RAY_ADDRESS to the dashboard (http://head:8265)")
    return found


def needs(spec: TrialSpec) -> JobResources:
    return JobResources(spec.ray.nodes, spec.ray.per_node())


def _claim_of(t: FrozenTrial) -> dict[str, Any] | None:
    claim = t.system_attrs.get(ATTR_CLAIM)
    return claim if isinstance(claim, dict) else None


def admit(study: optuna.Study, trial: Trial, spec: TrialSpec, stop: threading.Event, adopted: bool = False,
          note: Any = None) -> bool:
    """Wait until ``trial`` may be submitted (see the module docstring); False when ``stop`` is set first.
    An ``adopted`` job already holds what it needs: its claim is admitted at once. Raises
    :class:`RayClusterError` when the cluster could never hold it."""
    need, where = needs(spec), address(spec)
    storage, trial_id = study._storage, trial._trial_id
    if adopted:
        storage.set_trial_system_attr(trial_id, ATTR_CLAIM, {**need.as_claim(), "at": time.time(), "admitted": True})
        return True
    claimed_at: float | None = None
    said = ""
    while not stop.is_set():
        if claimed_at is None:
            claimed_at = time.time()
            storage.set_trial_system_attr(trial_id, ATTR_CLAIM, {**need.as_claim(), "at": claimed_at})
        others: list[tuple[float, int, JobResources, bool]] = []
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            claim = _claim_of(t)
            if t._trial_id != trial_id and claim is not None:
                others.append((float(claim.get("at", 0)), t._trial_id, JobResources.from_claim(claim),
                               bool(claim.get("admitted"))))
        nodes, _ = cluster_view(where)
        if not nodes:  # a head just started (its autoscaler has not reported yet), or every node is gone
            ok, why = False, "Ray's report lists no alive node yet: waiting for one"
        else:
            try:
                ok, why = fits_now(nodes, need, [o[2] for o in others])
            except RayClusterError:
                if where not in _FITTED:  # never big enough since this driver started: a mistake in trial.ray
                    raise
                ok, why = False, "nodes it had are gone: waiting for them to come back"
            _FITTED.add(where)
        if ok:
            storage.set_trial_system_attr(trial_id, ATTR_CLAIM, {**need.as_claim(), "at": claimed_at,
                                                                  "admitted": True})
            return True
        if any(not admitted and (at, tid) < (claimed_at, trial_id) for at, tid, _, admitted in others):
            storage.set_trial_system_attr(trial_id, ATTR_CLAIM, None)  # an earlier claim waits too: it goes first
            claimed_at = None
        if note is not None and why != said:
            note(f"trial {trial.number}: waiting for {need.describe()} on the Ray cluster ({why})")
            said = why
        stop.wait(POLL_S * (1 + random.random() / 2))  # noqa: S311 - jitter, not crypto
    return False


def job_for(study: optuna.Study, number: int, history: list[int], spec: TrialSpec) -> tuple[str, bool]:
    """The submission id the trial runs and whether it adopts that (running) job of its retry chain."""
    client = job_client(address(spec))
    jobs = study_jobs(client, study.study_name)
    chain = {str(n) for n in history}
    mine = sorted((j for j in jobs if (j.metadata or {}).get(META_TRIAL) in chain), key=lambda j: j.start_time or 0)
    alive = [j for j in mine if str(j.status.value) not in TERMINAL]
    if alive:
        for extra in alive[:-1]:  # never happens unless someone else submitted one: only one runs on
            stop_and_wait(client, extra.submission_id, spec.ray.stop_timeout_s)
        return str(alive[-1].submission_id), True
    if mine and str(mine[-1].status.value) == "SUCCEEDED":  # it ran to its end while no driver watched
        return str(mine[-1].submission_id), True
    taken = {j.submission_id for j in client.list_jobs()}
    base = sid = f"verl-hpo-{study.study_name}-{number}"
    k = 0
    while sid in taken:
        k += 1
        sid = f"{base}-{k}"
    return sid, False


def metadata(study: optuna.Study, number: int) -> dict[str, str]:
    return {META_STUDY: study.study_name, META_TRIAL: str(number)}


def sweep_jobs(study: optuna.Study, spec: TrialSpec, final: bool) -> int:
    """Stop the study's alive jobs that no running trial follows (nor, unless ``final``, a queued retry that will
    adopt them); the number stopped."""
    client = job_client(address(spec))
    keep: set[str] = set()
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.RUNNING or (not final and t.state == TrialState.WAITING):
            keep |= {str(t.number), *(str(n) for n in t.system_attrs.get(ATTR_RETRY_HISTORY, []))}
    stopped = 0
    for j in study_jobs(client, study.study_name):
        if str(j.status.value) in TERMINAL or (j.metadata or {}).get(META_TRIAL) in keep:
            continue
        stop_and_wait(client, j.submission_id, spec.ray.stop_timeout_s)
        stopped += 1
    return stopped


def ray_job(study: optuna.Study, trial: Trial, spec: TrialSpec, job: tuple[str, bool], run: TrialRun,
            hold: bool = True, note: Callable[[str], None] | None = None) -> RayJob:
    """The executor of one attempt ``run`` (what a local :class:`~hpo.execution.TrialProcess` would run): ``job`` is
    :func:`job_for`'s (submission id, adopt); ``hold``: a one-node job may hold its GPUs itself (not a trainer that
    starts its own Ray, ``Backend.ray_hold``); ``note``: a line for the user."""
    sid, adopt = job
    trial.set_user_attr("ray_job", sid)
    if adopt:
        trial.set_user_attr("ray_job_adopted", True)
    return RayJob(run, address=address(spec), submission_id=sid, adopt=adopt, resources=needs(spec),
                  hold=spec.ray.nodes == 1 and hold, metadata=metadata(study, trial.number),
                  runtime_env=spec.ray.runtime_env, stop_timeout_s=spec.ray.stop_timeout_s, note=note)
