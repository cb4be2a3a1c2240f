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
(``verl._compose.SEED_KEYS``: the train sampler ``data.seed``, vLLM's ``actor_rollout_ref.rollout.seed``, the
actor's and critic's mini-batch shuffling ``*.data_loader_seed``); ``study.confirm.seed_key`` names one key instead.
Confirmation runs go to the full budget (the early-stopping rules are off unless ``study.confirm.early_stopping``;
never pruned) and evaluate the held-out test split once at their last step (:func:`heldout_overrides`); their user
attr ``test_value`` is its value of the objective's metric. ``study.baseline`` (the setting a user would run without
a search) is confirmed on the same seeds, as runs tagged ``hpo:baseline`` (``hpo:confirm_of`` = -1, no parameters).
Re-running ``confirm`` queues only what is missing (a trial already has a
queued, running or finished run with that seed), so an interrupted confirmation resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from hpo.analysis import BASELINES_DIR
from hpo.backends import backend_of
from hpo.experiment._space import Space
from hpo.record import (
    ATTR_BASELINE,
    ATTR_CONFIRM_OF,
    ATTR_CONFIRM_SEED,
    ATTR_RESULT,
    ATTR_SPEED_BLOCK,
    KEPT_ATTRS,
    checked_record,
    is_baseline,
    is_confirm,
    is_proxy,
    kept_metrics,
    metrics_inside,
    read_kept,
    read_study_file,
    retry_history,
    stored_run_problem,
    study_cost,
    trial_parts,
    write_kept,
)

BASELINE_OF = -1  # hpo:confirm_of of a baseline run (no trial of the search)
MAX_TUNED_SEEDS = 100_000  # a tuned integer seed range larger than this is treated as "any seed" (refused)




def heldout_overrides(space: Space) -> dict[str, Any]:
    """What a confirmation run adds to be measured on the held-out test split (:mod:`hpo.experiment._heldout`):
    verl_core ``data.test_files`` (``study.confirm.test_files``, else the built-in task's test split when
    ``data.val_files`` is ``builtin:<task>``); verl: ``data.val_files`` replaced by ``study.confirm.test_files``
    (``Backend.heldout_overrides``)."""
    return backend_of(space).heldout_overrides(space)


def heldout_note(space: Space) -> str:
    """One line on where confirmation runs measure the held-out value ("" when they do not)."""
    return backend_of(space).heldout_note(space)


def heldout_metric_of(space: Space) -> str | None:
    """The metric a confirmation run's held-out value is read from: ``study.confirm.test_metric``, else verl_core's
    ``test/...`` twin of the objective's metric, or verl's objective metric itself when ``data.val_files`` is swapped
    for the test file; None without a held-out split."""
    return backend_of(space).heldout_metric(space)


def confirm_overrides(space: Space, seed: int, baseline: bool = False) -> dict[str, Any]:
    """Everything a confirmation run sets beyond the tuned values: the baseline's overrides (baseline runs), every
    seed key, the held-out split."""
    held = heldout_overrides(space) if space.study.kind != "throughput" else {}  # a speed run measures no data
    return {**(space.study.baseline if baseline else {}), **seed_overrides(space, seed), **held}


def seed_keys(space: Space) -> tuple[str, ...]:
    """The trainer keys of a run's seeds: ``study.confirm.seed_key``, else ``trainer.seed`` (verl_core) or every
    seed of a verl run (each checked to exist in verl 0.9.1's composed config): ``Backend.seed_keys``."""
    return backend_of(space).seed_keys(space)


def seed_key(space: Space) -> str:
    """The first of :func:`seed_keys` (the one shown with a confirmation run)."""
    return seed_keys(space)[0]


def seed_overrides(space: Space, seed: int) -> dict[str, int]:
    """What a confirmation run with ``seed`` sets: every seed key to it."""
    return {key: int(seed) for key in seed_keys(space)}


def tuning_seeds(space: Space) -> set[int]:
    """Every seed a tuning trial of ``space`` ran (or could have run) with, under any of its seed keys."""
    seeds: set[int] = set()
    for key in seed_keys(space):
        seeds |= _tuning_seeds(space, key)
    return seeds


