"""The baseline's runs made elsewhere: imported from the user's own runs (``confirm --baseline-runs``), and kept per
host (``<studies>/.baselines/<key>/<seed>.json``) for later studies of the same experiment, each checked before it is
reused (its metrics file its trial's own, its value what that file gives)."""

from __future__ import annotations

import hashlib
import io
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from hpo.analysis import BASELINES_DIR
from hpo.backends import backend_of
from hpo.experiment import Space
from hpo.record import (
    ATTR_BASELINE,
    ATTR_CONFIRM_OF,
    ATTR_CONFIRM_SEED,
    ATTR_RESULT,
    KEPT_ATTRS,
    checked_record,
    is_baseline,
    kept_metrics,
    metrics_inside,
    read_kept,
    read_study_file,
    retry_history,
    stored_run_problem,
    trial_parts,
    write_kept,
)
from hpo.study._confirm._seeds import BASELINE_OF, heldout_overrides, seed_keys


def baseline_run(seed: int, intermediate: dict[int, float], user_attrs: dict[str, Any],
                 value: float | None = None) -> FrozenTrial:
    """A baseline run on ``seed`` made elsewhere, as the study holds it: finished with ``value`` (a run kept on this
    host, :func:`cached_baseline`), or (``value`` None) running, the claim an imported run is added as
    (:func:`add_imported_baseline`); no parameters, the baseline's tags."""
    return optuna.create_trial(
        state=TrialState.COMPLETE if value is not None else TrialState.RUNNING, value=value, params={},
        distributions={}, intermediate_values=intermediate, user_attrs=user_attrs,
        system_attrs={ATTR_CONFIRM_OF: BASELINE_OF, ATTR_CONFIRM_SEED: seed, ATTR_BASELINE: True})


IMPORTED = "baseline_imported"  # user attr of a baseline run imported from the user's own (confirm --baseline-runs)
IMPORTED_SHA256 = "baseline_imported_sha256"  # ... and the sha256 of its metrics file (imported once)


def add_imported_baseline(study: optuna.Study, seed: int, value: float, intermediate: dict[int, float],
                          user_attrs: dict[str, Any]) -> FrozenTrial | None:
    """Add a run the user made of the baseline on ``seed`` (``confirm --baseline-runs``) as a finished baseline run;
    None, adding nothing finished, when the seed already has one (finished, or started first).

    Several drivers may import at once (PostgreSQL): the run goes in as a RUNNING claim with its curve and attrs,
    then, as for two drivers queueing one confirmation run (:func:`queue_runs`, the runner's twin rule), the claim
    that goes first wins: any other baseline run of the seed finished, or running with a lower number, makes this
    one surplus (FAIL, ``stop_reason=surplus``); the winner records its result (``hpo:result``: a driver that dies
    now has finished it, :mod:`hpo.study._recovery`) and completes. A queued (WAITING) baseline run of the seed is
    then surplus in its turn, never run."""
    storage = study._storage
    trial_id = storage.create_new_trial(study._study_id, template_trial=baseline_run(seed, intermediate, user_attrs))
    mine = storage.get_trial(trial_id)
    first = next((t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
                  if t._trial_id != trial_id and _baseline_on(t, seed)
                  and (t.state == TrialState.COMPLETE or (t.number, t._trial_id) < (mine.number, trial_id))), None)
    try:
        if first is not None:
            storage.set_trial_user_attr(trial_id, "stop_reason", "surplus")
            storage.set_trial_state_values(trial_id, TrialState.FAIL)
            return None
        storage.set_trial_system_attr(trial_id, ATTR_RESULT, {"state": TrialState.COMPLETE.name, "values": [value]})
        storage.set_trial_state_values(trial_id, TrialState.COMPLETE, [value])
    except UpdateFinishedTrialError:  # finished by a driver that took it for a dead driver's (its recorded result)
        pass
    return storage.get_trial(trial_id)


def _baseline_on(t: FrozenTrial, seed: int) -> bool:
    return is_baseline(t) and t.system_attrs.get(ATTR_CONFIRM_OF) == BASELINE_OF \
        and t.system_attrs.get(ATTR_CONFIRM_SEED) == seed


