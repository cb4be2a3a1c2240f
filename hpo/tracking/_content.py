"""What a run holds, whatever the tracker: a trial chain's identity, its parameters and job type, the outcome
logged when it ends, and the study run's best value and importances. Read from the study's storage (no tracker
imported here).

A **chain** is a trial and its retries (an interrupted or dead driver's trial is queued again as a new trial with
system attr ``retry_history``); its root is the first trial's number, and one run per chain is kept in each
tracker, so a retry continues its run (run ids: study system attr ``hpo:tracking:<root>``)."""

from __future__ import annotations

import json
import math
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpo.record import (
    ATTR_CONFIRM_OF,
    ATTR_JOB_TYPE,
    ATTR_TARGET,
    ATTR_TRACKING_KEY,
    ATTR_TRACKING_RUN,
    chain_root,
    is_confirm,
    is_finished,
    is_segment,
    retry_history,
)
from hpo.reporting import best_trial, outcome, plottable_copy

ATTR_KEY = ATTR_TRACKING_KEY  # study system attr: the study's tracking key (run ids derive from it)
ATTR_RUN = ATTR_TRACKING_RUN  # study system attr: {"mlflow": run id, "wandb": run id} of a chain
OUTCOME_KEYS = ("stop_reason", "fail_reason", "diagnosis", "diagnosis_labels", "diagnosis_evidence",
                "peak_memory_gb", "wall_time_s", "last_step", "compute_saved_s", "resumed_from_step", "confirm_of",
                "confirm_seed", "memory_mechanism", "exit_code", "error")



def job_type(t: FrozenTrial) -> str:
    """``tune``, ``confirm`` (a seed-confirmation run, a PBT schedule's included), ``pbt`` (a segment of a
    population member, :mod:`hpo.study._population`) or what system attr ``hpo:job_type`` says."""
    named = t.system_attrs.get(ATTR_JOB_TYPE)
    if isinstance(named, str) and re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", named):
        return named
    if is_confirm(t) or ATTR_CONFIRM_OF in t.system_attrs:
        return "confirm"
    return "pbt" if is_segment(t) else "tune"


@dataclass(frozen=True)
class ChainInfo:
    """What a run is opened with (each attempt of the chain re-opens it)."""

    root: int
    trial: int  # the attempt now running
    attempts: tuple[int, ...]  # every trial number of the chain so far
    params: dict[str, Any]
    job_type: str
    worker: str
    start_ms: int  # when this attempt started (a new run starts then, not when the tracker got to it)


def chain_info(t: FrozenTrial) -> ChainInfo:
    attempts = tuple(retry_history(t))
    worker = t.user_attrs.get("worker")
    host = worker.get("host", "") if isinstance(worker, dict) else ""
    start = t.datetime_start
    return ChainInfo(root=chain_root(t), trial=t.number, attempts=(*attempts, t.number), params=dict(t.params),
                     job_type=job_type(t), worker=str(host), start_ms=int(start.timestamp() * 1000) if start else 0)


@dataclass(frozen=True)
class Finished:
    """A trial's end: its status in tracker terms, numbers (metrics / summary) and words (tags)."""

    trial: int
    status: str  # FINISHED | FAILED | KILLED (MLflow's words; W&B: exit code 0 / 1)
    numbers: dict[str, float]
    words: dict[str, str]
    end_ms: int


def _word(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, default=str, sort_keys=True)


def finished(t: FrozenTrial, objective_names: list[str]) -> Finished:
    ua = t.user_attrs
    label = outcome(t)
    status = ("FAILED" if "fail_reason" in ua else "KILLED" if t.state == TrialState.FAIL else "FINISHED")
    numbers: dict[str, float] = {}
    words: dict[str, str] = {"state": t.state.name, "outcome": label, "trial": str(t.number)}
    for i, v in enumerate(t.values or ()):
        name = objective_names[i] if i < len(objective_names) else f"value_{i}"
        if math.isfinite(v):
            numbers[f"objective/{name}"] = float(v)
        else:
            words[f"objective/{name}"] = str(v)
    for k in OUTCOME_KEYS:
        if k not in ua or ua[k] is None:
            continue
        v = ua[k]
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            numbers[k] = float(v)
        else:
            words[k] = _word(v)[:4000]
    end = t.datetime_complete or t.datetime_start
    return Finished(trial=t.number, status=status, numbers=numbers, words=words,
                    end_ms=int(end.timestamp() * 1000) if end is not None else 0)


MAX_IMPORTANCES = 50  # the study run's importance/<param> metrics: the most important ones (MLflow takes 1,000
# metrics per batch; a space of 7,500 parameters had its whole study update refused)


@dataclass
class StudyUpdate:
    """The study run's numbers: the best value so far, its trial and parameters, progress, importances."""

    n_finished: int
    n_trials: int | None
    best_value: float | None = None
    best_trial: int | None = None
    best_params: dict[str, Any] = field(default_factory=dict)
    importances: dict[str, float] = field(default_factory=dict)
    final: bool = False  # this driver is done: the study run ends FINISHED when the study reached its target

    @property
    def complete(self) -> bool:
        return self.n_trials is not None and self.n_finished >= self.n_trials


def study_update(study: optuna.Study, with_importances: bool, final: bool = False) -> StudyUpdate:
    trials = study.get_trials(deepcopy=False)
    done = [t for t in trials if is_finished(t) and not is_confirm(t)]
    target = study.user_attrs.get(ATTR_TARGET)
    upd = StudyUpdate(n_finished=len(done), n_trials=int(target) if isinstance(target, int) else None, final=final)
    if len(study.directions) == 1:
        best = best_trial(study)
        if best is not None:
            upd.best_value, upd.best_trial, upd.best_params = float(best.values[0]), best.number, dict(best.params)
        if with_importances and sum(1 for t in done if t.state == TrialState.COMPLETE) >= 2:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    imp = optuna.importance.get_param_importances(plottable_copy(study))
                finite = [(k, float(v)) for k, v in imp.items() if math.isfinite(v)]  # most important first
                upd.importances = dict(finite[:MAX_IMPORTANCES])
            except Exception:  # noqa: BLE001 - importances are a nicety (one parameter, constant values, ...)
                upd.importances = {}
    return upd


# ----------------------------------------------------------------------------- names
_BAD = re.compile(r"[^/\w.\- :]")


def metric_key(name: str) -> str:
    """A trainer metric name MLflow accepts (letters, digits, ``_ - . / : space``): ``@`` -> ``_at_`` (verl's
    ``val-core/.../mean@4``), any other character -> ``_``, no leading ``/`` or ``..`` parts."""
    key = _BAD.sub("_", name.replace("@", "_at_"))
    parts = [p if p not in ("", ".", "..") else "_" for p in key.split("/")]
    return "/".join(parts)[:250] or "_"