def _tuning_seeds(space: Space, key: str) -> set[int]:
    seeds: set[int] = set()
    fixed = next((k for k in space.overrides if k.lstrip("+") == key), None)
    if fixed is not None:
        if space.overrides[fixed] is not None:
            seeds.add(int(space.overrides[fixed]))
    else:
        default = backend_of(space).default_seed(space, key)
        if default is not None:
            seeds.add(default)
    for p in space.params:
        if p.key.lstrip("+") != key:
            continue
        if p.type == "categorical":
            seeds.update(int(c) for c in p.choices or () if isinstance(c, (int, float)))
        elif p.low is not None and p.high is not None:
            if p.high - p.low > MAX_TUNED_SEEDS:
                raise ValueError(f"params.{p.name}: the seed {key} is tuned over {p.low}..{p.high}; no fresh seed "
                                 "is left for confirmation")
            seeds.update(range(int(p.low), int(p.high) + 1))
    return seeds


def confirm_seeds(space: Space, n: int) -> list[int]:
    """The first ``n`` confirmation seeds: ``seed_base`` upwards, skipping tuning seeds."""
    used, s = tuning_seeds(space), space.study.confirm.seed_base
    out: list[int] = []
    while len(out) < n:
        if s not in used:
            out.append(s)
        s += 1
    return out


def _sign(study: optuna.Study) -> float:
    return 1.0 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else -1.0


def top_trials(study: optuna.Study, k: int) -> list[FrozenTrial]:
    """The ``k`` best search trials with distinct parameters (COMPLETE, finite, feasible), best first; a proxy
    search's are its target runs (``study.fidelity.proxy``: a proxy value is not a target value)."""
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if not is_confirm(t) and not is_proxy(t) and t.values is not None
            and all(math.isfinite(v) for v in t.values) and all(v <= 0 for v in t.constraints.values())]
    done.sort(key=lambda t: (-_sign(study) * float(t.values[0]), t.number))
    out: list[FrozenTrial] = []
    seen: list[dict[str, Any]] = []
    for t in done:
        if t.params not in seen:
            seen.append(t.params)
            out.append(t)
        if len(out) == k:
            break
    return out


def present_runs(study: optuna.Study) -> set[tuple[Any, Any]]:
    """(confirmed trial, seed) of every confirmation run queued, running or finished (not failed-and-retried)."""
    return {(t.system_attrs[ATTR_CONFIRM_OF], t.system_attrs.get(ATTR_CONFIRM_SEED))
            for t in study.get_trials(deepcopy=False) if is_confirm(t)
            and t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)}