def baseline_runs_on(study: optuna.Study, seed: int) -> list[FrozenTrial]:
    """The baseline's runs on ``seed`` queued, running or finished (not failed), oldest first."""
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING,
                                                                TrialState.WAITING, TrialState.PRUNED))
            if _baseline_on(t, seed)]


# ----------------------------------------------------------------------------- the baseline's runs, kept per host
BASELINES = BASELINES_DIR  # under the studies directory: <key>/<seed>.json (a name no study may take)
MAX_ATTEMPTS = 1000  # a kept metrics file is its trial's for one of its first MAX_ATTEMPTS attempts
Note = Callable[[str], None]
_SAID: set[str] = set()  # lines said without a reporter (once per process)


def baseline_cache(studies_dir: Path) -> Path:
    return studies_dir / BASELINES


def baseline_key(space: Space) -> str | None:
    """What decides a baseline run's result besides its seed, as a digest: the backend and its trainer version
    (:meth:`~hpo.backends.Confirmation.trainer_version`), the trainer command and config, the fixed and baseline
    overrides, the held-out split, the seed keys, the objective, the diagnosis and (when confirmation runs use
    them) the early-stopping rules. None when the backend cannot say its version: never reused."""
    if not space.study.baseline or not space.study.confirm.reuse_baseline:
        return None
    confirmation = backend_of(space).confirmation
    version = None if confirmation is None else confirmation.trainer_version(space)
    if version is None:
        return None
    raw = space.raw if isinstance(space.raw, dict) else {}
    what = {"backend": space.trial.backend, "version": version, "command": list(space.trial.command or ()),
            "config": space.config, "overrides": space.trainer_overrides({}), "baseline": space.study.baseline,
            "heldout": heldout_overrides(space), "seed_keys": list(seed_keys(space)), "objective": raw.get("objective"),
            "diagnosis": raw.get("diagnosis"),
            "early_stopping": raw.get("early_stopping") if space.study.confirm.early_stopping else None}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _say(note: Note | None, line: str) -> None:
    if note is not None:
        note(line)
    elif line not in _SAID:
        _SAID.add(line)
        print(line, file=sys.stderr)


def value_of_metrics(space: Space, data: bytes) -> float | None:
    """The objective's value of a run recomputed from its metrics file's bytes (each step's first line, its finite
    evaluations in step order, the objective's aggregate); None when it has none."""
    evals: dict[int, list[float]] = {}
    for raw in io.BytesIO(data):  # one line at a time
        try:
            rec = json.loads(raw.decode("utf-8", "replace"))
        except (ValueError, RecursionError):
            continue
        step, got = (rec.get("step"), rec.get("data")) if isinstance(rec, dict) else (None, None)
        if isinstance(step, bool) or not isinstance(step, int) or not isinstance(got, dict) or step in evals:
            continue
        scored = space.objective.evaluate(got)
        if scored is not None and all(math.isfinite(v) for v in scored[0]):
            evals[step] = [float(v) for v in scored[0]]
    history = [evals[k] for k in sorted(evals)]
    return space.objective.aggregated(history)[0] if history else None


def _kept_problem(cache: Path, rec: dict[str, Any], seed: int, space: Space | None,
                  storage: BaseStorage | None) -> str:
    """Why a checked record may not be reused ("" when it may): its metrics file is not its trial's own metrics
    file, intact (:func:`hpo.record.kept_metrics`), giving its value; its study's stored trial says otherwise."""
    inside, why = metrics_inside(cache.parent, rec)
    if why:
        return why
    if space is not None:  # the backend's metrics file of one of the trial's attempts, nothing else the trial wrote
        backend, base = backend_of(space), Path("trial")
        if not any(backend.metrics_path(base, k) == base.joinpath(*inside) for k in range(MAX_ATTEMPTS)):
            return f"{'/'.join(inside)[:200]} is not a metrics file of {rec['study']}#{rec['trial']}"
    data, why = kept_metrics(cache.parent, rec, inside)
    if data is None:
        return why
    if space is not None:
        value = value_of_metrics(space, data)
        if value is None or not math.isclose(value, rec["value"], rel_tol=1e-9, abs_tol=1e-12):
            shown = "none" if value is None else f"{value:.6g}"
            return f"its value {rec['value']:.6g} is not its metrics file's ({shown})"
    return stored_run_problem(storage, rec, seed)


