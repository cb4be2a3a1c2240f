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
import json
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from hpo.backends import backend_of
from hpo.experiment._space import Space
from hpo.record import ATTR_BASELINE, ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED, is_confirm, retry_history, study_cost
from hpo.record._kept import file_digest, read_kept, write_kept

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
    """The ``k`` best search trials with distinct parameters (COMPLETE, finite, feasible), best first."""
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if not is_confirm(t) and t.values is not None and all(math.isfinite(v) for v in t.values)
            and all(v <= 0 for v in t.constraints.values())]
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
        kept = cached_baseline(cache, key, seed, space, note) if t is None and cache is not None and key else None
        if kept is not None:
            study.add_trial(optuna.create_trial(
                state=TrialState.COMPLETE, value=kept["value"], params={}, distributions={},
                intermediate_values=kept["intermediate_values"], user_attrs=kept["user_attrs"],
                system_attrs={ATTR_CONFIRM_OF: BASELINE_OF, ATTR_CONFIRM_SEED: seed, ATTR_BASELINE: True}))
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


# ----------------------------------------------------------------------------- the baseline's runs, kept per host
BASELINES = ".baselines"  # under the studies directory: <key>/<seed>.json (never a study name: those start alnum)
_KEPT_ATTRS = ("last_step", "total_steps", "test_value", "test_metric", "stop_reason", "diagnosis")


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


Note = Callable[[str], None]
_SAID: set[str] = set()  # lines said without a reporter (once per process)


def _say(note: Note | None, line: str) -> None:
    if note is not None:
        note(line)
    elif line not in _SAID:
        _SAID.add(line)
        print(line, file=sys.stderr)


def _number(x: Any) -> float | None:
    """A finite float from a JSON number (never a boolean, never one too large for a float)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        v = float(x)
    except OverflowError:
        return None
    return v if math.isfinite(v) else None


def _checked_kept(raw: Any, key: str, seed: int) -> tuple[dict[str, Any] | None, str]:
    """A kept record's fields, each type- and range-checked, or None and why not."""
    if not isinstance(raw, dict):
        return None, f"a JSON {type(raw).__name__}, not a kept run"
    value, trial, study = _number(raw.get("value")), raw.get("trial"), raw.get("study")
    if value is None:
        return None, f"value {str(raw.get('value'))[:40]!r} is not a finite number"
    if isinstance(trial, bool) or not isinstance(trial, int) or not 0 <= trial < 2**31:
        return None, f"trial {str(trial)[:40]!r} is not a trial number"
    if not isinstance(study, str) or not 0 < len(study) <= 200:
        return None, "no study name"
    if raw.get("key") != key or raw.get("seed") != seed:
        return None, "kept for another experiment or seed"
    inter_raw = raw.get("intermediate_values")
    if not isinstance(inter_raw, dict) or len(inter_raw) > 100_000:
        return None, "intermediate values are not a mapping of steps"
    inter: dict[int, float] = {}
    for k, v in inter_raw.items():
        x = _number(v)
        if not (isinstance(k, str) and k.isdigit() and len(k) < 10) or x is None:
            return None, f"intermediate value {str(k)[:20]!r}: {str(v)[:20]!r} is not a step and a finite number"
        inter[int(k)] = x
    metrics, digest = raw.get("metrics"), raw.get("metrics_sha256")
    if not isinstance(metrics, str) or not isinstance(digest, str) or len(digest) != 64:
        return None, "no digest of the metrics file it came from (kept by an older verl-hpo)"
    attrs = {k: v for k, v in dict(raw.get("user_attrs") or {}).items()
             if k in _KEPT_ATTRS and isinstance(v, (int, float, str)) and not isinstance(v, bool)
             and (not isinstance(v, float) or math.isfinite(v)) and (not isinstance(v, str) or len(v) <= 4000)} \
        if isinstance(raw.get("user_attrs"), dict) else {}
    return {"value": value, "intermediate_values": inter, "user_attrs": attrs, "study": study, "trial": trial,
            "metrics": metrics, "metrics_sha256": digest}, ""


def value_from_metrics(space: Space, path: Path) -> float | None:
    """The objective's value of a run recomputed from its metrics file (each step's first line, its finite
    evaluations in step order, the objective's aggregate); None when it has none."""
    from hpo.analysis._files import FileRefused, read_bounded

    try:
        text = read_bounded(path, str(path), 256 << 20).decode("utf-8", "replace")
    except (OSError, FileRefused):
        return None
    evals: dict[int, list[float]] = {}
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        step, data = (rec.get("step"), rec.get("data")) if isinstance(rec, dict) else (None, None)
        if isinstance(step, bool) or not isinstance(step, int) or not isinstance(data, dict) or step in evals:
            continue
        got = space.objective.evaluate(data)
        if got is not None and all(math.isfinite(v) for v in got[0]):
            evals[step] = [float(v) for v in got[0]]
    history = [evals[k] for k in sorted(evals)]
    return space.objective.aggregated(history)[0] if history else None