def queue_runs(study: optuna.Study, runs: list[tuple[FrozenTrial | None, int]],
               space: Space | None = None, cache: Path | None = None, note: Note | None = None
               ) -> list[tuple[int, int]]:
    """Queue a run per (trial, seed) not present yet (None: the baseline); returns what was queued. A baseline run
    this host already ran for the same experiment, seed and trainer version (``cache``: :func:`baseline_cache`) is
    added finished, from there, instead of queued (user attr ``baseline_reused``)."""
    present = present_runs(study)
    queued = []
    key = baseline_key(space) if space is not None and cache is not None else None
    for t, seed in runs:
        of = BASELINE_OF if t is None else t.number
        if (of, seed) in present:
            continue
        kept = cached_baseline(cache, key, seed, space, note, study._storage) \
            if t is None and cache is not None and key else None
        if kept is not None:
            study.add_trial(baseline_run(seed, kept["intermediate_values"], kept["user_attrs"], kept["value"]))
        elif t is None:
            study.add_trial(optuna.create_trial(
                state=TrialState.WAITING, params={}, distributions={},
                system_attrs={ATTR_CONFIRM_OF: BASELINE_OF, ATTR_CONFIRM_SEED: seed, ATTR_BASELINE: True}))
        else:
            study.add_trial(optuna.create_trial(
                state=TrialState.WAITING, params=t.params, distributions=t.distributions,
                system_attrs={ATTR_CONFIRM_OF: t.number, ATTR_CONFIRM_SEED: seed}))
        present.add((of, seed))
        queued.append((of, seed))
    return queued


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
    (:meth:`~hpo.backends._base.Backend.trainer_version`), the trainer command and config, the fixed and baseline
    overrides, the held-out split, the seed keys, the objective, the diagnosis and (when confirmation runs use
    them) the early-stopping rules. None when the backend cannot say its version: never reused."""
    if not space.study.baseline or not space.study.confirm.reuse_baseline:
        return None
    version = backend_of(space).trainer_version(space)
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


def confirm_reserve(space: Space, cache: Path | None = None) -> int:
    """The least full runs the confirmation needs (what a ``study.budget`` keeps for it): ``top_k`` candidates and
    the baseline on ``min_seeds`` seeds when racing (``seeds`` when not), less the baseline runs this host keeps."""
    conf = space.study.confirm
    n = conf.min_seeds if conf.race else conf.seeds
    base = 0
    if space.study.baseline:
        key = baseline_key(space) if cache is not None else None
        base = sum(1 for seed in confirm_seeds(space, n)
                   if cache is None or cached_baseline(cache, key, seed, space, note=lambda _: None) is None)
    return conf.top_k * n + base


def search_over_budget(trials: list[FrozenTrial], space: Space, cache: Path | None,
                       starting: int = 0) -> tuple[float, int] | None:
    """``study.budget`` for the search: (what the study spent, in full runs, and what it keeps for the confirmation,
    :func:`confirm_reserve`) once the search has no room left, None while it has (or without a budget, or before a
    full run's length is known).

    Room is what the budget leaves after the study's steps (a running trial's up to its last evaluation) and the
    confirmation's least, less one evaluation interval (the largest gap between two evaluations a search trial
    logged, from step 0) for every running search trial and each of ``starting`` trials about to start: a trial is
    only checked at its evaluations, so that interval is what it may still run before its next check. The search
    stops asking for trials, and stops a running one (``stop_reason=budget``), once there is none: it never spends
    past ``budget`` less the reserve."""
    budget = space.study.budget
    if budget is None:
        return None
    cost = study_cost(trials)
    if not cost.full:
        return None
    search = [t for t in trials if not is_confirm(t)]
    gap = 0
    for t in search:
        steps = [0, *sorted(t.intermediate_values)]
        gap = max([gap, *(b - a for a, b in zip(steps, steps[1:]))])
    running = sum(1 for t in search if t.state == TrialState.RUNNING)
    reserve = confirm_reserve(space, cache)
    spent = cost.search_steps + cost.confirm_steps
    if spent + reserve * cost.full + (running + starting) * (gap or cost.full) <= budget * cost.full:
        return None
    return spent / cost.full, reserve


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


CONTROL_OF = -2  # hpo:confirm_of of a throughput study's control: the user's config again, on the first seed


def queue_speed_check(study: optuna.Study, space: Space, top_k: int, repeats: int) -> list[tuple[int, int]]:
    """A throughput study's confirmation (:mod:`hpo.reporting._speed` reads it): for each of ``repeats`` seeds a run
    of the user's config (``study.baseline``) and one of each of the ``top_k`` fastest distinct search trials, in that
    order on even seeds and the reverse on odd ones (the driver runs them one at a time, so they alternate on the
    host and a linear drift of its speed cancels out), and right after the first seed's run of the user's config a
    control: the same config on the same seed again, which tells the same-math check how far two runs of one config
    and seed differ on this trainer (0 where its rollout is reproducible). Never from the kept baselines (a timing
    is its run's own). ValueError when the search has no finite trial.

    The runs of one seed are a block (:data:`~hpo.record.ATTR_SPEED_BLOCK`: their order and the block's generation):
    what is not queued yet is queued, and a block that lost a run for good (it failed and was not retried) while
    others of its runs stand is queued again whole, as a new generation (:func:`speed_block_retry`)."""
    picks = top_trials(study, top_k)
    if not picks:
        raise ValueError(f"study {study.study_name!r} has no completed throughput trial with a finite value yet")
    trials = study.get_trials(deepcopy=False)
    live = [t for t in trials if is_confirm(t) and t.state in (TrialState.COMPLETE, TrialState.PRUNED,
                                                               TrialState.RUNNING, TrialState.WAITING)]
    queued: list[tuple[int, int]] = []
    control = any(t.system_attrs.get(ATTR_CONFIRM_OF) == CONTROL_OF for t in live)
    for i, seed in enumerate(confirm_seeds(space, repeats)):
        one = [None, *picks]  # the user's config first, then each pick; the next seed the other way round (ABBA):
        block = one if i % 2 == 0 else one[::-1]  # a drift of the host's speed cancels out
        order = [BASELINE_OF if t is None else t.number for t in block]
        newest: dict[int, int] = {}  # member -> the newest generation of its runs standing on this seed
        for run in live:
            member, made = run.system_attrs.get(ATTR_CONFIRM_OF), _generation(run)
            if run.system_attrs.get(ATTR_CONFIRM_SEED) == seed and member in order and made is not None:
                newest[member] = max(newest.get(member, made), made)
        whole = set(newest) == set(order) and len(set(newest.values())) == 1
        gen = len(trials) if newest else 0  # none queued yet: generation 0; a broken block: all of it again
        for pick, of in zip(block, order):
            if not whole:
                _add_speed_run(study, pick, seed, {"order": order, "generation": gen})
                queued.append((of, seed))
            if i == 0 and pick is None and not control:  # right after the first seed's run of the user's config
                study.add_trial(optuna.create_trial(
                    state=TrialState.WAITING, params={}, distributions={},
                    system_attrs={ATTR_CONFIRM_OF: CONTROL_OF, ATTR_CONFIRM_SEED: seed, ATTR_BASELINE: True}))
                queued.append((CONTROL_OF, seed))
                control = True
    return queued


def _generation(t: FrozenTrial) -> int | None:
    """The generation of a throughput re-measurement's block (-1: a run queued before blocks were recorded); None
    for any other run (the control, a learning study's)."""
    block = t.system_attrs.get(ATTR_SPEED_BLOCK)
    if t.system_attrs.get(ATTR_CONFIRM_OF) == CONTROL_OF or not is_confirm(t):
        return None
    gen = block.get("generation") if isinstance(block, dict) else -1
    return gen if isinstance(gen, int) and not isinstance(gen, bool) else -1


def speed_generation(t: FrozenTrial) -> int | None:
    """A throughput re-measurement's block generation (a later one replaces an earlier one of its seed); None for
    any run that is not one (only runs that carry a block are)."""
    return _generation(t) if isinstance(t.system_attrs.get(ATTR_SPEED_BLOCK), dict) else None


def _add_speed_run(study: optuna.Study, t: FrozenTrial | None, seed: int, block: dict[str, Any],
                   system: dict[str, Any] | None = None) -> None:
    """Queue a run of the user's config (``t`` None) or of pick ``t`` on ``seed`` in ``block``; ``system``: the
    system attrs of a retry instead of a fresh run's."""
    of = BASELINE_OF if t is None else t.number
    attrs = {**(system or {ATTR_CONFIRM_OF: of, ATTR_CONFIRM_SEED: seed, **({ATTR_BASELINE: True} if t is None
                                                                              else {})}), ATTR_SPEED_BLOCK: block}
    study.add_trial(optuna.create_trial(state=TrialState.WAITING, params={} if t is None else t.params,
                                        distributions={} if t is None else t.distributions, system_attrs=attrs))


def speed_block_retry(study: optuna.Study, killed: FrozenTrial, retry: dict[str, Any]) -> bool:
    """Queue the retry (system attrs ``retry``) of a throughput re-measurement that was killed (its driver killed or
    interrupted, its Ray node lost) as part of its seed's block made again; False, queueing nothing, for any other
    run (a learning study's, the control, a run queued before blocks were recorded): it is retried on its own.

    A pick's speed-up is the ratio of its run to the user's config's on the same seed, and it cancels a drift of the
    host's speed only because the runs of one seed run back to back. A retry is queued after everything already
    queued, and a killed driver may be resumed hours later, so neither "after the whole sequence" (the old way: paired
    with a run made minutes before) nor "next" can pair a retry with a run made before the kill. The seed's block is
    therefore discarded and re-made: its runs (the user's config and each pick, in the block's ABBA order), the retry
    in the killed run's place, queued together after the rest as a new generation of the block. The old block's
    runs still waiting are then surplus (:func:`hpo.study._compare.twin_of`: never run) and the report compares the
    newest finished run of each config and seed, so nothing made before the kill is paired with the new runs. A kill
    costs the block's other runs once more."""
    block = killed.system_attrs.get(ATTR_SPEED_BLOCK)
    order = block.get("order") if isinstance(block, dict) else None
    of, seed = killed.system_attrs.get(ATTR_CONFIRM_OF), killed.system_attrs.get(ATTR_CONFIRM_SEED)
    if (not isinstance(order, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in order)
            or of not in order or not isinstance(seed, int) or isinstance(seed, bool)):
        return False
    trials = study.get_trials(deepcopy=False)
    picks = {t.number: t for t in trials if t.number in order}
    if any(n != BASELINE_OF and n not in picks for n in order):
        return False
    new = {"order": order, "generation": len(trials)}  # above every generation before it
    for n in order:
        _add_speed_run(study, None if n == BASELINE_OF else picks[n], seed, new, retry if n == of else None)
    return True


def queue_confirmations(study: optuna.Study, space: Space, top_k: int, n_seeds: int,
                        cache: Path | None = None, note: Note | None = None) -> list[tuple[int, int]]:
    """Queue the missing (trial, seed) runs of the top ``top_k`` trials (and the baseline's, reused from ``cache``
    where this host has them); returns what was queued. (A racing confirmation queues round by round instead:
    :func:`hpo.study._compare.start_race`.)"""
    seeds = confirm_seeds(space, n_seeds)
    runs: list[tuple[FrozenTrial | None, int]] = [(t, seed) for t in top_trials(study, top_k) for seed in seeds]
    if space.study.baseline:  # the same seeds for the setting a user would have run anyway
        runs += [(None, seed) for seed in seeds]
    return queue_runs(study, runs, space, cache, note)


def pending(study: optuna.Study) -> int:
    """Confirmation runs queued or running."""
    return sum(1 for t in study.get_trials(deepcopy=False)
               if is_confirm(t) and t.state in (TrialState.WAITING, TrialState.RUNNING))


@dataclass(frozen=True)
class Confirmed:
    """A search trial and its confirmation runs' values (COMPLETE, finite, first objective)."""

    trial: FrozenTrial
    values: tuple[float, ...]
    seeds: tuple[int, ...]
    runs: tuple[FrozenTrial, ...] = ()  # the confirmation runs, by seed
    test_values: tuple[float, ...] = ()  # their held-out test values (user attr test_value), where measured

    @property
    def test_mean(self) -> float:
        return _mean(self.test_values)

    @property
    def test_std(self) -> float:
        return _std(self.test_values)

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return _mean(self.values)

    @property
    def std(self) -> float:
        return _std(self.values)


def _mean(xs: tuple[float, ...]) -> float:
    """The mean; a trial's values near the float limit (1e308 logged as a reward) give inf, never OverflowError."""
    if not xs:
        return math.nan
    try:
        return statistics.fmean(xs)
    except OverflowError:
        return math.fsum(x / len(xs) for x in xs)


def _std(xs: tuple[float, ...]) -> float:
    """The sample standard deviation; 0 for fewer than two values; inf where the values overflow it."""
    if len(xs) < 2:
        return 0.0
    try:
        return statistics.stdev(xs)
    except (OverflowError, AttributeError):  # stdev of values near the float limit (AttributeError: CPython's)
        return math.inf


def confirmed(study: optuna.Study) -> list[Confirmed]:
    """The confirmed search trials, best confirmed mean first (ties: the tuning value, then the number). A
    confirmation run that failed completed with the worst value and drags its mean there: a setting that
    crashes under another seed is not confirmed."""
    by_trial = _runs_by_trial(study)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    out = [_confirmed(trials[n], runs) for n, runs in by_trial.items() if n in trials]
    sign = _sign(study)
    tuned = [(-sign * float(c.trial.values[0]) if c.trial.values else 0.0) for c in out]
    order = sorted(range(len(out)), key=lambda i: (-sign * out[i].mean, tuned[i], out[i].trial.number))
    return [out[i] for i in order]


def _runs_by_trial(study: optuna.Study) -> dict[int, list[FrozenTrial]]:
    """COMPLETE confirmation runs by the trial they confirm (baseline runs under :data:`BASELINE_OF`), by seed. A
    failed run completes with the worst value: it counts."""
    by_trial: dict[int, list[FrozenTrial]] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if is_confirm(t) and t.values is not None and not (
                t.system_attrs.get("pbt:intermediate") and not t.user_attrs.get("stop_reason")
                and "fail_reason" not in t.user_attrs):  # a pbt schedule's chain: its last segment's value
            by_trial.setdefault(int(t.system_attrs[ATTR_CONFIRM_OF]), []).append(t)
    for runs in by_trial.values():
        runs.sort(key=lambda r: (int(r.system_attrs.get(ATTR_CONFIRM_SEED, -1)), r.number))
    return by_trial


def _confirmed(trial: FrozenTrial, runs: list[FrozenTrial]) -> Confirmed:
    tests = tuple(float(r.user_attrs["test_value"]) for r in runs
                  if isinstance(r.user_attrs.get("test_value"), (int, float)))
    return Confirmed(trial, tuple(float(r.values[0]) for r in runs),
                     tuple(int(r.system_attrs.get(ATTR_CONFIRM_SEED, -1)) for r in runs), tuple(runs), tests)


def baseline_confirmed(study: optuna.Study) -> Confirmed | None:
    """The baseline's confirmation runs (``study.baseline``), or None before any finished; its ``trial`` is its
    first run."""
    runs = _runs_by_trial(study).get(BASELINE_OF)
    return _confirmed(runs[0], runs) if runs else None