def cached_baseline(cache: Path, key: str | None, seed: int, space: Space | None = None, note: Note | None = None,
                    storage: BaseStorage | None = None) -> dict[str, Any] | None:
    """The kept run of ``key`` on ``seed``, or None: none is kept, or the kept file is not one the store wrote
    (:mod:`hpo.record._kept`: no symlink followed, size-capped, every field checked), its metrics file is not its
    trial's own, read from ``<studies>/<study>/trials/<n>/`` without following a link (gone, changed since, a link,
    elsewhere on the host), (``space`` given) its value is not what that file gives, or (``storage``: the one of the
    study being confirmed, where the named study is too) its trial is no finished baseline run on that seed; each of
    those is one line (``note``) and the run is made again."""
    if key is None:
        return None
    where = f"{cache.name}/{key}/{int(seed)}.json"
    try:
        raw = read_kept(cache.parent, (cache.name, key), f"{int(seed)}.json")
    except OSError as err:  # KeptRefused included
        _say(note, f"kept baseline run {where} not reused: {err}; it runs again")
        return None
    if raw is None:
        return None
    rec, why = checked_record(raw, key, int(seed))
    if rec is None:
        _say(note, f"kept baseline run {where} not reused: {why}; it runs again")
        return None
    source = f"{rec['study']}#{rec['trial']}"
    why = _kept_problem(cache, rec, int(seed), space, storage)
    if why:
        _say(note, f"kept baseline run {where} (from {source}) not reused: {why}; it runs again")
        return None
    return {"value": rec["value"], "intermediate_values": rec["intermediate_values"],
            "user_attrs": {**rec["user_attrs"], "baseline_reused": source, "confirm_of": "baseline",
                           "confirm_seed": int(seed)}}


def remember_baseline(cache: Path, space: Space, study_name: str, run: FrozenTrial) -> bool:
    """Keep a finished baseline run for later studies on this host (COMPLETE, finite, not failed, not itself
    reused), with the name (relative to its trial directory) and sha256 of the metrics file its value came from,
    read as :func:`cached_baseline` reads it; written whole or not at all (:func:`hpo.record._kept.write_kept`: no
    symlink followed, no temporary file left). Returns whether it was kept; OSError (KeptRefused included: a link
    where its metrics file was) when the store, the file or the disk refuses."""
    key = baseline_key(space)
    if (key is None or run.state != TrialState.COMPLETE or run.values is None or not math.isfinite(run.values[0])
            or "fail_reason" in run.user_attrs or run.user_attrs.get("baseline_reused")):
        return False
    seed = run.system_attrs.get(ATTR_CONFIRM_SEED)
    trial_dir = run.user_attrs.get("trial_dir")
    if not isinstance(seed, int) or isinstance(seed, bool) or not isinstance(trial_dir, str):
        return False
    metrics = backend_of(space).metrics_path(Path(trial_dir), len(retry_history(run)))
    if not metrics.is_relative_to(trial_dir) or metrics == Path(trial_dir):
        return False  # a backend whose metrics file is not in the trial's directory: not kept
    inside = metrics.relative_to(trial_dir).parts
    data = read_study_file(cache.parent, (*trial_parts(study_name, run.number), *inside[:-1]), inside[-1])
    if data is None:
        return False
    rec = {"value": run.values[0], "intermediate_values": {str(k): v for k, v in run.intermediate_values.items()},
           "user_attrs": {k: run.user_attrs[k] for k in KEPT_ATTRS if k in run.user_attrs},
           "study": study_name, "trial": run.number, "key": key, "seed": seed, "metrics": "/".join(inside),
           "metrics_sha256": hashlib.sha256(data).hexdigest()}
    write_kept(cache.parent, (cache.name, key), f"{seed}.json", json.loads(json.dumps(rec, default=str)))
    return True