def cached_baseline(cache: Path, key: str | None, seed: int, space: Space | None = None,
                    note: Note | None = None) -> dict[str, Any] | None:
    """The kept run of ``key`` on ``seed``, or None: none is kept, or the kept file is not one the store wrote
    (:mod:`hpo.record._kept`: no symlink followed, size-capped, every field checked), its metrics file is gone or
    changed since, or (``space`` given) its value is not what that file gives; each of those is one line
    (``note``) and the run is made again."""
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
    rec, why = _checked_kept(raw, key, int(seed))
    if rec is None:
        _say(note, f"kept baseline run {where} not reused: {why}; it runs again")
        return None
    metrics = Path(rec["metrics"])
    digest = file_digest(metrics)
    why = ("its metrics file " + str(metrics) + (" is gone" if digest is None else " changed since it was kept")
           if digest != rec["metrics_sha256"] else "")
    if not why and space is not None:
        value = value_from_metrics(space, metrics)
        if value is None or not math.isclose(value, rec["value"], rel_tol=1e-9, abs_tol=1e-12):
            shown = "none" if value is None else f"{value:.6g}"
            why = f"its value {rec['value']:.6g} is not its metrics file's ({shown})"
    if why:
        _say(note, f"kept baseline run {where} (from {rec['study']}#{rec['trial']}) not reused: {why}; it runs "
                   "again")
        return None
    source = f"{rec['study']}#{rec['trial']}"
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
    reused), with the path and sha256 of the metrics file its value came from; written whole or not at all
    (:func:`hpo.record._kept.write_kept`: no symlink followed, no temporary file left). Returns whether it was kept;
    OSError (KeptRefused included) when the store or the disk refuses."""
    key = baseline_key(space)
    if (key is None or run.state != TrialState.COMPLETE or run.values is None or not math.isfinite(run.values[0])
            or "fail_reason" in run.user_attrs or run.user_attrs.get("baseline_reused")):
        return False
    seed = run.system_attrs.get(ATTR_CONFIRM_SEED)
    trial_dir = run.user_attrs.get("trial_dir")
    if not isinstance(seed, int) or isinstance(seed, bool) or not isinstance(trial_dir, str):
        return False
    metrics = backend_of(space).metrics_path(Path(trial_dir), len(retry_history(run))).resolve()
    digest = file_digest(metrics)
    if digest is None:
        return False
    rec = {"value": run.values[0], "intermediate_values": {str(k): v for k, v in run.intermediate_values.items()},
           "user_attrs": {k: run.user_attrs[k] for k in _KEPT_ATTRS if k in run.user_attrs},
           "study": study_name, "trial": run.number, "key": key, "seed": seed, "metrics": str(metrics),
           "metrics_sha256": digest}
    write_kept(cache.parent, (cache.name, key), f"{seed}.json", json.loads(json.dumps(rec, default=str)))
    return True


CONTROL_OF = -2  # hpo:confirm_of of a throughput study's control: the user's config again, on the first seed


def queue_speed_check(study: optuna.Study, space: Space, top_k: int, repeats: int) -> list[tuple[int, int]]:
    """A throughput study's confirmation (:mod:`hpo.reporting._speed` reads it): for each of ``repeats`` seeds a run
    of the user's config (``study.baseline``) and one of each of the ``top_k`` fastest distinct search trials, in that
    order on even seeds and the reverse on odd ones (the driver runs them one at a time, so they alternate on the
    host and a linear drift of its speed cancels out), and right after the first seed's run of the user's config a
    control: the same config on the same seed again, which tells the same-math check how far two runs of one config
    and seed differ on this trainer (0 where its rollout is reproducible). What is not queued yet is queued, never
    from the kept baselines (a timing is its run's own). ValueError when the search has no finite trial."""
    picks = top_trials(study, top_k)
    if not picks:
        raise ValueError(f"study {study.study_name!r} has no completed throughput trial with a finite value yet")
    seeds = confirm_seeds(space, repeats)
    queued = queue_runs(study, [(None, seeds[0])])
    if (CONTROL_OF, seeds[0]) not in present_runs(study):
        study.add_trial(optuna.create_trial(
            state=TrialState.WAITING, params={}, distributions={},
            system_attrs={ATTR_CONFIRM_OF: CONTROL_OF, ATTR_CONFIRM_SEED: seeds[0], ATTR_BASELINE: True}))
        queued.append((CONTROL_OF, seeds[0]))
    runs: list[tuple[FrozenTrial | None, int]] = []
    for i, seed in enumerate(seeds):
        one = [None, *picks]  # the user's config first, then each pick; the next seed the other way round (ABBA):
        runs += [(t, seed) for t in (one if i % 2 == 0 else one[::-1])]  # a drift of the host's speed cancels out
    return queued + queue_runs(study, runs)


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
    return statistics.fmean(xs) if xs else math.nan


def _std(xs: tuple[float, ...]) -> float:
    """The sample standard deviation; 0 for fewer than two values."""
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


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
